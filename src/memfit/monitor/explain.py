"""``memfit explain``: what a CUDA memory snapshot says about a run's peak or its OOM.

:func:`explain` reads a snapshot (``torch.cuda.memory._dump_snapshot()``, memfit's OOM dump,
or the same data as JSON) through :mod:`memfit.allocator.snapshot`, rebuilds the allocator's
state at the first recorded event and replays the trace through the allocator model
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
6. the timeline with the peak and the top sites (:mod:`memfit.monitor.explain_render`).

The result's types are in :mod:`memfit.monitor.explanation`, the advice (fragmentation, what
if, the recommendation) in :mod:`memfit.monitor.explain_advice`, the walk through the trace in
:mod:`memfit.monitor._trace_walk`.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from memfit._checks import parse_int, require, require_bytes
from memfit.allocator.model import round_size
from memfit.allocator.replay import (
    StartState,
    empty_cache_points,
    implied_limit,
    recorded_curve,
    replay,
    start_state,
)
from memfit.allocator.snapshot import (
    RECORD_HINT,
    Snapshot,
    SnapshotDevice,
    load_snapshot,
    snapshot_from_data,
)
from memfit.errors import ConfigError
from memfit.monitor._trace_walk import LiveBlock, TraceWalk, module_name, site_name, size_class
from memfit.monitor.explain_advice import fragmentation, recommend, what_ifs
from memfit.monitor.explanation import (
    TOP,
    UNKNOWNS,
    Explanation,
    Fragmentation,
    Group,
    GrowingSite,
    OomInfo,
    Peak,
    Site,
    WhatIf,
)
from memfit.units import format_bytes

__all__ = [
    "Explanation",
    "Fragmentation",
    "Group",
    "GrowingSite",
    "OomInfo",
    "Peak",
    "Site",
    "WhatIf",
    "explain",
]


# --- the walk ------------------------------------------------------------------------------------


def _allocated_curve(dev: SnapshotDevice, start: StartState) -> list[int]:
    walk = TraceWalk(dev, start)
    out = []
    for i in range(len(dev.trace)):
        walk.advance(i + 1)
        out.append(walk.allocated)
    return out


# --- grouping ------------------------------------------------------------------------------------


def _group(by: str, items: Mapping[str, tuple[int, int]]) -> Group:
    rows = sorted(items.items(), key=lambda kv: (-kv[1][0], kv[0]))
    top = tuple(Site(name, b, c) for name, (b, c) in rows[:TOP])
    rest = rows[TOP:]
    return Group(by, top, sum(b for _, (b, _c) in rest), sum(c for _, (_b, c) in rest))


def _groups(dev: SnapshotDevice, live: Mapping[int, LiveBlock]) -> tuple[Group, ...]:
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
        groups.append(_group("site", tally(lambda b: site_name(dev, b.stack, cache))))
        modules = tally(lambda b: module_name(dev, b.stack))
        if any(not k.startswith("(") for k in modules):
            groups.append(_group("module", modules))
    groups.append(_group("stream", tally(lambda b: f"stream {b.stream}")))
    groups.append(_group("size", tally(lambda b: format_bytes(b.size))))
    groups.append(_group("size_class", tally(lambda b: size_class(b.size))))
    return tuple(groups)


# --- steps and leaks -----------------------------------------------------------------------------


def _step_starts(
    dev: SnapshotDevice, allocated: Sequence[int] = (), first_allocated: int = 0
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


def _leaks(
    dev: SnapshotDevice, start: StartState, starts: Sequence[int]
) -> tuple[GrowingSite, ...]:
    if len(starts) < 3:
        return ()
    walk = TraceWalk(dev, start)
    cache: dict[int, str] = {}
    series: list[dict[str, int]] = []
    for boundary in starts:
        walk.advance(boundary)
        tally: dict[str, int] = {}
        for block in walk.live.values():
            name = (
                site_name(dev, block.stack, cache)
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
            out.append(GrowingSite(name, growth // (len(values) - 1), tuple(values)))
    out.sort(key=lambda leak: (-leak.growth_per_step_bytes, leak.site))
    return tuple(out[:TOP])


# --- the explanation -----------------------------------------------------------------------------


def _resolve(
    source: str | Path | Mapping[str, Any] | Snapshot,
    max_bytes: int | None,
    progress: Callable[[int, int], None] | None = None,
) -> Snapshot:
    if isinstance(source, Snapshot):
        return source
    if isinstance(source, Mapping):
        return snapshot_from_data(dict(source), source="<data>")
    if max_bytes is not None:
        return load_snapshot(source, max_bytes=max_bytes, progress=progress)
    return load_snapshot(source, progress=progress)


def _device(snapshot: Snapshot, device: int | None) -> SnapshotDevice:
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


def _simulated_card(snapshot: Snapshot) -> int | None:
    """The card's size of a snapshot ``memfit.simulate_gpu`` wrote (its budget), else ``None``."""
    meta = snapshot.meta
    budget = meta.get("budget_bytes")
    if meta.get("origin") != "memfit.simulate_gpu" or isinstance(budget, bool):
        return None
    return budget if isinstance(budget, int) and budget > 0 else None


def _peak(curve: Sequence[int], first: int) -> Peak:
    best, at = first, -1
    for i, value in enumerate(curve):
        if value > best:
            best, at = value, i
    return Peak(best, at)


def _point(at: str | int, dev: SnapshotDevice, peak: Peak, ooms: list[int]) -> tuple[str, int, int]:
    """``(at, event index, events applied)``."""
    n = len(dev.trace)
    if isinstance(at, str) and at.strip()[:1].isdigit():
        at = parse_int("--at", at, hint="pass oom, peak, end or an event index")
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
    progress: Callable[[int, int], None] | None = None,
) -> Explanation:
    """Explain a CUDA memory snapshot (see the module docstring).

    Args:
        snapshot: A path (pickle, JSON, gzip), the snapshot's data (``_snapshot()``'s dict),
            or a :class:`~memfit.allocator.snapshot.Snapshot`.
        at: ``"auto"`` (the OOM if there is one, else the peak), ``"oom"``, ``"peak"`` (the
            allocated peak: the most memory live), ``"end"``, or an event index: the point
            whose live blocks are grouped.
        device: The device to explain (default: the one with an OOM, else the longest trace).
        capacity_bytes: What the process may hold on the device, for the what-if replays
            (default: at an OOM the allocator's reserved plus the driver's free memory, else
            the limit the trace met, else unknown).
        max_bytes: Refuse a larger file (default
            :data:`memfit.allocator.snapshot.MAX_SNAPSHOT_BYTES`, 1 GiB; any size may be
            given).
        progress: ``progress(done, total)`` in bytes while a pickle is read (every 8 MiB),
            for a status line on long reads.

    Raises:
        ConfigError: For a file that is not a snapshot, names a Python object, is cut off,
            has no trace or an empty one, or an ``at`` the trace does not have; for an
            argument of the wrong type (named).
    """
    if not isinstance(snapshot, (Mapping, Snapshot)):
        require("snapshot", snapshot, "path")
    require("at", at, "str", "int")
    require("device", device, "int", optional=True)
    if device is not None and device < 0:
        raise ConfigError(
            f"device must be a device index (0 or more), not {device}", key_path="device"
        )
    if capacity_bytes is not None:
        require_bytes("capacity_bytes", capacity_bytes, lo=1, hint="what the process may hold")
    if max_bytes is not None:
        require_bytes("max_bytes", max_bytes, lo=1, hint="the largest file to read, e.g. 2**32")
    require("progress", progress, "callable", optional=True)
    snap = _resolve(snapshot, max_bytes, progress)
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
    # "peak" is where the most memory was live (the allocated peak): the breakdown of live
    # memory is about that moment, not the first event of the reserved plateau
    at_name, at_event, applied = _point(at, dev, peak_a, ooms)
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
    walk = TraceWalk(dev, start)
    walk.advance(applied)
    reserved_now = recorded[applied - 1] if applied else start.reserved_bytes
    state = baseline.inspected[applied]
    request: int | None = None
    event = trace[at_event]
    if at_name == "oom" or (event.action == "alloc" and applied == at_event + 1):
        request = round_size(event.size)
    frag = fragmentation(dev, state, walk, reserved_now, request, event.stream)
    oom: OomInfo | None = None
    capacity = capacity_bytes
    simulated = _simulated_card(snap)
    if simulated is not None:
        if capacity is None:
            capacity = simulated
        over = (
            f"; where they exceed the card ({format_bytes(peak_r.bytes)} here), a real card "
            "of that size fails sooner: the simulated one counts allocated bytes only"
            if peak_r.bytes > simulated
            else ""
        )
        notes.append(
            f"recorded under memfit.simulate_gpu: a card of {format_bytes(simulated)}; "
            f"segments and reserved bytes are memfit's allocator model's{over}"
        )
    if ooms:
        first = trace[ooms[0]]
        before = recorded[ooms[0] - 1] if ooms[0] else start.reserved_bytes
        oom_walk = TraceWalk(dev, start)
        oom_walk.advance(ooms[0])
        oom_capacity = before + first.device_free if first.device_free is not None else None
        if simulated is not None:
            oom_capacity = simulated  # the card's size, not reserved + free of the model
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
    what_if = what_ifs(
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
    recommendation, evidence, shrink = recommend(
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
        simulated=simulated is not None,
    )


# --- rendering -----------------------------------------------------------------------------------
