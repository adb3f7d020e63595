"""Replay a recorded allocator trace through :class:`memfit.allocator.model.AllocatorModel`.

Most snapshots are recorded mid-run: ``_record_memory_history`` starts after the model and
the optimizer exist. :func:`start_state` rebuilds the allocator at the first event of the
trace from the segments at the end and the trace walked backwards: a segment the trace
allocates did not exist before its ``segment_alloc``, one it frees existed before its
``segment_free``; a block the trace frees was live before its ``free_completed``, one it
allocates was not live before its ``alloc``. What is left at the first event is the
allocator's state then.

:func:`recorded_curve` reads the reserved bytes after every event from the trace's own segment
events (the truth); :func:`replay` runs the trace's requests (``alloc`` and
``free_completed``; ``free_requested`` only starts a free that may wait for other streams'
work) through the model seeded with the start state, with the recorded settings or others,
and gives the model's curve. The device's limit the real allocator met is read from the
trace too (:func:`implied_limit`): every new segment that came without giving cached ones back
fitted under it; every one that first gave cached segments back, and every ``oom``, did not.
A run of ``segment_free`` events that no allocation needed is a call of
``torch.cuda.empty_cache()`` and is replayed as one.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

from memfit.allocator.model import K_SMALL_BUFFER, AllocatorModel, round_size
from memfit.allocator.snapshot import SnapshotDevice, TraceEvent
from memfit.errors import ConfigError, OutOfMemory

__all__ = [
    "Curve",
    "ImpliedLimit",
    "ModelState",
    "StartSegment",
    "StartState",
    "empty_cache_points",
    "implied_limit",
    "recorded_curve",
    "recorded_start",
    "replay",
    "start_state",
]

_HINT = (
    "record the trace with max_entries large enough that no event was dropped "
    "(torch.cuda.memory._record_memory_history(max_entries=...))"
)


@dataclass(frozen=True)
class StartSegment:
    """A segment that existed at the first event, with the blocks live in it then."""

    address: int
    size: int
    stream: int
    small: bool
    live: tuple[tuple[int, int], ...]  # (address, block size), address order


@dataclass(frozen=True)
class StartState:
    """The allocator at the first event of a trace.

    Attributes:
        segments: Segments it held, by address (empty for expandable segments).
        reserved_bytes: Their bytes.
        allocated_bytes: Bytes of the blocks live then (rounded to 512 B).
        live_blocks: How many blocks were live then.
        blocks: The blocks live then: ``(address, size, stream)``, by address.
        expandable: Whether the recording used expandable segments.
    """

    segments: tuple[StartSegment, ...]
    reserved_bytes: int
    allocated_bytes: int
    live_blocks: int
    blocks: tuple[tuple[int, int, int], ...] = ()
    expandable: bool = False

    @property
    def exact(self) -> bool:
        """Whether the state is known exactly: always for cudaMalloc segments; with expandable
        segments only when the recording started from an empty allocator (their mapped pages
        are not rebuilt, only the blocks live at the start)."""
        return not self.expandable or (self.reserved_bytes == 0 and self.live_blocks == 0)


def _inconsistent(what: str) -> ConfigError:
    return ConfigError(
        f"the trace does not agree with the segments at its end: {what}",
        key_path="device_traces",
        hint=_HINT,
    )


def _expandable(dev: SnapshotDevice) -> bool:
    return any(s.expandable for s in dev.segments) or any(
        e.action in ("segment_map", "segment_unmap") for e in dev.trace
    )


def start_state(dev: SnapshotDevice) -> StartState:
    """The allocator's segments and live blocks at the trace's first event (see module).

    Raises:
        ConfigError: When the trace and the final segments disagree (events were dropped).
    """
    expandable = _expandable(dev)
    segments: dict[int, tuple[int, int, bool]] = {
        s.address: (s.total_size, s.stream, s.small) for s in dev.segments
    }
    stream_of = {s.address: s.stream for s in dev.segments}
    live: dict[int, tuple[int, int]] = {}  # address -> (block size, stream)
    for seg in dev.segments:
        for block in seg.blocks:
            if block.live:
                live[block.address] = (block.size, seg.stream)
    for index in range(len(dev.trace) - 1, -1, -1):
        event = dev.trace[index]
        action = event.action
        if action == "alloc":
            if event.size == 0:
                continue
            if live.pop(event.addr, None) is None:
                raise _inconsistent(f"event {index} allocates {event.addr:#x}, never live after")
        elif action == "free_completed":
            if event.size == 0:
                continue
            if event.addr in live:
                raise _inconsistent(f"event {index} frees {event.addr:#x}, live again after")
            live[event.addr] = (round_size(event.size), event.stream)
        elif expandable:
            continue
        elif action == "segment_alloc":
            if segments.pop(event.addr, None) is None:
                raise _inconsistent(f"event {index} allocates segment {event.addr:#x}, gone after")
        elif action == "segment_free":
            if event.addr in segments:
                raise _inconsistent(f"event {index} frees segment {event.addr:#x}, held after")
            segments[event.addr] = (event.size, event.stream, event.size == K_SMALL_BUFFER)
            stream_of[event.addr] = event.stream
    blocks = tuple(sorted((a, size, stream) for a, (size, stream) in live.items()))
    if expandable:
        return StartState(
            segments=(),
            reserved_bytes=recorded_start(dev),
            allocated_bytes=sum(b[1] for b in blocks),
            live_blocks=len(blocks),
            blocks=blocks,
            expandable=True,
        )
    starts = sorted(segments)
    placed: dict[int, list[tuple[int, int]]] = {a: [] for a in starts}
    for address in sorted(live):
        size, _stream = live[address]
        i = bisect.bisect_right(starts, address) - 1
        if i < 0:
            raise _inconsistent(f"block {address:#x}, live at the start, lies in no segment")
        seg_address = starts[i]
        seg_size = segments[seg_address][0]
        if address + size > seg_address + seg_size:
            raise _inconsistent(f"block {address:#x}, live at the start, leaves its segment")
        placed[seg_address].append((address, size))
    out = tuple(
        StartSegment(
            address=a,
            size=segments[a][0],
            stream=segments[a][1],
            small=segments[a][2],
            live=tuple(placed[a]),
        )
        for a in starts
    )
    return StartState(
        segments=out,
        reserved_bytes=sum(s.size for s in out),
        allocated_bytes=sum(size for s in out for _, size in s.live),
        live_blocks=sum(len(s.live) for s in out),
        blocks=blocks,
    )


def recorded_start(dev: SnapshotDevice) -> int:
    """Reserved bytes at the first event: those at the end less what the trace's segment
    events added (``segment_alloc`` / ``segment_map`` add, ``segment_free`` / ``_unmap``
    give back)."""
    net = 0
    for event in dev.trace:
        if event.action in ("segment_alloc", "segment_map"):
            net += event.size
        elif event.action in ("segment_free", "segment_unmap"):
            net -= event.size
    return dev.reserved_bytes - net


def recorded_curve(dev: SnapshotDevice, start: StartState | None = None) -> list[int]:
    """Reserved bytes after each event, from the trace's segment events (expandable
    segments' maps and unmaps included)."""
    reserved = start.reserved_bytes if start is not None else recorded_start(dev)
    out = []
    for event in dev.trace:
        if event.action in ("segment_alloc", "segment_map"):
            reserved += event.size
        elif event.action in ("segment_free", "segment_unmap"):
            reserved -= event.size
        out.append(reserved)
    return out


def _free_runs(trace: Sequence[TraceEvent]) -> list[tuple[int, int]]:
    """``(first, after)`` of each run of ``segment_free`` events (with the block frees that
    complete among them): ``after`` is the index of the next other event, or ``len``."""
    out = []
    i, n = 0, len(trace)
    while i < n:
        if trace[i].action != "segment_free":
            i += 1
            continue
        j = i
        while j < n and trace[j].action in ("segment_free", "free_completed", "free_requested"):
            j += 1
        out.append((i, j))
        i = j
    return out


def _classify(dev: SnapshotDevice, start: StartState | None) -> tuple[list[int], ImpliedLimit]:
    """The ``empty_cache()`` calls of the trace and the limit it implies.

    Every ``segment_alloc`` fitted under the limit, so the limit is at least the largest
    ``reserved + segment`` the trace reached (``low``). A run of ``segment_free`` events that
    ends in an ``oom``, or in a ``segment_alloc`` whose ``reserved + segment`` before the run
    was above ``low``, is the allocator giving cached segments back to fit a request; any
    other run is an ``empty_cache()`` call (which may be followed by a request that needs a
    segment anyway).
    """
    trace = dev.trace
    curve = recorded_curve(dev, start)
    base = start.reserved_bytes if start is not None else recorded_start(dev)

    def before(i: int) -> int:
        return curve[i - 1] if i else base

    low = max([base, *curve])  # everything the allocator held fitted
    calls: list[int] = []
    high: int | None = None
    for first, after in _free_runs(trace):
        nxt = trace[after] if after < len(trace) else None
        if nxt is not None and nxt.action == "oom":
            continue  # counted below
        if nxt is not None and nxt.action == "segment_alloc" and before(first) + nxt.size > low:
            need = before(first) + nxt.size
            high = need if high is None else min(high, need)
            continue
        calls.append(first)
    for i, event in enumerate(trace):
        if event.action == "oom":
            # The request failed after the cached segments were given back.
            need = before(i) + _segment_for(event.size)
            high = need if high is None else min(high, need)
    return calls, ImpliedLimit(low=low, high=high)


def empty_cache_points(dev: SnapshotDevice, start: StartState | None = None) -> list[int]:
    """Indices where the trace's ``torch.cuda.empty_cache()`` calls begin (runs of
    ``segment_free`` events no request needed; see :func:`implied_limit`)."""
    return _classify(dev, start)[0]


@dataclass(frozen=True)
class ImpliedLimit:
    """What the trace says of the most the allocator could reserve.

    Attributes:
        low: Every segment obtained fitted: reserved + segment <= ``low`` held each time.
        high: The smallest reserved + segment that did not fit (segments given back first,
            or an ``oom``), or ``None`` when the allocator never met its limit.
    """

    low: int
    high: int | None

    @property
    def consistent(self) -> bool:
        """Whether one fixed limit explains the whole trace (``low < high``)."""
        return self.high is None or self.low < self.high

    @property
    def bytes(self) -> int | None:
        """The limit to replay with: ``None`` when never met, else ``low``."""
        return None if self.high is None else self.low


def implied_limit(dev: SnapshotDevice, start: StartState | None = None) -> ImpliedLimit:
    """The limit the real allocator met (see :func:`_classify`)."""
    return _classify(dev, start)[1]


def _segment_for(nbytes: int) -> int:
    from memfit.allocator.model import segment_size

    return segment_size(round_size(nbytes))


@dataclass(frozen=True)
class ModelState:
    """The model's blocks at one point of a replay.

    Attributes:
        free: Cached free blocks: ``(address, size, stream, small pool, whole segment,
            segment number)`` (:meth:`AllocatorModel.free_blocks`).
        live: Allocated blocks: ``(trace address, size, segment number)``.
    """

    free: list[tuple[int, int, int, bool, bool, int]]
    live: list[tuple[int, int, int]]


def _inspect(model: AllocatorModel, handles: dict[int, int]) -> ModelState:
    blocks = model.live_blocks()
    live = [(address, blocks[h][1], blocks[h][2]) for address, h in handles.items() if h in blocks]
    return ModelState(free=model.free_blocks(), live=live)


@dataclass(frozen=True)
class Curve:
    """A replay: the model's reserved and allocated bytes after every event.

    Attributes:
        reserved: After each event of the trace.
        allocated: After each event (blocks as the model sized them).
        peak_reserved: The highest reserved.
        peak_allocated: The highest allocated.
        segments: Segments the model obtained during the replay (``cudaMalloc`` calls).
        failed: Indices of ``alloc`` events the model could not fit under the limit (``-1``
            for a block live at the start that did not fit).
        oom_fits: For each ``oom`` event: whether the model fitted the failed request.
    """

    reserved: list[int]
    allocated: list[int]
    peak_reserved: int
    peak_allocated: int
    segments: int
    failed: list[int] = field(default_factory=list)
    oom_fits: list[bool] = field(default_factory=list)
    model: AllocatorModel | None = field(default=None, compare=False, repr=False)
    handles: dict[int, int] = field(default_factory=dict, compare=False, repr=False)
    inspected: dict[int, ModelState] = field(default_factory=dict, compare=False, repr=False)


def replay(
    dev: SnapshotDevice,
    *,
    expandable_segments: bool = False,
    max_split_size: int | None = None,
    limit_bytes: int | None = None,
    garbage_collection_threshold: float | None = None,
    start: StartState | None = None,
    exact_addresses: bool = True,
    empty_cache_at: Sequence[int] = (),
    recorded_empty_cache: bool = True,
    stop: int | None = None,
    inspect_at: Sequence[int] = (),
) -> Curve:
    """Replay ``dev``'s trace through the model, seeded with the start state.

    Args:
        dev: The device's snapshot.
        expandable_segments: Replay with ``expandable_segments:True``.
        max_split_size: ``max_split_size_mb`` in bytes, or ``None``.
        limit_bytes: The most the allocator may reserve (:func:`implied_limit` gives the
            recorded one), or ``None``.
        garbage_collection_threshold: The fraction, or ``None``.
        start: The start state (:func:`start_state` when ``None``).
        exact_addresses: Place new segments where the trace's ``segment_alloc`` says the real
            allocator got them (for a replay with the recorded settings).
        empty_cache_at: Extra event indices before which ``empty_cache()`` runs.
        recorded_empty_cache: Replay the trace's own ``empty_cache()`` calls.
        stop: Replay the events before this index only (the curves end there); the model as
            it stands then is :attr:`Curve.model` (with :attr:`Curve.handles`, block address
            -> model handle).
        inspect_at: Event indices before which the model's blocks are kept
            (:attr:`Curve.inspected`; ``len(trace)``: after the last event).

    Raises:
        ConfigError: As :func:`start_state`, or for invalid settings.
    """
    start = start or start_state(dev)
    model = AllocatorModel(
        expandable_segments, max_split_size, limit_bytes, garbage_collection_threshold
    )
    handles: dict[int, int] = {}
    seed_failed = 0
    if expandable_segments or start.expandable:
        # Expandable segments cannot be seeded page by page: allocate the blocks live at the
        # start first, in address order (the layout is then the model's, not the recorded).
        for address, size, stream in start.blocks:
            try:
                handles[address] = model.malloc(size, stream)
            except OutOfMemory:
                seed_failed += 1
    else:
        for seg in start.segments:
            got = model.add_segment(
                seg.address, seg.size, stream=seg.stream, small=seg.small, live=seg.live
            )
            for (address, _size), handle in zip(seg.live, got, strict=True):
                handles[address] = handle
    base_segments = model.segment_count
    trace = dev.trace
    cache_at = set(empty_cache_at)
    if recorded_empty_cache:
        cache_at.update(empty_cache_points(dev, start))
    reserved: list[int] = []
    allocated: list[int] = []
    failed: list[int] = [-1] * seed_failed  # blocks live at the start that did not fit
    oom_fits: list[bool] = []
    pending_hint: int | None = None
    wanted = set(inspect_at)
    inspected: dict[int, ModelState] = {}
    for index, event in enumerate(trace):
        if stop is not None and index >= stop:
            break
        if index in wanted:
            inspected[index] = _inspect(model, handles)
        if index in cache_at:
            model.empty_cache()
        action = event.action
        if action == "segment_alloc":
            pending_hint = event.addr
        elif action == "alloc":
            if event.size:
                hint = pending_hint if exact_addresses else None
                try:
                    handles[event.addr] = model.malloc(
                        event.size, event.stream, segment_address=hint
                    )
                except OutOfMemory:
                    failed.append(index)
            pending_hint = None
        elif action == "free_completed":
            freed = handles.pop(event.addr, None)
            if freed is not None:
                model.free(freed)
        elif action == "oom":
            fits = True
            try:
                probe = model.malloc(event.size, event.stream)
            except OutOfMemory:
                fits = False
            else:
                model.free(probe)
            oom_fits.append(fits)
            pending_hint = None
        reserved.append(model.reserved_bytes)
        allocated.append(model.allocated_bytes)
    if len(trace) in wanted:
        inspected[len(trace)] = _inspect(model, handles)
    return Curve(
        reserved=reserved,
        allocated=allocated,
        peak_reserved=model.peak_reserved_bytes,
        peak_allocated=model.peak_allocated_bytes,
        segments=model.segment_count - base_segments,
        failed=failed,
        oom_fits=oom_fits,
        model=model,
        handles=handles,
        inspected=inspected,
    )
