"""What ``memfit explain`` advises: fragmentation at the chosen point, the same requests
replayed under other allocator settings (what if), and the one recommendation drawn from them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from memfit.allocator.model import K_SMALL_SIZE, round_size
from memfit.allocator.replay import (
    ModelState,
    StartState,
    replay,
)
from memfit.allocator.snapshot import (
    SnapshotDevice,
)
from memfit.monitor._trace_walk import TraceWalk, site_name
from memfit.monitor.explanation import (
    GC_THRESHOLDS,
    SPLIT_SIZES_MB,
    TOP,
    Fragmentation,
    Group,
    OomInfo,
    Site,
    WhatIf,
)
from memfit.units import MiB, format_bytes

#: A setting is recommended without an OOM only when it lowers the reserved peak by at least
#: this fraction and :data:`_MIN_SAVING` bytes.
_MIN_SAVING_FRACTION = 0.02


_MIN_SAVING = 64 * MiB


def fragmentation(
    dev: SnapshotDevice,
    state: ModelState,
    walk: TraceWalk,
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
                name = site_name(dev, live.stack, cache)
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


def what_ifs(
    dev: SnapshotDevice,
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


def top_sites(groups: Sequence[Group]) -> str:
    group = next((g for g in groups if g.by == "site"), None) or next(
        (g for g in groups if g.by == "size"), None
    )
    if group is None or not group.rows:
        return "nothing is live"
    prefix = "blocks of " if group.by == "size" else ""
    return "; ".join(
        f"{prefix}{r.name}: {format_bytes(r.bytes)} in {r.count}" for r in group.rows[:3]
    )


def recommend(
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
            f"{top_sites(groups)}",
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
        f"sites: {top_sites(groups)}",
        None,
    )
