"""Model of PyTorch's CUDA caching allocator: allocated -> reserved.

Facts from ``c10/cuda/CUDACachingAllocator.cpp`` (see shared REFERENCE.md): every block is
rounded up to a multiple of 512 bytes; requests of at most 1 MiB use the small pool (2 MiB
segments); requests up to 10 MiB get a 20 MiB segment; larger ones a segment rounded up to
2 MiB.
"""

from __future__ import annotations

__all__ = [
    "K_LARGE_BUFFER",
    "K_MIN_BLOCK_SIZE",
    "K_MIN_LARGE_ALLOC",
    "K_ROUND_LARGE",
    "K_SMALL_BUFFER",
    "K_SMALL_SIZE",
    "round_size",
    "segment_size",
]

K_MIN_BLOCK_SIZE = 512
K_SMALL_SIZE = 1 << 20  # requests <= 1 MiB go to the small pool
K_SMALL_BUFFER = 2 << 20  # small-pool segments are 2 MiB
K_LARGE_BUFFER = 20 << 20  # 1 MiB < request < 10 MiB: 20 MiB segment
K_MIN_LARGE_ALLOC = 10 << 20  # requests >= 10 MiB: own segment rounded to 2 MiB
K_ROUND_LARGE = 2 << 20


def round_size(nbytes: int) -> int:
    """Bytes a request of ``nbytes`` occupies as an allocated block (multiple of 512, >= 512).

    >>> round_size(1), round_size(512), round_size(513), round_size(0)
    (512, 512, 1024, 512)
    """
    if nbytes < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    return K_MIN_BLOCK_SIZE * ((nbytes + K_MIN_BLOCK_SIZE - 1) // K_MIN_BLOCK_SIZE)


def segment_size(nbytes: int) -> int:
    """Size of the new segment ``cudaMalloc`` gets for a rounded request of ``nbytes``.

    >>> segment_size(4096) == 2 << 20, segment_size(5 << 20) == 20 << 20
    (True, True)
    >>> segment_size((10 << 20) + 1) == 12 << 20
    True
    """
    if nbytes <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if nbytes < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * ((nbytes + K_ROUND_LARGE - 1) // K_ROUND_LARGE)
