"""``memfit explain``: what a CUDA memory snapshot says about a run's peak or its OOM.

:func:`explain` reads a snapshot (``torch.cuda.memory._dump_snapshot()``, memfit's OOM dump,
or the same data as JSON) through :mod:`memfit.allocator.snapshot`, rebuilds the allocator's state
at the first recorded event and replays the trace through the allocator model
(:mod:`memfit.allocator.replay`), and returns an :class:`Explanation`: plain data, which the CLI
and the picture only render.

1. the peaks (reserved from the trace's own segment events, allocated from its blocks), and at
   an out-of-memory the failed request, the driver's free memory and the largest free block;
2. where the memory was at the chosen point: live blocks grouped by the user's own frame, by
   the ``forward`` they were allocated in, by stream, by size;
3. fragmentation: cached bytes, those in segments that live blocks keep split, the blocks
   too small for the request, and the allocation sites that keep those segments split;
4. what if: the same requests replayed with other allocator settings, and one
   recommendation;
5. leaks: sites whose live bytes grow from one repetition of the step to the next;
6. :func:`png_bytes` / :func:`render_html`: the timeline with the peak and the top sites.
"""

from __future__ import annotations

import base64
import html
import io
import itertools
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memfit._checks import require
from memfit._plain import plain_fields
from memfit.allocator.model import K_SMALL_SIZE, round_size
from memfit.allocator.replay import (
    ModelState,
    StartState,
    empty_cache_points,
    implied_limit,
    recorded_curve,
    replay,
    start_state,
)
from memfit.allocator.snapshot import (
    RECORD_HINT,
    DeviceSnapshot,
    Frame,
    Snapshot,
    load_snapshot,
    snapshot_from_data,
)
from memfit.errors import ConfigError
from memfit.units import MiB, format_bytes

__all__ = [
    "Explanation",
    "Fragmentation",
    "Group",
    "Leak",
    "OomInfo",
    "Peak",
    "Site",
    "WhatIf",
    "explain",
    "png_bytes",
    "render_html",
    "render_text",
]

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

#: A setting is recommended without an OOM only when it lowers the reserved peak by at least
#: this fraction and :data:`_MIN_SAVING` bytes.
_MIN_SAVING_FRACTION = 0.02
_MIN_SAVING = 64 * MiB


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
class Leak:
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
    leaks: tuple[Leak, ...]
    unknowns: tuple[str, ...]
    notes: tuple[str, ...]
    timeline: tuple[tuple[int, int, int], ...] = field(repr=False, default=())

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


# --- frames --------------------------------------------------------------------------------------

_STDLIB = re.compile(r"(^|[/\\])(lib[/\\]python3[.\d]*|Lib)[/\\](?!site-packages|dist-packages)")
#: Library frames: torch's (and what runs it), and memfit's own package, but not a checkout
#: of memfit whose tests, examples or benchmarks are the user's code here.
_LIBRARY = re.compile(
    r"(^|[/\\])(torch|triton|_pytest|pluggy)[/\\]"
    r"|(^|[/\\])memfit[/\\](?!tests[/\\]|examples[/\\]|bench[/\\])"
)


def _user_frame(frames: Sequence[Frame]) -> Frame | None:
    """The innermost Python frame outside torch, memfit and the standard library."""
    for frame in frames:
        name = frame.filename
        if not name.endswith(".py") or name.startswith("<"):
            continue
        if _LIBRARY.search(name) or _STDLIB.search(name):
            continue
        return frame
    return None


def _module_frame(frames: Sequence[Frame]) -> Frame | None:
    """The innermost ``forward`` (an ``nn.Module``'s) outside torch."""
    for frame in frames:
        name = frame.filename
        if frame.name == "forward" and name.endswith(".py") and not _LIBRARY.search(name):
            return frame
    return None


def _where(frame: Frame) -> str:
    short = frame.filename.replace("\\", "/").rsplit("/", 2)
    return f"{'/'.join(short[-2:])}:{frame.line} ({frame.name})"


def _size_class(nbytes: int) -> str:
    if nbytes <= K_SMALL_SIZE:
        return "<= 1 MiB (small pool)"
    for limit, text in (
        (10 * MiB, "1-10 MiB"),
        (100 * MiB, "10-100 MiB"),
        (1024 * MiB, "100 MiB-1 GiB"),
    ):
        if nbytes <= limit:
            return text
    return "> 1 GiB"


# --- the walk ------------------------------------------------------------------------------------


@dataclass
class _Live:
    size: int
    stream: int
    stack: int


class _Walk:
    """Live blocks event by event (sizes rounded to 512 B, as the allocator's blocks)."""

    def __init__(self, dev: DeviceSnapshot, start: StartState) -> None:
        self.dev = dev
        allocated_in_trace = {e.addr for e in dev.trace if e.action == "alloc"}
        end_stacks = {b.address: b.stack for s in dev.segments for b in s.blocks if b.live}
        self.live: dict[int, _Live] = {}
        for address, size, stream in start.blocks:
            stack = end_stacks.get(address, -1) if address not in allocated_in_trace else -1
            self.live[address] = _Live(size, stream, stack)
        self.allocated = sum(b.size for b in self.live.values())
        self.index = 0

    def advance(self, stop: int) -> None:
        trace = self.dev.trace
        while self.index < stop:
            event = trace[self.index]
            if event.action == "alloc" and event.size:
                size = round_size(event.size)
                self.live[event.addr] = _Live(size, event.stream, event.stack)
                self.allocated += size
            elif event.action == "free_completed" and event.size:
                gone = self.live.pop(event.addr, None)
                if gone is not None:
                    self.allocated -= gone.size
            self.index += 1


def _allocated_curve(dev: DeviceSnapshot, start: StartState) -> list[int]:
    walk = _Walk(dev, start)
    out = []
    for i in range(len(dev.trace)):
        walk.advance(i + 1)
        out.append(walk.allocated)
    return out


# --- grouping ------------------------------------------------------------------------------------


def _site_name(dev: DeviceSnapshot, stack: int, cache: dict[int, str]) -> str:
    got = cache.get(stack)
    if got is None:
        if stack < 0:
            got = "(allocated before the recording started)"
        else:
            frame = _user_frame(dev.stack_frames(stack))
            got = _where(frame) if frame is not None else "(inside torch: no user frame)"
        cache[stack] = got
    return got


def _module_name(dev: DeviceSnapshot, stack: int) -> str:
    if stack < 0:
        return "(unknown)"
    frame = _module_frame(dev.stack_frames(stack))
    return _where(frame) if frame is not None else "(outside any forward)"


def _group(by: str, items: Mapping[str, tuple[int, int]]) -> Group:
    rows = sorted(items.items(), key=lambda kv: (-kv[1][0], kv[0]))
    top = tuple(Site(name, b, c) for name, (b, c) in rows[:TOP])
    rest = rows[TOP:]
    return Group(by, top, sum(b for _, (b, _c) in rest), sum(c for _, (_b, c) in rest))


def _groups(dev: DeviceSnapshot, live: Mapping[int, _Live]) -> tuple[Group, ...]:
    def tally(key_of: Any) -> dict[str, tuple[int, int]]:
        out: dict[str, list[int]] = {}
        for block in live.values():
            slot = out.setdefault(key_of(block), [0, 0])
            slot[0] += block.size
            slot[1] += 1
        return {k: (v[0], v[1]) for k, v in out.items()}

    cache: dict[int, str] = {}
    groups = []
    if dev.has_frames:
        groups.append(_group("site", tally(lambda b: _site_name(dev, b.stack, cache))))
        modules = tally(lambda b: _module_name(dev, b.stack))
        if any(not k.startswith("(") for k in modules):
            groups.append(_group("module", modules))
    groups.append(_group("stream", tally(lambda b: f"stream {b.stream}")))
    groups.append(_group("size", tally(lambda b: format_bytes(b.size))))
    groups.append(_group("size_class", tally(lambda b: _size_class(b.size))))
    return tuple(groups)


# --- steps and leaks -----------------------------------------------------------------------------


def _step_starts(
    dev: DeviceSnapshot, allocated: Sequence[int] = (), first_allocated: int = 0
) -> list[int]:
    """Indices where each repetition of the step starts, or ``[]``.

    A key is an allocation's (size, stack). A key marks steps when its occurrences are
    spread evenly (every gap within half and twice the median gap) and the trace before the
    first and after the last is no longer than two gaps (a layer's allocations repeat evenly
    too, but the backward pass after the last layer is far longer than a layer). The number
    of steps is the most common count among such keys (more on a tie); the steps start at
    the occurrences of the earliest key with that count.
    """
    positions: dict[tuple[int, int], list[int]] = {}
    for i, event in enumerate(dev.trace):
        if event.action == "alloc":
            positions.setdefault((event.size, event.stack), []).append(i)
    n = len(dev.trace)
    passing: list[list[int]] = []
    for found in positions.values():
        if len(found) < 2:
            continue
        gaps = sorted(b - a for a, b in itertools.pairwise(found))
        median = gaps[len(gaps) // 2]
        if median <= 0 or not all(median / 2 <= g <= median * 2 for g in gaps):
            continue
        if found[0] > 2 * median or n - found[-1] > 2 * median:
            continue
        passing.append(found)
    if not passing:
        return []
    counts = Counter(len(p) for p in passing)
    best = max(counts.items(), key=lambda kv: (kv[1], kv[0]))[0]
    found = min((p for p in passing if len(p) == best), key=lambda p: p[0])
    if allocated and _grows_like_layers(found, allocated, first_allocated):
        return []
    return found


def _grows_like_layers(starts: Sequence[int], allocated: Sequence[int], first: int) -> bool:
    """Whether the live bytes at the repetitions' starts grow by more than half of what one
    repetition takes and gives back (its swing): the layers of one forward pass, whose saved
    activations stay, not steps, whose temporaries go."""
    at = [allocated[i - 1] if i else first for i in starts]
    bounds = [*starts, len(allocated)]
    swings = sorted(
        max(allocated[a:b]) - (allocated[a - 1] if a else first)
        for a, b in itertools.pairwise(bounds)
        if b > a
    )
    swing = swings[len(swings) // 2] if swings else 0
    growth = (at[-1] - at[0]) / (len(at) - 1)
    return swing <= 0 or growth > swing / 2


def _leaks(dev: DeviceSnapshot, start: StartState, starts: Sequence[int]) -> tuple[Leak, ...]:
    if len(starts) < 3:
        return ()
    walk = _Walk(dev, start)
    cache: dict[int, str] = {}
    series: list[dict[str, int]] = []
    for boundary in starts:
        walk.advance(boundary)
        tally: dict[str, int] = {}
        for block in walk.live.values():
            name = (
                _site_name(dev, block.stack, cache)
                if dev.has_frames
                else f"blocks of {format_bytes(block.size)}"
            )
            tally[name] = tally.get(name, 0) + block.size
        series.append(tally)
    out = []
    for name in set().union(*series):
        values = [s.get(name, 0) for s in series]
        steps = list(itertools.pairwise(values))
        growth = values[-1] - values[0]
        # It grows in every repetition after the first (the first may be a warm-up: an
        # optimizer's state, a cache filled once), in two at least, and never falls.
        if (
            growth > 0
            and all(b >= a for a, b in steps)
            and all(b > a for a, b in steps[1:])
            and sum(b > a for a, b in steps) >= 2
        ):
            out.append(Leak(name, growth // (len(values) - 1), tuple(values)))
    out.sort(key=lambda leak: (-leak.growth_per_step_bytes, leak.site))
    return tuple(out[:TOP])


# --- the explanation -----------------------------------------------------------------------------


def _resolve(source: str | Path | Mapping[str, Any] | Snapshot, max_bytes: int | None) -> Snapshot:
    if isinstance(source, Snapshot):
        return source
    if isinstance(source, Mapping):
        return snapshot_from_data(dict(source), source="<data>")
    if max_bytes is not None:
        return load_snapshot(source, max_bytes=max_bytes)
    return load_snapshot(source)


def _device(snapshot: Snapshot, device: int | None) -> DeviceSnapshot:
    if not snapshot.devices:
        raise ConfigError(
            "the snapshot holds no segment and no trace (nothing was allocated on the GPU "
            "while it was taken)",
            key_path=snapshot.source,
            hint=RECORD_HINT,
        )
    dev = snapshot.device(device)
    if not dev.trace:
        if any(d.trace for d in snapshot.devices):
            what = f"device {dev.device} has no trace (another device has one: pass --device)"
        elif snapshot.has_traces:
            what = (
                "the allocator trace is empty: memory history was not being recorded (or "
                "nothing was allocated or freed while it was)"
            )
        else:
            what = "the snapshot has no allocator trace, only the segments at the end"
        raise ConfigError(what, key_path=snapshot.source, hint=RECORD_HINT)
    return dev


def _peak(curve: Sequence[int], first: int) -> Peak:
    best, at = first, -1
    for i, value in enumerate(curve):
        if value > best:
            best, at = value, i
    return Peak(best, at)


def _point(at: str | int, dev: DeviceSnapshot, peak: Peak, ooms: list[int]) -> tuple[str, int, int]:
    """``(at, event index, events applied)``."""
    n = len(dev.trace)
    if isinstance(at, int) and not isinstance(at, bool):
        if not 0 <= at < n:
            raise ConfigError(
                f"--at {at} is outside the trace (events 0 to {n - 1})",
                key_path="--at",
                hint="pass oom, peak, end or an event index the trace has",
            )
        return str(at), at, at + 1
    if at == "auto":
        at = "oom" if ooms else "peak"
    if at == "oom":
        if not ooms:
            raise ConfigError(
                "the trace records no out-of-memory error",
                key_path="--at",
                hint="use --at peak (the default without an OOM), end or an event index",
            )
        return "oom", ooms[0], ooms[0]
    if at == "peak":
        if peak.event < 0:  # already at the first event
            return "peak", 0, 0
        index = peak.event
        # A new segment is recorded just before the request it is for: look after that one.
        while index + 1 < n and dev.trace[index].action in ("segment_alloc", "segment_free"):
            index += 1
        return "peak", index, index + 1
    if at == "end":
        return "end", n - 1, n
    raise ConfigError(
        f"--at {at!r} is not oom, peak, end or an event index",
        key_path="--at",
        hint="pass oom, peak, end or an event index",
    )


def _thin(
    reserved: Sequence[int], allocated: Sequence[int], points: int = 2000
) -> tuple[tuple[int, int, int], ...]:
    """Every event for short traces; else per bucket the first event and the events of the
    bucket's highest reserved and highest allocated (so no peak is lost)."""
    n = len(reserved)
    if n <= points:
        return tuple((i, reserved[i], allocated[i]) for i in range(n))
    width = -(-n // (points // 3))
    out: list[tuple[int, int, int]] = []
    for lo in range(0, n, width):
        hi = min(n, lo + width)
        keep = {lo, hi - 1}
        keep.add(max(range(lo, hi), key=reserved.__getitem__))
        keep.add(max(range(lo, hi), key=allocated.__getitem__))
        out.extend((i, reserved[i], allocated[i]) for i in sorted(keep))
    return tuple(out)


def explain(
    snapshot: str | Path | Mapping[str, Any] | Snapshot,
    *,
    at: str | int = "auto",
    device: int | None = None,
    capacity_bytes: int | None = None,
    max_bytes: int | None = None,
) -> Explanation:
    """Explain a CUDA memory snapshot (see the module docstring).

    Args:
        snapshot: A path (pickle, JSON, gzip), the snapshot's data (``_snapshot()``'s dict),
            or a :class:`~memfit.allocator.snapshot.Snapshot`.
        at: ``"auto"`` (the OOM if there is one, else the peak), ``"oom"``, ``"peak"``,
            ``"end"``, or an event index: the point whose live blocks are grouped.
        device: The device to explain (default: the one with an OOM, else the longest trace).
        capacity_bytes: What the process may hold on the device, for the what-if replays
            (default: at an OOM the allocator's reserved plus the driver's free memory, else
            the limit the trace met, else unknown).
        max_bytes: Refuse a larger file (default
            :data:`memfit.allocator.snapshot.MAX_SNAPSHOT_BYTES`).

    Raises:
        ConfigError: For a file that is not a snapshot, names a Python object, is cut off,
            has no trace or an empty one, or an ``at`` the trace does not have; for an
            argument of the wrong type (named).
    """
    if not isinstance(snapshot, (Mapping, Snapshot)):
        require("snapshot", snapshot, "path")
    require("at", at, "str", "int")
    require("device", device, "int", optional=True)
    require("capacity_bytes", capacity_bytes, "int", optional=True)
    require("max_bytes", max_bytes, "int", optional=True)
    snap = _resolve(snapshot, max_bytes)
    dev = _device(snap, device)
    notes: list[str] = []
    start = start_state(dev)
    if start.reserved_bytes:
        notes.append(
            f"recorded mid-run: {format_bytes(start.reserved_bytes)} reserved and "
            f"{format_bytes(start.allocated_bytes)} in {start.live_blocks} blocks live at the "
            "first event (rebuilt from the final segments and the trace)"
        )
    trace = dev.trace
    recorded = recorded_curve(dev, start)
    allocated = _allocated_curve(dev, start)
    peak_r = _peak(recorded, start.reserved_bytes)
    peak_a = _peak(allocated, start.allocated_bytes)
    ooms = [i for i, e in enumerate(trace) if e.action == "oom"]
    at_name, at_event, applied = _point(at, dev, peak_r, ooms)
    limit = implied_limit(dev, start)
    if not limit.consistent:
        notes.append(
            "no single memory limit explains when the allocator gave segments back (other "
            "processes' use changed during the recording)"
        )
    settings = {
        "max_split_size": snap.max_split_size,
        "expandable_segments": snap.expandable_segments,
    }
    gc = snap.settings.get("garbage_collection_threshold")
    gc_threshold = float(gc) if isinstance(gc, int | float) and 0 < gc < 1 else None
    cache_calls = empty_cache_points(dev, start)
    baseline = replay(
        dev,
        start=start,
        limit_bytes=limit.bytes,
        max_split_size=settings["max_split_size"],
        expandable_segments=bool(settings["expandable_segments"]),
        garbage_collection_threshold=gc_threshold,
        empty_cache_at=cache_calls,
        recorded_empty_cache=False,
        inspect_at=[applied, *ooms[:1]],
    )
    # Compared where the allocator is settled: after each request, free and OOM (inside a
    # request, the trace shows the segments it gives back before the request itself).
    off = max(
        (
            abs(recorded[i] - baseline.reserved[i])
            for i, e in enumerate(trace)
            if e.action in ("alloc", "free_completed", "oom")
        ),
        default=0,
    )
    if not start.exact:
        notes.append(
            "recorded with expandable segments: the replays start from the blocks live at the "
            "first event, not from the recorded pages, so they are approximate"
        )
    elif off:
        notes.append(
            f"the replay with the recorded settings is up to {format_bytes(off)} off the "
            "recorded reserved bytes"
        )
    # The state at the point.
    walk = _Walk(dev, start)
    walk.advance(applied)
    reserved_now = recorded[applied - 1] if applied else start.reserved_bytes
    state = baseline.inspected[applied]
    request: int | None = None
    event = trace[at_event]
    if at_name == "oom" or (event.action == "alloc" and applied == at_event + 1):
        request = round_size(event.size)
    frag = _fragmentation(dev, state, walk, reserved_now, request, event.stream)
    oom: OomInfo | None = None
    capacity = capacity_bytes
    if ooms:
        first = trace[ooms[0]]
        before = recorded[ooms[0] - 1] if ooms[0] else start.reserved_bytes
        oom_walk = _Walk(dev, start)
        oom_walk.advance(ooms[0])
        oom_capacity = before + first.device_free if first.device_free is not None else None
        if capacity is None:
            capacity = oom_capacity
        largest = max((b[1] for b in baseline.inspected[ooms[0]].free), default=0)
        oom = OomInfo(
            event=ooms[0],
            requested_bytes=first.size,
            device_free_bytes=first.device_free,
            reserved_bytes=before,
            allocated_bytes=oom_walk.allocated,
            largest_free_block_bytes=largest,
            capacity_bytes=oom_capacity,
        )
    if capacity is None:
        capacity = limit.bytes
    starts = _step_starts(dev, allocated, start.allocated_bytes)
    what_if = _what_ifs(
        dev,
        start,
        settings,
        gc_threshold,
        capacity,
        starts,
        peak_r.bytes,
        off == 0 and start.exact,
        cache_calls,
    )
    groups = _groups(dev, walk.live)
    if not dev.has_frames:
        notes.append(
            "the snapshot has no stack frames: blocks are grouped by stream and size "
            "(record with _record_memory_history(stacks='python') to see where they came from)"
        )
    recommendation, evidence, shrink = _recommend(
        what_if, oom, capacity, peak_r.bytes, groups, walk.allocated
    )
    return Explanation(
        source=snap.source,
        device=dev.device,
        events=len(trace),
        frees=sum(e.action == "free_completed" for e in trace),
        has_frames=dev.has_frames,
        at=at_name,
        at_event=at_event,
        peak_reserved_bytes=peak_r.bytes,
        peak_reserved_event=peak_r.event,
        peak_allocated_bytes=peak_a.bytes,
        peak_allocated_event=peak_a.event,
        start_reserved_bytes=start.reserved_bytes,
        start_allocated_bytes=start.allocated_bytes,
        reserved_bytes=reserved_now,
        allocated_bytes=walk.allocated,
        replay_exact=off == 0 and start.exact,
        replay_bytes_off=off,
        capacity_bytes=capacity,
        oom=oom,
        groups=groups,
        fragmentation=frag,
        what_if=what_if,
        recommendation=recommendation,
        evidence=evidence,
        must_shrink_bytes=shrink,
        steps=len(starts),
        leaks=_leaks(dev, start, starts),
        unknowns=UNKNOWNS
        + (
            (
                "how the blocks live at the first event would have been laid out under "
                "other settings (the expandable-segments replay allocates them first, in "
                "address order)",
            )
            if start.live_blocks
            else ()
        ),
        notes=tuple(notes),
        timeline=_thin(recorded, allocated),
    )


def _fragmentation(
    dev: DeviceSnapshot,
    state: ModelState,
    walk: _Walk,
    reserved: int,
    request: int | None,
    stream: int,
) -> Fragmentation:
    free = state.free
    whole = sum(b[1] for b in free if b[4])
    split = sum(b[1] for b in free if not b[4])
    small = request is not None and request <= K_SMALL_SIZE
    too_small = (
        sum(b[1] for b in free if b[3] == small and b[2] == stream and b[1] < request)
        if request is not None
        else 0
    )
    # Free bytes of each split segment, shared among the sites of its live blocks.
    split_free: dict[int, int] = {}
    for b in free:
        if not b[4]:
            split_free[b[5]] = split_free.get(b[5], 0) + b[1]
    per_segment: dict[int, list[tuple[int, int]]] = {}
    for address, size, segment in state.live:
        if segment in split_free:
            per_segment.setdefault(segment, []).append((address, size))
    cache: dict[int, str] = {}
    blame: dict[str, list[int]] = {}
    for segment, blocks in per_segment.items():
        total = sum(size for _, size in blocks) or 1
        for address, size in blocks:
            live = walk.live.get(address)
            if dev.has_frames and live is not None:
                name = _site_name(dev, live.stack, cache)
            else:
                name = format_bytes(size)
            slot = blame.setdefault(name, [0, 0])
            slot[0] += split_free[segment] * size // total
            slot[1] += 1
    split_by = tuple(
        Site(n, v[0], v[1])
        for n, v in sorted(blame.items(), key=lambda kv: (-kv[1][0], kv[0]))[:TOP]
    )
    return Fragmentation(
        cached_bytes=reserved - walk.allocated,
        whole_segment_bytes=whole,
        split_bytes=split,
        too_small_bytes=too_small,
        largest_free_block_bytes=max((b[1] for b in free), default=0),
        request_bytes=request,
        split_by=split_by,
    )


def _what_ifs(
    dev: DeviceSnapshot,
    start: StartState,
    settings: Mapping[str, Any],
    gc_threshold: float | None,
    capacity: int | None,
    steps: Sequence[int],
    recorded_peak: int,
    exact: bool,
    cache_calls: Sequence[int],
) -> tuple[WhatIf, ...]:
    base_split = settings["max_split_size"]
    base_expandable = bool(settings["expandable_segments"])
    trials: list[tuple[str, str, dict[str, Any]]] = [("as recorded", "(the recorded settings)", {})]
    if not base_expandable:
        trials.append(
            ("expandable_segments", "expandable_segments:True", {"expandable_segments": True})
        )
    for mb in SPLIT_SIZES_MB:
        trials.append(
            (f"max_split_size_mb={mb}", f"max_split_size_mb:{mb}", {"max_split_size": mb * MiB})
        )
    if capacity is not None:
        for fraction in GC_THRESHOLDS:
            trials.append(
                (
                    f"garbage_collection_threshold={fraction}",
                    f"garbage_collection_threshold:{fraction} (with a memory fraction set)",
                    {"garbage_collection_threshold": fraction},
                )
            )
    if len(steps) >= 2:
        trials.append(
            (
                "empty_cache each step",
                "torch.cuda.empty_cache() at each step's start (before events "
                + ", ".join(str(i) for i in steps[1:6])
                + (", ..." if len(steps) > 6 else "")
                + ")",
                {"empty_cache_at": steps[1:]},
            )
        )
    out = []
    for name, setting, change in trials:
        kwargs: dict[str, Any] = {
            "expandable_segments": base_expandable,
            "max_split_size": base_split,
            "garbage_collection_threshold": gc_threshold,
        }
        kwargs.update(change)
        extra = list(kwargs.pop("empty_cache_at", ()))
        curve = replay(
            dev,
            start=start,
            limit_bytes=capacity,
            exact_addresses=not change,
            empty_cache_at=[*cache_calls, *extra],
            recorded_empty_cache=False,
            **kwargs,
        )
        peak = curve.peak_reserved
        if not change and exact:
            peak = recorded_peak
        failed = len(curve.failed) + sum(not ok for ok in curve.oom_fits)
        if capacity is None:
            fits: bool | None = None
        else:
            fits = failed == 0 and peak <= capacity
        out.append(WhatIf(name, setting, peak, fits, failed))
    return tuple(out)


def _top_sites(groups: Sequence[Group]) -> str:
    group = next((g for g in groups if g.by == "site"), None) or next(
        (g for g in groups if g.by == "size"), None
    )
    if group is None or not group.rows:
        return "nothing is live"
    prefix = "blocks of " if group.by == "size" else ""
    return "; ".join(
        f"{prefix}{r.name}: {format_bytes(r.bytes)} in {r.count}" for r in group.rows[:3]
    )


def _recommend(
    what_if: Sequence[WhatIf],
    oom: OomInfo | None,
    capacity: int | None,
    peak: int,
    groups: Sequence[Group],
    allocated_now: int,
) -> tuple[str, str, int | None]:
    baseline = what_if[0]
    others = [w for w in what_if[1:]]
    if oom is not None:
        cured = [w for w in others if w.fits]
        if cured:
            best = min(cured, key=lambda w: (w.peak_reserved_bytes, others.index(w)))
            return (
                f"set PYTORCH_CUDA_ALLOC_CONF={best.setting}"
                if not best.setting.startswith("torch.")
                else f"call {best.setting}",
                f"replayed with it, the failed request of {format_bytes(oom.requested_bytes)} "
                f"fits: reserved peak {format_bytes(best.peak_reserved_bytes)} under the "
                f"{format_bytes(capacity or 0)} the process could hold, where the recorded "
                f"run failed",
                None,
            )
        need = allocated_now + round_size(oom.requested_bytes)
        shrink = max(0, need - capacity) if capacity is not None else None
        text = "no allocator setting helps: the live tensors themselves do not fit"
        if shrink:
            text += f"; shrink them by at least {format_bytes(shrink)}"
        return (
            text,
            f"no replayed setting fits the failed request of {format_bytes(oom.requested_bytes)}"
            f" ({format_bytes(allocated_now)} live at the OOM); largest live sites: "
            f"{_top_sites(groups)}",
            shrink,
        )
    pick = min(others, key=lambda w: (w.peak_reserved_bytes, others.index(w)), default=None)
    saving = baseline.peak_reserved_bytes - pick.peak_reserved_bytes if pick else 0
    if (
        pick is not None
        and saving >= max(_MIN_SAVING, int(peak * _MIN_SAVING_FRACTION))
        and pick.fits is not False
    ):
        return (
            f"set PYTORCH_CUDA_ALLOC_CONF={pick.setting}"
            if not pick.setting.startswith("torch.")
            else f"call {pick.setting}",
            f"replayed with it, the reserved peak is {format_bytes(pick.peak_reserved_bytes)} "
            f"instead of {format_bytes(baseline.peak_reserved_bytes)} "
            f"({format_bytes(saving)} less)",
            None,
        )
    return (
        "no allocator setting lowers the peak much: the peak is live tensors",
        f"the best replayed setting saves {format_bytes(max(saving, 0))} of "
        f"{format_bytes(baseline.peak_reserved_bytes)}; to go lower, shrink the largest live "
        f"sites: {_top_sites(groups)}",
        None,
    )


# --- rendering -----------------------------------------------------------------------------------


def _when(event: int) -> str:
    return "at the first event" if event < 0 else f"after event {event}"


def render_text(e: Explanation) -> list[str]:
    """The explanation as lines of plain text (the CLI prints them)."""
    fb = format_bytes
    lines = [
        f"{e.source}: device {e.device}, {e.events} events, {e.frees} frees"
        + ("" if e.has_frames else ", no stack frames"),
        "",
        "1. Peaks",
        f"  reserved peak   {fb(e.peak_reserved_bytes)} ({_when(e.peak_reserved_event)})",
        f"  allocated peak  {fb(e.peak_allocated_bytes)} ({_when(e.peak_allocated_event)})",
    ]
    if e.start_reserved_bytes:
        lines.append(
            f"  at the first event: {fb(e.start_reserved_bytes)} reserved, "
            f"{fb(e.start_allocated_bytes)} allocated (recorded mid-run)"
        )
    lines.append(
        "  replay of the trace: "
        + (
            "exact (every reserved byte as recorded)"
            if e.replay_exact
            else f"up to {fb(e.replay_bytes_off)} off"
        )
    )
    if e.oom is not None:
        o = e.oom
        free = fb(o.device_free_bytes) if o.device_free_bytes is not None else "not recorded"
        lines += [
            f"  OUT OF MEMORY at event {o.event}: a request of {fb(o.requested_bytes)} failed",
            f"    driver's free memory {free}, "
            f"reserved {fb(o.reserved_bytes)}, allocated {fb(o.allocated_bytes)}, "
            f"largest free cached block {fb(o.largest_free_block_bytes)}",
        ]
    where = {"oom": "at the OOM", "peak": "at the peak", "end": "at the end"}.get(
        e.at, f"after event {e.at}"
    )
    lines += [
        "",
        f"2. Where the memory was {where} (event {e.at_event}): {fb(e.allocated_bytes)} live "
        f"of {fb(e.reserved_bytes)} reserved",
    ]
    for group in e.groups:
        lines.append(f"  by {group.by.replace('_', ' ')}:")
        for row in group.rows:
            lines.append(f"    {fb(row.bytes):>12}  {row.count:>6}  {row.name}")
        if group.other_count:
            lines.append(f"    {fb(group.other_bytes):>12}  {group.other_count:>6}  (the rest)")
    f = e.fragmentation
    lines += [
        "",
        "3. Fragmentation",
        f"  cached (reserved - allocated) {fb(f.cached_bytes)}: {fb(f.whole_segment_bytes)} in "
        f"free segments, {fb(f.split_bytes)} in segments live blocks keep split",
        f"  largest free block {fb(f.largest_free_block_bytes)}"
        + (
            f"; request {fb(f.request_bytes)}, {fb(f.too_small_bytes)} in free blocks too "
            "small for it"
            if f.request_bytes is not None
            else ""
        ),
    ]
    if f.split_by:
        lines.append("  keeping segments split:")
        for row in f.split_by[:5]:
            lines.append(f"    {fb(row.bytes):>12} free beside {row.count} blocks of {row.name}")
    lines += ["", "4. What if (the same requests replayed)"]
    cap = f" under {fb(e.capacity_bytes)}" if e.capacity_bytes is not None else ""
    for w in e.what_if:
        fits = "" if w.fits is None else ("  fits" + cap if w.fits else f"  does not fit{cap}")
        lines.append(f"  {w.name:<38} peak {fb(w.peak_reserved_bytes):>12}{fits}")
    lines += [f"  => {e.recommendation}", f"     {e.evidence}"]
    lines.append("  the replay cannot know: " + "; ".join(e.unknowns))
    lines += ["", "5. Leaks"]
    if e.steps < 3:
        lines.append(f"  {e.steps} repetitions of a step found: too few to tell growth")
    elif not e.leaks:
        lines.append(f"  none: no site grows over the {e.steps} repetitions of the step")
    for leak in e.leaks:
        lines.append(
            f"  {leak.site}: +{fb(leak.growth_per_step_bytes)} per step over {e.steps} steps"
        )
    if e.notes:
        lines += ["", "Notes"] + [f"  {n}" for n in e.notes]
    return lines


def _figure(e: Explanation) -> Any:
    """The timeline, drawn as ``memfit report`` draws a run (Agg canvas, MiB, its colours)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        from memfit.errors import BackendUnavailable

        raise BackendUnavailable(
            "memfit explain draws with matplotlib, which is not installed",
            hint="pip install 'memfit[plot]', or leave out -o",
        ) from exc
    from memfit.monitor.report import EVENT_COLOURS, _mib_ticks

    fig = Figure(figsize=(10, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    xs = [t[0] for t in e.timeline]
    reserved = [t[1] / MiB for t in e.timeline]
    ax.plot(xs, reserved, color="#ff7f0e", label="reserved", linewidth=1.2)
    ax.plot(xs, [t[2] / MiB for t in e.timeline], color="#1f77b4", label="allocated", linewidth=1)
    peak_x = max(e.peak_reserved_event, 0)
    ax.axvline(peak_x, color="#7f7f7f", linestyle=":", linewidth=1)
    ax.annotate(
        f"peak {format_bytes(e.peak_reserved_bytes)}",
        (peak_x, e.peak_reserved_bytes / MiB),
        textcoords="offset points",
        xytext=(6, -12),
        fontsize=8,
    )
    if e.oom is not None:
        ax.plot(
            [e.oom.event],
            [e.oom.reserved_bytes / MiB],
            marker="X",
            color=EVENT_COLOURS["oom"],
            markersize=10,
            linestyle="none",
            label="out of memory",
        )
    if e.capacity_bytes is not None and e.capacity_bytes <= 1.5 * e.peak_reserved_bytes:
        ax.axhline(
            e.capacity_bytes / MiB,
            color=EVENT_COLOURS["oom"],
            linestyle="--",
            linewidth=1,
            label="capacity",
        )
    group = e.group("site") or e.group("size")
    if group is not None and group.rows:
        prefix = "blocks of " if group.by == "size" else ""
        text = "\n".join(
            f"{format_bytes(r.bytes):>10}  {prefix}{r.name[:60]}" for r in group.rows[:5]
        )
        ax.text(
            0.01,
            0.98,
            f"live at the {e.at if not e.at.isdigit() else 'event ' + e.at}:\n{text}",
            transform=ax.transAxes,
            fontsize=7,
            va="top",
            family="monospace",
            bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "#cccccc"},
        )
    ax.set_xlabel("trace event")
    ax.set_ylabel("MiB")
    top = max(reserved, default=0.0)
    ax.set_ylim(bottom=0, top=max(top * 1.25, 1.0))
    _mib_ticks(ax, top)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(f"{Path(e.source).name}: device {e.device}", fontsize=10)
    fig.tight_layout()
    return fig


def png_bytes(e: Explanation) -> bytes:
    """The timeline as PNG bytes (matplotlib, Agg)."""
    buffer = io.BytesIO()
    _figure(e).savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def render_html(e: Explanation) -> str:
    """One self-contained HTML page: the timeline (embedded PNG) and the text report."""
    image = base64.b64encode(png_bytes(e)).decode("ascii")
    body = html.escape("\n".join(render_text(e)))
    title = html.escape(f"memfit explain: {Path(e.source).name}")
    return (
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
        f"<title>{title}</title>"
        "<style>body{font-family:sans-serif;margin:2em}pre{font-size:13px}</style></head>"
        f"<body><h1>{title}</h1>"
        f"<img alt='allocated and reserved over the trace' src='data:image/png;base64,{image}'>"
        f"<pre>{body}</pre></body></html>\n"
    )
