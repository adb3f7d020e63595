"""A model of XLA's BFC allocator, the one JAX allocates GPU memory through.

``tsl::BFCAllocator`` (``xla/tsl/framework/bfc_allocator.cc``, read at the XLA commit jax
0.10.2 pins, 5a9e73c) is what ``jax.Device.memory_stats()`` reports on: ``bytes_in_use`` and
``peak_bytes_in_use`` count the *chunks* it hands out, not the bytes asked for. Its rules,
as modelled here:

* every request is rounded up to 256 bytes (``RoundedBytes``, ``kMinAllocationSize``);
* a request takes the smallest free chunk it fits in, the lower address first among equal
  sizes (``FindChunkPtr``: bins of doubling sizes, each sorted by size, then address);
* the chunk is split when it is at least twice the request or when 128 MiB or more would be
  left over (``max_internal_fragmentation_bytes``); otherwise the whole chunk is in use;
* a freed chunk merges with a free neighbour of the same region (``FreeAndMaybeCoalesce``);
  regions never merge (a GPU's device memory does not coalesce);
* with no free chunk large enough the allocator grows by a region (``Extend``): with JAX's
  preallocation (``XLA_PYTHON_CLIENT_PREALLOCATE``, the default) the first region is the
  whole pool; without it, the first is 2 MiB and each next one twice the last, doubled
  further until the request fits.

What it does not model: the alignment prefix of a request aligned above 256 bytes (XLA asks
for 256-byte alignment), the retry on failure, and stream-ordered frees of a buffer a running
computation still uses (it is freed when the caller frees it).

>>> pool = BfcAllocator(1024 * MiB, preallocate=True)
>>> a, b, c = pool.allocate(40 * MiB), pool.allocate(8 * MiB), pool.allocate(20 * MiB)
>>> pool.free(a)
>>> d = pool.allocate(22 * MiB)  # the 40 MiB hole, less than twice the request: taken whole
>>> pool.bytes_in_use // MiB, pool.peak_bytes_in_use // MiB
(68, 68)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from memfit._checks import require, require_bytes
from memfit.errors import ConfigError, OutOfMemory
from memfit.units import MiB

__all__ = [
    "BFC_FIRST_REGION",
    "BFC_MAX_FRAGMENTATION",
    "BFC_MIN_ALLOCATION",
    "BfcAllocator",
    "round_up",
]

#: Every request is rounded up to a multiple of this (``kMinAllocationSize``).
BFC_MIN_ALLOCATION = 256
#: The first region a growing allocator makes (``curr_region_allocation_bytes_``).
BFC_FIRST_REGION = 2 * MiB
#: A chunk is split when the rest would be at least this (``max_internal_fragmentation_bytes``).
BFC_MAX_FRAGMENTATION = 128 * MiB


def round_up(nbytes: int) -> int:
    """``nbytes`` as the allocator rounds it: a multiple of 256, at least 256.

    >>> round_up(1), round_up(256), round_up(257)
    (256, 256, 512)
    """
    return max(BFC_MIN_ALLOCATION, -(-nbytes // BFC_MIN_ALLOCATION) * BFC_MIN_ALLOCATION)


@dataclass
class _Chunk:
    address: int
    size: int
    owner: int | None = None  # the allocation's id while in use


@dataclass
class _Region:
    chunks: list[_Chunk] = field(default_factory=list)


class BfcAllocator:
    """One device's BFC allocator: allocate, free, and what ``memory_stats()`` would say.

    Args:
        limit_bytes: The most the allocator may take from the device (JAX: the fraction of
            the memory CUDA reports, ``bytes_limit``).
        preallocate: The whole limit is one region from the first request (JAX's default);
            ``False``: regions grow on demand (``XLA_PYTHON_CLIENT_PREALLOCATE=false``).

    Raises:
        ConfigError: ``limit_bytes`` is not a positive number of bytes.
    """

    def __init__(self, limit_bytes: int, *, preallocate: bool) -> None:
        limit_bytes = require_bytes(
            "limit_bytes",
            limit_bytes,
            lo=1,
            hint="pass the allocator's limit in bytes, e.g. 0.75 x the GPU's memory",
        )
        require("preallocate", preallocate, "bool")
        self.limit_bytes = limit_bytes
        self.preallocate = preallocate
        self._regions: list[_Region] = []
        self._next_region = round_up(limit_bytes if preallocate else BFC_FIRST_REGION)
        self._next_address = 0
        self._next_id = 1
        self._where: dict[int, tuple[int, int]] = {}  # id -> (region index, address)
        self.bytes_in_use = 0
        self.peak_bytes_in_use = 0
        self.pool_bytes = 0
        self.num_allocs = 0

    # --- requests ------------------------------------------------------------------------

    def allocate(self, nbytes: int) -> int:
        """Hand out a chunk for ``nbytes``; its id, for :meth:`free`.

        Raises:
            OutOfMemory: No free chunk fits and the limit leaves no room for a region.
            ConfigError: ``nbytes`` is not a whole number of bytes (``1.5``, ``-5``, ``"5"``).
        """
        need = round_up(max(require_bytes("nbytes", nbytes), 1))
        found = self._best_fit(need)
        if found is None:
            self._extend(need)
            found = self._best_fit(need)
            assert found is not None  # a fresh region of at least ``need`` bytes
        region_index, position = found
        chunks = self._regions[region_index].chunks
        chunk = chunks[position]
        if chunk.size >= 2 * need or chunk.size - need >= BFC_MAX_FRAGMENTATION:
            rest = _Chunk(chunk.address + need, chunk.size - need)
            chunk.size = need
            chunks.insert(position + 1, rest)
        ident = self._next_id
        self._next_id += 1
        chunk.owner = ident
        self._where[ident] = (region_index, chunk.address)
        self.bytes_in_use += chunk.size
        self.peak_bytes_in_use = max(self.peak_bytes_in_use, self.bytes_in_use)
        self.num_allocs += 1
        return ident

    def free(self, ident: int) -> None:
        """Give back the chunk of allocation ``ident``; it merges with free neighbours.

        Raises:
            ConfigError: ``ident`` is not an allocation in use.
        """
        if ident not in self._where:
            raise ConfigError(
                f"no allocation {ident!r} is in use",
                key_path="ident",
                hint="free each id allocate() returned once",
            )
        region_index, address = self._where.pop(ident)
        chunks = self._regions[region_index].chunks
        position = next(i for i, c in enumerate(chunks) if c.address == address)
        chunk = chunks[position]
        self.bytes_in_use -= chunk.size
        chunk.owner = None
        if position + 1 < len(chunks) and chunks[position + 1].owner is None:
            chunk.size += chunks.pop(position + 1).size
        if position > 0 and chunks[position - 1].owner is None:
            chunks[position - 1].size += chunks.pop(position).size

    # --- inside ---------------------------------------------------------------------------

    def _best_fit(self, need: int) -> tuple[int, int] | None:
        best: tuple[int, int, int, int] | None = None  # size, address, region, position
        for region_index, region in enumerate(self._regions):
            for position, chunk in enumerate(region.chunks):
                if chunk.owner is None and chunk.size >= need:
                    key = (chunk.size, chunk.address, region_index, position)
                    if best is None or key < best:
                        best = key
        return None if best is None else (best[2], best[3])

    def _extend(self, need: int) -> None:
        available = (self.limit_bytes - self.pool_bytes) // BFC_MIN_ALLOCATION
        available *= BFC_MIN_ALLOCATION
        if need > available:
            raise OutOfMemory(
                f"the BFC allocator cannot fit {need:,} bytes: {self.pool_bytes:,} of its "
                f"{self.limit_bytes:,}-byte limit are in regions and none has a free chunk "
                "that large",
                requested_bytes=need,
            )
        grown = False
        while need > self._next_region:
            self._next_region *= 2
            grown = True
        size = min(self._next_region, available)
        if not grown:
            self._next_region *= 2
        self._regions.append(_Region([_Chunk(self._next_address, size)]))
        self._next_address += size
        self.pool_bytes += size
