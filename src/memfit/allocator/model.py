"""Model of PyTorch's CUDA caching allocator: allocated -> reserved.

Facts from ``c10/cuda/CUDACachingAllocator.cpp`` (see shared REFERENCE.md): every block is
rounded up to a multiple of 512 bytes; requests of at most 1 MiB use the small pool (2 MiB
segments); requests up to 10 MiB get a 20 MiB segment; larger ones a segment rounded up to
2 MiB. Free blocks are cached per stream and chosen best-fit; a memory limit (the device's
free memory, or ``set_per_process_memory_fraction``) makes the allocator give cached segments
back before it reports out of memory.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field

from memfit.errors import ConfigError, OutOfMemory

__all__ = [
    "K_LARGE_BUFFER",
    "K_MIN_BLOCK_SIZE",
    "K_MIN_LARGE_ALLOC",
    "K_ROUND_LARGE",
    "K_SMALL_BUFFER",
    "K_SMALL_SIZE",
    "AllocatorModel",
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


# --- Replay model -------------------------------------------------------------------------------
#
# The rules below follow ``DeviceCachingAllocator`` in ``c10/cuda/CUDACachingAllocator.cpp``
# (PyTorch 2.x):
#
# * ``get_pool``: a rounded request of at most ``kSmallSize`` (1 MiB) uses the small pool.
# * ``get_free_block``: best fit among the free blocks *of the request's stream*, the one with
#   the smallest ``(size, address)`` that holds the request (the C++ set orders blocks by
#   stream, size and address and ``lower_bound`` must land on the same stream); with
#   ``max_split_size`` set, a request below it never takes a block at or above it ("do not
#   return an oversized block for a large request"), and a request at or above it never takes
#   a block ``kLargeBuffer`` (20 MiB, ``max_non_split_rounding_size``) or more larger.
# * ``alloc_block``: no free block fits -> a new segment of ``get_allocation_size(size)``
#   bytes (:func:`segment_size`), unless that would take the allocator past its limit; then
#   ``release_available_cached_blocks`` (only with ``max_split_size`` set: free cached
#   oversize segments of the stream, largest first, until the request's size is freed), retry;
#   then ``release_cached_blocks`` (every free, unsplit segment of every pool and stream),
#   retry; then out of memory.
# * ``should_split``: in the small pool (or with expandable segments) split when the remainder
#   is at least ``kMinBlockSize`` (512 B); in the large pool only when the request is below
#   ``max_split_size`` and the remainder is more than ``kSmallSize`` (1 MiB). An unsplit block
#   counts whole in ``allocated_bytes``.
# * ``free_block`` / ``try_merge_blocks``: a freed block merges with free neighbours of the same
#   segment and goes back to its pool; segments are only returned by ``empty_cache`` or the
#   release steps above. A free that waits on other streams' events (``record_stream``) is
#   replayed at its ``free_completed`` event, not at ``free_requested``.
# * Expandable segments (``ExpandableSegment``): one growing segment per pool and stream,
#   mapped in pages of ``kSmallBuffer`` (2 MiB) in the small pool and ``kLargeBuffer`` (20 MiB)
#   in the large pool. For best fit the free block at the end of the mapped range ranks by the
#   size it can grow to, so any other free block that holds the request is preferred; when
#   none holds it, the free tail plus newly mapped pages serve it
#   (``try_allocate_expandable_block``). Releasing unmaps the free tail's whole pages.

_NO_LIMIT = 1 << 62


@dataclass(eq=False)
class _Block:
    """A contiguous range of one segment: allocated, or free in its pool."""

    small: bool
    stream: int
    segment: int
    address: int
    size: int
    allocated: bool = False
    prev: _Block | None = None
    next: _Block | None = None
    gc_base: int = 0  # the pool's get_free_block count when it was cached (its age's start)
    mapped: bool = True  # expandable segments: False for a free range whose pages are unmapped


@dataclass
class _Pool:
    """Free blocks of one pool and stream, sorted by ``(size, address)`` as the C++ set."""

    small: bool
    stream: int
    keys: list[tuple[int, int]] = field(default_factory=list)
    blocks: dict[tuple[int, int], _Block] = field(default_factory=dict)
    # Expandable segments: the pool's one segment, its mapped bytes, its last block.
    mapped_bytes: int = 0
    segment_id: int | None = None
    tail: _Block | None = None
    # get_free_block calls on the C++ pool (small or large, shared by the streams), in a
    # one-item list the pools of one kind share: a cached block's age is it minus gc_base.
    clock: list[int] = field(default_factory=lambda: [0])
    # Expandable segments: free ranges inside the segment whose pages were unmapped.
    holes: list[_Block] = field(default_factory=list)

    def insert(self, block: _Block) -> None:
        key = (block.size, block.address)
        bisect.insort(self.keys, key)
        self.blocks[key] = block
        block.gc_base = self.clock[0]

    def remove(self, block: _Block) -> None:
        key = (block.size, block.address)
        index = bisect.bisect_left(self.keys, key)
        del self.keys[index]
        del self.blocks[key]


class AllocatorModel:
    """Replay of PyTorch's CUDA caching allocator: allocated -> reserved.

    Feed it the allocation sequence of a step (``malloc`` / ``free`` in program order, each on
    its stream) and it tracks what ``torch.cuda.memory_allocated`` and ``memory_reserved``
    would read, and their peaks. Nothing is allocated; blocks are bookkeeping over virtual
    addresses.

    Args:
        expandable_segments: Model ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``.
        max_split_size: Model ``max_split_size_mb`` (given here in bytes); ``None`` = unlimited.
        limit_bytes: Most bytes the allocator may reserve (the device's memory left for the
            process, or the cap ``set_per_process_memory_fraction`` sets); ``None`` = no limit.
            At the limit it gives cached segments back, then raises
            :class:`~memfit.errors.OutOfMemory` as PyTorch does.
        garbage_collection_threshold: Model ``garbage_collection_threshold`` (a fraction in
            (0, 1)): with a limit set, before a new segment is obtained while more than this
            fraction of the limit is reserved, cached whole large-pool segments older than
            the average are given back (``garbage_collect_cached_blocks``); ``None`` = off.

    Raises:
        ConfigError: When ``max_split_size`` is not more than 20 MiB (PyTorch refuses it too)
            or ``limit_bytes`` is negative.

    >>> m = AllocatorModel()
    >>> a = m.malloc(1000); b = m.malloc(3 << 20)
    >>> m.allocated_bytes == 1024 + (3 << 20), m.reserved_bytes == (2 << 20) + (20 << 20)
    (True, True)
    >>> c = m.malloc(3 << 20, stream=7)  # another stream: its own segment
    >>> m.reserved_bytes == (2 << 20) + 2 * (20 << 20)
    True
    """

    def __init__(
        self,
        expandable_segments: bool = False,
        max_split_size: int | None = None,
        limit_bytes: int | None = None,
        garbage_collection_threshold: float | None = None,
    ) -> None:
        gc = garbage_collection_threshold
        if gc is not None and not 0.0 < gc < 1.0:
            raise ConfigError(
                f"garbage_collection_threshold must be between 0 and 1, got "
                f"{garbage_collection_threshold}",
                key_path="garbage_collection_threshold",
                hint="use a fraction such as 0.8, or leave it unset",
            )
        if max_split_size is not None and max_split_size <= K_LARGE_BUFFER:
            raise ConfigError(
                f"max_split_size must be more than 20 MiB, got {max_split_size} bytes",
                key_path="max_split_size_mb",
                hint="use a value above 20 (MiB), or leave it unset",
            )
        if limit_bytes is not None and limit_bytes < 0:
            raise ConfigError(f"limit_bytes must be >= 0, got {limit_bytes}", key_path="limit")
        self.expandable_segments = expandable_segments
        self.max_split_size = _NO_LIMIT if max_split_size is None else max_split_size
        self.limit_bytes = _NO_LIMIT if limit_bytes is None else limit_bytes
        self.gc_threshold = garbage_collection_threshold
        #: Called as ``on_segment(action, address, size, stream)`` when a segment is obtained
        #: (``"segment_alloc"``) or given back (``"segment_free"``); for recording a trace.
        self.on_segment: Callable[[str, int, int, int], None] | None = None
        self._clocks = {True: [0], False: [0]}
        self._pools: dict[tuple[int, bool], _Pool] = {}
        self._handles: dict[int, _Block | None] = {}
        self._next_handle = 1
        self._next_address = 0
        self._segments = 0
        self.allocated_bytes = 0
        self.reserved_bytes = 0
        self.peak_allocated_bytes = 0
        self.peak_reserved_bytes = 0
        self.num_mallocs = 0
        self.num_alloc_retries = 0
        self.num_segment_frees = 0

    # -- public -----------------------------------------------------------------------------

    @property
    def segment_count(self) -> int:
        """Segments obtained from the driver (``cudaMalloc`` calls, or expandable segments)."""
        return self._segments

    @property
    def free_cached_bytes(self) -> int:
        """Bytes reserved but not allocated (cached free blocks, the fragmentation headroom)."""
        return self.reserved_bytes - self.allocated_bytes

    def malloc(self, nbytes: int, stream: int = 0, *, segment_address: int | None = None) -> int:
        """Allocate ``nbytes`` on ``stream`` and return a handle for :meth:`free`.

        A zero-byte request gets a handle but no block, as ``cudaMalloc``-free ``nullptr``
        allocations in PyTorch.

        Args:
            nbytes: Bytes requested.
            stream: The stream.
            segment_address: The address ``cudaMalloc`` returns if this request needs a new
                segment (a replay of a real trace knows it); best fit breaks ties between
                free blocks of one size by address, so a replay that places segments where
                the real allocator did picks the same blocks. ``None``: the next unused
                address.

        Raises:
            ConfigError: When ``nbytes`` is negative.
            OutOfMemory: When the request does not fit under ``limit_bytes`` even after the
                cached segments are given back.
        """
        if nbytes < 0:
            raise ConfigError(f"cannot allocate a negative size: {nbytes}", hint="pass bytes >= 0")
        handle = self._next_handle
        self._next_handle += 1
        if nbytes == 0:
            self._handles[handle] = None
            return handle
        size = round_size(nbytes)
        pool = self._pool(stream, size <= K_SMALL_SIZE)
        block = self._get_free_block(pool, size)
        if block is None and self.gc_threshold is not None and self.limit_bytes != _NO_LIMIT:
            self._garbage_collect()
        if block is None:
            block = self._alloc_block(pool, size, segment_address)
        if block is None and self._release_available(pool, size):
            self.num_alloc_retries += 1
            block = self._alloc_block(pool, size, segment_address)
        if block is None:
            self.num_alloc_retries += 1
            self.empty_cache()
            block = self._alloc_block(pool, size, segment_address)
        if block is None:
            raise OutOfMemory(
                f"the allocator model cannot fit {size} more bytes under its limit of "
                f"{self.limit_bytes} ({self.reserved_bytes} reserved, "
                f"{self.allocated_bytes} allocated)",
                device="model",
                requested_bytes=size,
                free_bytes=max(0, self.limit_bytes - self.reserved_bytes),
                budget_bytes=self.limit_bytes,
                tried=["cached block", "new segment", "release cached segments"],
            )
        if self._should_split(block, size):
            rest = _Block(
                small=pool.small,
                stream=pool.stream,
                segment=block.segment,
                address=block.address + size,
                size=block.size - size,
                prev=block,
                next=block.next,
            )
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            if pool.tail is block:
                pool.tail = rest
            pool.insert(rest)
        block.allocated = True
        self.allocated_bytes += block.size
        self.peak_allocated_bytes = max(self.peak_allocated_bytes, self.allocated_bytes)
        self._handles[handle] = block
        self.num_mallocs += 1
        return handle

    def free(self, handle: int) -> None:
        """Free the block behind ``handle``: it merges with free neighbours and is cached.

        Raises:
            ConfigError: When ``handle`` is unknown or already freed.
        """
        if handle not in self._handles:
            raise ConfigError(
                f"unknown or already freed allocation handle {handle}",
                hint="free each handle returned by malloc exactly once",
            )
        block = self._handles.pop(handle)
        if block is None:
            return
        pool = self._pool(block.stream, block.small)
        block.allocated = False
        self.allocated_bytes -= block.size
        for neighbour in (block.prev, block.next):
            if neighbour is not None and not neighbour.allocated and neighbour.mapped:
                pool.remove(neighbour)
                self._merge(block, neighbour)
                if pool.tail is neighbour:
                    pool.tail = block
        pool.insert(block)

    def add_segment(
        self,
        address: int,
        size: int,
        *,
        stream: int = 0,
        small: bool = False,
        live: list[tuple[int, int]] | tuple[tuple[int, int], ...] = (),
    ) -> list[int]:
        """Seed a segment that existed before the replay starts (a trace recorded mid-run).

        Args:
            address: The segment's device address.
            size: Its size in bytes.
            stream: Its stream.
            small: Whether it belongs to the small pool (a 2 MiB segment of small blocks).
            live: The blocks allocated in it, as ``(address, block size)``, in address order;
                the ranges between them are free, cached blocks.

        Returns:
            A handle for :meth:`free` per live block, in the order given.

        Raises:
            ConfigError: With expandable segments (their layout is not a ``cudaMalloc``
                range), or when the blocks overlap or leave the segment.
        """
        if self.expandable_segments:
            raise ConfigError(
                "add_segment models a cudaMalloc segment; this model has expandable segments",
                hint="seed a model made with expandable_segments=False",
            )
        pool = self._pool(stream, small)
        self._segments += 1
        pieces: list[tuple[int, int, bool]] = []
        at = address
        for start, nbytes in live:
            if start < at or nbytes <= 0 or start + nbytes > address + size:
                raise ConfigError(
                    f"block {start:#x}+{nbytes} does not fit segment {address:#x}+{size} after "
                    f"{at:#x}",
                    hint="give the live blocks in address order, inside the segment",
                )
            if start > at:
                pieces.append((at, start - at, False))
            pieces.append((start, nbytes, True))
            at = start + nbytes
        if at < address + size:
            pieces.append((at, address + size - at, False))
        handles = []
        prev: _Block | None = None
        for start, nbytes, allocated in pieces:
            block = _Block(
                small=small,
                stream=stream,
                segment=self._segments,
                address=start,
                size=nbytes,
                allocated=allocated,
                prev=prev,
            )
            if prev is not None:
                prev.next = block
            prev = block
            if allocated:
                handle = self._next_handle
                self._next_handle += 1
                self._handles[handle] = block
                self.allocated_bytes += nbytes
                handles.append(handle)
            else:
                pool.insert(block)
        self._next_address = max(self._next_address, address + size)
        self._grow_reserved(size)
        self.peak_allocated_bytes = max(self.peak_allocated_bytes, self.allocated_bytes)
        return handles

    def free_blocks(self) -> list[tuple[int, int, int, bool, bool, int]]:
        """Cached free blocks as ``(address, size, stream, small pool, whole segment,
        segment number)``; a block that is not a whole segment cannot be given back until
        its neighbours are freed."""
        out = []
        for pool in self._pools.values():
            for key in pool.keys:
                block = pool.blocks[key]
                whole = block.prev is None and block.next is None
                out.append(
                    (block.address, block.size, block.stream, block.small, whole, block.segment)
                )
        out.sort()
        return out

    def live_blocks(self) -> dict[int, tuple[int, int, int]]:
        """Allocated blocks by handle: ``(address, size, segment number)``."""
        return {
            h: (b.address, b.size, b.segment) for h, b in self._handles.items() if b is not None
        }

    def address_of(self, handle: int) -> int | None:
        """The address of the block behind ``handle`` (``None`` for a zero-byte request).

        Raises:
            KeyError: When the handle is not live.
        """
        block = self._handles[handle]
        return None if block is None else block.address

    def segments(self) -> list[tuple[int, int, int, bool, list[tuple[int, int, bool]]]]:
        """Every segment now: ``(address, size, stream, small pool, blocks)``, blocks as
        ``(address, size, allocated)`` in address order; by address."""
        blocks: dict[int, list[_Block]] = {}
        for block in self._handles.values():
            if block is not None:
                blocks.setdefault(block.segment, []).append(block)
        for pool in self._pools.values():
            for block in pool.blocks.values():
                blocks.setdefault(block.segment, []).append(block)
        out = []
        for members in blocks.values():
            members.sort(key=lambda b: b.address)
            first = members[0]
            out.append(
                (
                    first.address,
                    sum(b.size for b in members),
                    first.stream,
                    first.small,
                    [(b.address, b.size, b.allocated) for b in members],
                )
            )
        out.sort()
        return out

    def empty_cache(self) -> None:
        """Give every free, unsplit segment back (``torch.cuda.empty_cache()``); with
        expandable segments, unmap every whole free page (``release_blocks`` /
        ``unmap_block``): those at the end shorten the segment, those inside it leave holes
        that later requests map again."""
        for pool in self._pools.values():
            for key in list(pool.keys):
                block = pool.blocks.get(key)
                if block is None:
                    continue
                if self.expandable_segments:
                    if block is pool.tail:
                        self._unmap_tail(pool, block)
                    else:
                        self._unmap_inside(pool, block)
                elif block.prev is None and block.next is None:
                    self._release(pool, block)

    # -- internals --------------------------------------------------------------------------

    def _pool(self, stream: int, small: bool) -> _Pool:
        pool = self._pools.get((stream, small))
        if pool is None:
            pool = self._pools[(stream, small)] = _Pool(
                small=small, stream=stream, clock=self._clocks[small]
            )
        return pool

    def _garbage_collect(self) -> None:
        """``garbage_collect_cached_blocks``: above the threshold, give back whole cached
        large-pool segments whose age is at least the average age, until enough is back."""
        assert self.gc_threshold is not None
        if self.expandable_segments:
            return  # the C++ skips blocks of expandable segments
        threshold = int(self.gc_threshold * self.limit_bytes)
        if self.reserved_bytes <= threshold:
            return
        target = self.reserved_bytes - threshold
        large = [p for p in self._pools.values() if not p.small]
        clock = self._clocks[False][0]

        def whole() -> list[tuple[_Pool, _Block]]:
            # The C++ set of large blocks is ordered by (stream, size, address).
            found = [
                (p, p.blocks[k])
                for p in sorted(large, key=lambda p: p.stream)
                for k in p.keys
                if p.blocks[k].prev is None and p.blocks[k].next is None
            ]
            return found

        candidates = whole()
        total_age = sum(clock - b.gc_base for _, b in candidates)
        count = len(candidates)
        reclaimed = 0
        freed = True
        while reclaimed < target and freed and count > 0:
            average = total_age / count
            freed = False
            for pool, block in whole():
                age = clock - block.gc_base
                if age >= average:
                    freed = True
                    reclaimed += block.size
                    total_age -= age
                    count -= 1
                    self._release(pool, block)

    def _page(self, pool: _Pool) -> int:
        return K_SMALL_BUFFER if pool.small else K_LARGE_BUFFER

    def _is_tail(self, pool: _Pool, block: _Block) -> bool:
        return self.expandable_segments and block is pool.tail

    def _get_free_block(self, pool: _Pool, size: int) -> _Block | None:
        pool.clock[0] += 1
        index = bisect.bisect_left(pool.keys, (size, -1))
        tail: _Block | None = None
        for key in pool.keys[index:]:
            block = pool.blocks[key]
            if self._is_tail(pool, block):
                tail = block  # ranks as the size it can grow to: any other fit comes first
                continue
            if not self._oversize_ok(size, block.size):
                return None
            pool.remove(block)
            return block
        if tail is not None and self._oversize_ok(size, tail.size):
            pool.remove(tail)
            return tail
        return None

    def _oversize_ok(self, size: int, block_size: int) -> bool:
        if size < self.max_split_size and block_size >= self.max_split_size:
            return False
        return not (size >= self.max_split_size and block_size >= size + K_LARGE_BUFFER)

    def _alloc_block(self, pool: _Pool, size: int, address: int | None = None) -> _Block | None:
        """A new segment (or newly mapped pages) for ``size``, or ``None`` at the limit."""
        if not self.expandable_segments:
            seg = segment_size(size)
            if self.reserved_bytes + seg > self.limit_bytes:
                return None
            self._segments += 1
            if address is None:
                address = self._next_address
                self._next_address += seg
            else:
                self._next_address = max(self._next_address, address + seg)
            block = _Block(
                small=pool.small,
                stream=pool.stream,
                segment=self._segments,
                address=address,
                size=seg,
            )
            self._grow_reserved(seg)
            if self.on_segment is not None:
                self.on_segment("segment_alloc", address, seg, pool.stream)
            return block
        if pool.holes:
            filled, tried = self._fill_hole(pool, size)
            if tried:
                return filled  # None: the pages it needs do not fit under the limit
        # The free tail (if any) joins newly mapped pages; the tail was not taken because it
        # was too small (a fitting tail is returned by _get_free_block).
        tail = pool.tail
        have = tail.size if tail is not None and not tail.allocated else 0
        page = self._page(pool)
        grow = page * ((size - have + page - 1) // page)
        if self.reserved_bytes + grow > self.limit_bytes:
            return None
        if pool.segment_id is None:
            self._segments += 1
            pool.segment_id = self._segments
            pool.mapped_bytes = 0
        if tail is not None and not tail.allocated:
            pool.remove(tail)
        start = pool.mapped_bytes
        pool.mapped_bytes += grow
        self._grow_reserved(grow)
        if tail is not None and not tail.allocated:
            tail.size += grow
            return tail
        block = _Block(
            small=pool.small,
            stream=pool.stream,
            segment=pool.segment_id,
            address=start,
            size=grow,
            prev=tail,
        )
        if tail is not None:
            tail.next = block
        pool.tail = block
        return block

    def _split(self, block: _Block, at: int) -> _Block:
        """Cut ``block`` at address ``at``; return the new block after the cut."""
        rest = _Block(
            small=block.small,
            stream=block.stream,
            segment=block.segment,
            address=at,
            size=block.address + block.size - at,
            prev=block,
            next=block.next,
            mapped=block.mapped,
        )
        if block.next is not None:
            block.next.prev = rest
        block.next = rest
        block.size = at - block.address
        return rest

    def _unmap_inside(self, pool: _Pool, block: _Block) -> None:
        """Unmap the whole pages of a free block inside an expandable segment (a hole)."""
        page = self._page(pool)
        first = -(-block.address // page) * page
        last = (block.address + block.size) // page * page
        if last <= first:
            return
        pool.remove(block)
        hole = block
        if first > block.address:
            hole = self._split(block, first)
            pool.insert(block)
        if last < hole.address + hole.size:
            pool.insert(self._split(hole, last))
        hole.mapped = False
        self.reserved_bytes -= hole.size
        self.num_segment_frees += 1
        for neighbour in (hole.prev, hole.next):
            if neighbour is not None and not neighbour.allocated and not neighbour.mapped:
                pool.holes.remove(neighbour)
                self._merge(hole, neighbour)
        pool.holes.append(hole)

    def _fill_hole(self, pool: _Pool, size: int) -> tuple[_Block | None, bool]:
        """``find_expandable_block`` / ``try_allocate_expandable_block``: the lowest hole
        (with the free block just before it) whose run of free and unmapped space holds
        ``size`` (a run that reaches the segment's end grows it); its pages are mapped as
        needed and the run becomes one block. Returns ``(block, True)``, ``(None, True)``
        when that run's pages do not fit under the limit, ``(None, False)`` when no hole
        serves (the end of the segment does, as without holes)."""
        page = self._page(pool)

        def in_pool(b: _Block) -> bool:
            return pool.blocks.get((b.size, b.address)) is b

        for hole in sorted(pool.holes, key=lambda b: b.address):
            start = hole
            if hole.prev is not None and not hole.prev.allocated and hole.prev.mapped:
                start = hole.prev
            run: list[_Block] = []
            have = 0
            block: _Block | None = start
            while block is not None and not block.allocated and have < size:
                run.append(block)
                have += block.size
                block = block.next
            if have < size and block is not None:
                continue  # the run ends at a live block
            need = size
            plan: list[tuple[_Block, int]] = []
            for b in run:
                if need <= 0:
                    break
                if b.mapped:
                    need -= b.size
                else:
                    take = min(b.size, page * ((need + page - 1) // page))
                    plan.append((b, take))
                    need -= take
            grow = page * ((need + page - 1) // page) if need > 0 else 0
            if self.reserved_bytes + sum(t for _, t in plan) + grow > self.limit_bytes:
                return None, True
            for b, take in plan:
                if take < b.size:
                    pool.holes.append(self._split(b, b.address + take))
                pool.holes.remove(b)
                b.mapped = True
                self._grow_reserved(take)
            if grow:
                last = run[-1]  # the segment's free tail (no hole is left at the end)
                if in_pool(last):
                    pool.remove(last)
                last.size += grow
                pool.mapped_bytes += grow
                self._grow_reserved(grow)
            merged = run[0]
            if in_pool(merged):
                pool.remove(merged)
            while merged.size < size:
                nxt = merged.next
                assert nxt is not None and not nxt.allocated and nxt.mapped
                if in_pool(nxt):
                    pool.remove(nxt)
                self._merge(merged, nxt)
                if pool.tail is nxt:
                    pool.tail = merged
            return merged, True
        return None, False

    def _release_available(self, pool: _Pool, size: int) -> bool:
        """``release_available_cached_blocks``: with ``max_split_size`` set, give back cached
        oversize segments of this pool and stream, the smallest that holds the request or
        else the largest first, until ``size`` bytes are freed."""
        if self.max_split_size == _NO_LIMIT or self.expandable_segments:
            return False
        want = max(size, self.max_split_size)
        whole = [
            pool.blocks[k]
            for k in pool.keys
            if pool.blocks[k].prev is None and pool.blocks[k].next is None
        ]
        fitting = [b for b in whole if b.size >= want]
        if fitting:
            self._release(pool, fitting[0])
            return True
        released = 0
        for block in sorted(
            (b for b in whole if b.size >= self.max_split_size), key=lambda b: -b.size
        ):
            if released >= want:
                break
            self._release(pool, block)
            released += block.size
        return released >= want

    def _release(self, pool: _Pool, block: _Block) -> None:
        if self.on_segment is not None:
            self.on_segment("segment_free", block.address, block.size, block.stream)
        pool.remove(block)
        self.reserved_bytes -= block.size
        self.num_segment_frees += 1

    def _unmap_tail(self, pool: _Pool, tail: _Block) -> None:
        """Unmap the whole pages of a free tail (addresses count from the segment's start)."""
        page = self._page(pool)
        first_page = -(-tail.address // page) * page
        unmapped = max(0, tail.address + tail.size - first_page)
        if not unmapped:
            return
        pool.remove(tail)
        tail.size -= unmapped
        pool.mapped_bytes -= unmapped
        self.reserved_bytes -= unmapped
        self.num_segment_frees += 1
        if tail.size:
            pool.insert(tail)
            return
        pool.tail = tail.prev
        if tail.prev is not None:
            tail.prev.next = None
        while pool.tail is not None and not pool.tail.mapped:  # a hole now at the end
            hole = pool.tail
            pool.holes.remove(hole)
            pool.mapped_bytes -= hole.size
            pool.tail = hole.prev
            if hole.prev is not None:
                hole.prev.next = None

    def _grow_reserved(self, nbytes: int) -> None:
        self.reserved_bytes += nbytes
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved_bytes)

    def _should_split(self, block: _Block, size: int) -> bool:
        remaining = block.size - size
        if block.small or self.expandable_segments:
            return remaining >= K_MIN_BLOCK_SIZE
        return size < self.max_split_size and remaining > K_SMALL_SIZE

    def _merge(self, block: _Block, neighbour: _Block) -> None:
        if neighbour is block.prev:
            block.address = neighbour.address
            block.prev = neighbour.prev
            if block.prev is not None:
                block.prev.next = block
        else:
            block.next = neighbour.next
            if block.next is not None:
                block.next.prev = block
        block.size += neighbour.size
