"""What ``memfit explain`` found, as plain data: the peaks, the OOM, where the memory was,
fragmentation, the what-if replays and the leaks (:class:`Explanation` and its parts)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memfit._plain import plain_fields

#: Sites listed per group.
TOP = 8


#: What a replay of the caching allocator cannot see.
UNKNOWNS: tuple[str, ...] = (
    "memory of other processes on the GPU",
    "the CUDA context, and libraries that allocate outside PyTorch's caching allocator "
    "(NCCL, cuDNN / cuBLAS handles, custom kernels)",
    "requests made before the recording started, other than the blocks still live at its "
    "first event",
)


#: ``max_split_size_mb`` values tried.
SPLIT_SIZES_MB: tuple[int, ...] = (128, 512)


#: ``garbage_collection_threshold`` values tried (they need a memory limit).
GC_THRESHOLDS: tuple[float, ...] = (0.6, 0.8)


@dataclass(frozen=True)
class Site:
    """Live bytes of one group (an allocation site, a module, a stream, a size)."""

    name: str
    bytes: int
    count: int

    def to_dict(self) -> dict[str, Any]:
        return plain_fields(self)


@dataclass(frozen=True)
class Group:
    """One way of grouping the live blocks: ``by`` is ``"site"``, ``"module"``, ``"stream"``,
    ``"size"`` or ``"size_class"``; the top :data:`TOP` rows, largest first."""

    by: str
    rows: tuple[Site, ...]
    other_bytes: int = 0
    other_count: int = 0

    def to_dict(self) -> dict[str, Any]:
        return plain_fields(self, rows=[r.to_dict() for r in self.rows])


@dataclass(frozen=True)
class Peak:
    """A peak and when: ``event`` is the trace's index after which it was reached (``-1``:
    already at the first event)."""

    bytes: int
    event: int

    def to_dict(self) -> dict[str, Any]:
        return plain_fields(self)


@dataclass(frozen=True)
class OomInfo:
    """An out-of-memory recorded in the trace.

    Attributes:
        event: Its index in the trace.
        requested_bytes: The request that failed.
        device_free_bytes: The driver's free memory then (``None`` if not recorded).
        reserved_bytes: What the allocator held after giving its cached segments back.
        allocated_bytes: Bytes of live blocks then.
        largest_free_block_bytes: The largest cached free block then (in any pool).
        capacity_bytes: What the process could have held: reserved + the driver's free.
    """

    event: int
    requested_bytes: int
    device_free_bytes: int | None
    reserved_bytes: int
    allocated_bytes: int
    largest_free_block_bytes: int
    capacity_bytes: int | None

    def to_dict(self) -> dict[str, Any]:
        return plain_fields(self)


@dataclass(frozen=True)
class Fragmentation:
    """Cached bytes at the chosen point.

    Attributes:
        cached_bytes: Reserved - allocated.
        whole_segment_bytes: Free in segments nothing lives in (``empty_cache`` gives them
            back).
        split_bytes: Free in segments that live blocks keep (no ``empty_cache`` helps).
        too_small_bytes: Free blocks of the request's pool smaller than the request.
        largest_free_block_bytes: The largest free block.
        request_bytes: The request measured against (the failed one, or the allocation at
            the peak), or ``None``.
        split_by: The sites whose live blocks share segments with the split bytes, with the
            free bytes of those segments shared among them by live bytes.
    """

    cached_bytes: int
    whole_segment_bytes: int
    split_bytes: int
    too_small_bytes: int
    largest_free_block_bytes: int
    request_bytes: int | None
    split_by: tuple[Site, ...]

    def to_dict(self) -> dict[str, Any]:
        return plain_fields(self, split_by=[s.to_dict() for s in self.split_by])


@dataclass(frozen=True)
class WhatIf:
    """One replay with other settings.

    Attributes:
        name: A short name (``"as recorded"``, ``"expandable_segments"``, ...).
        setting: The ``PYTORCH_CUDA_ALLOC_CONF`` text (or the call) that gives it.
        peak_reserved_bytes: The reserved peak of the replay.
        fits: Whether every request (the failed one included) fits under the capacity;
            ``None`` when the capacity is unknown.
        failed_requests: Requests the replay could not fit under the capacity.
    """

    name: str
    setting: str
    peak_reserved_bytes: int
    fits: bool | None
    failed_requests: int

    def to_dict(self) -> dict[str, Any]:
        return plain_fields(self)


@dataclass(frozen=True)
class GrowingSite:
    """A site whose live bytes grow from one repetition of the step to the next."""

    site: str
    growth_per_step_bytes: int
    live_bytes: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return plain_fields(self, live_bytes=list(self.live_bytes))


@dataclass(frozen=True)
class Explanation:
    """What :func:`explain` found (plain data; ``to_dict`` is ``--json``).

    Attributes:
        source: The snapshot's path.
        device: The device explained.
        events: Events in its trace.
        frees: Frees completed in it.
        has_frames: Whether blocks carry stack frames.
        at: ``"oom"``, ``"peak"``, ``"end"`` or an event index: the point of 2 and 3.
        at_event: The trace index of that point (state after it; before it for an OOM).
        peak_reserved_bytes: Highest reserved, from the trace's segment events.
        peak_reserved_event: When.
        peak_allocated_bytes: Highest allocated (live blocks, 512-byte rounded).
        peak_allocated_event: When.
        start_reserved_bytes: Reserved at the first event (recorded mid-run when > 0).
        start_allocated_bytes: Live at the first event.
        reserved_bytes: Reserved at the point.
        allocated_bytes: Allocated at the point.
        replay_exact: Whether the replay with the recorded settings gives the recorded
            reserved bytes after every event.
        replay_bytes_off: Most the replayed reserved bytes differ from the recorded.
        capacity_bytes: What the process could hold (at the OOM: reserved + free; else the
            limit the trace met), or ``None``.
        oom: The out-of-memory, if any.
        groups: Live blocks at the point, grouped.
        fragmentation: Cached bytes at the point.
        what_if: Replays with other settings.
        recommendation: One sentence.
        evidence: Why.
        must_shrink_bytes: At an OOM no setting cures: bytes the live tensors must shrink by.
        steps: Repetitions of the step found in the trace (0: none).
        leaks: Growing sites.
        unknowns: What the replay cannot know.
        notes: Anything else worth saying.
        timeline: ``(event, reserved, allocated)`` thinned to at most a few thousand points.
        simulated: The snapshot comes from :func:`memfit.simulate_gpu`, which counts allocated
            bytes against its budget: its reserved bytes are memfit's model's, and the
            recorded run has no allocator of its own to compare settings with.
    """

    source: str
    device: int
    events: int
    frees: int
    has_frames: bool
    at: str
    at_event: int
    peak_reserved_bytes: int
    peak_reserved_event: int
    peak_allocated_bytes: int
    peak_allocated_event: int
    start_reserved_bytes: int
    start_allocated_bytes: int
    reserved_bytes: int
    allocated_bytes: int
    replay_exact: bool
    replay_bytes_off: int
    capacity_bytes: int | None
    oom: OomInfo | None
    groups: tuple[Group, ...]
    fragmentation: Fragmentation
    what_if: tuple[WhatIf, ...]
    recommendation: str
    evidence: str
    must_shrink_bytes: int | None
    steps: int
    leaks: tuple[GrowingSite, ...]
    unknowns: tuple[str, ...]
    notes: tuple[str, ...]
    timeline: tuple[tuple[int, int, int], ...] = field(repr=False, default=())
    simulated: bool = False

    def group(self, by: str) -> Group | None:
        """The group ``by`` (``"site"``, ``"module"``, ...), or ``None``."""
        return next((g for g in self.groups if g.by == by), None)

    def to_dict(self) -> dict[str, Any]:
        return plain_fields(
            self,
            oom=None if self.oom is None else self.oom.to_dict(),
            groups=[g.to_dict() for g in self.groups],
            fragmentation=self.fragmentation.to_dict(),
            what_if=[w.to_dict() for w in self.what_if],
            leaks=[leak.to_dict() for leak in self.leaks],
            unknowns=list(self.unknowns),
            notes=list(self.notes),
            timeline=[list(t) for t in self.timeline],
        )
