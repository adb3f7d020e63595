"""The replay machinery on snapshots recorded through the model itself (known answers)."""

from __future__ import annotations

import pytest

from memfit.allocator.model import AllocatorModel
from memfit.allocator.replay import (
    empty_cache_points,
    implied_limit,
    recorded_curve,
    replay,
    start_state,
)
from memfit.allocator.snapshot import snapshot_from_data
from memfit.allocator.snapshot_build import TraceBuilder
from memfit.errors import ConfigError, OutOfMemory

MiB = 2**20


def _busy_builder() -> TraceBuilder:
    """Two streams, a limit met twice, an empty_cache() call and an OOM."""
    b = TraceBuilder(limit_bytes=200 * MiB)
    keep = []
    for i in range(30):
        h = b.malloc((3 + i % 7) * MiB + 1000 * i, stream=i % 2)
        if i % 3:
            keep.append(h)
        else:
            b.free(h)
        if i == 10:
            b.empty_cache()
    big = b.malloc(60 * MiB)
    b.free(big)
    with pytest.raises(OutOfMemory):
        for _ in range(10):
            keep.append(b.malloc(45 * MiB))
    return b


def test_a_recorded_trace_replays_exactly_from_an_empty_start() -> None:
    snap = snapshot_from_data(_busy_builder().snapshot())
    dev = snap.device()
    start = start_state(dev)
    assert start.reserved_bytes == 0 and start.live_blocks == 0
    recorded = recorded_curve(dev, start)
    limit = implied_limit(dev, start)
    assert limit.high is not None and limit.consistent and limit.low <= 200 * MiB
    assert empty_cache_points(dev, start)  # the empty_cache() call is found
    got = replay(dev, start=start, limit_bytes=limit.bytes)
    for i, e in enumerate(dev.trace):
        if e.action in ("alloc", "free_completed", "oom"):
            assert got.reserved[i] == recorded[i], (i, e)
    assert got.oom_fits == [False]


def test_a_trace_cut_at_any_point_rebuilds_its_start() -> None:
    """Drop the first k events and the end's segments still explain the rest exactly."""
    data = _busy_builder().snapshot()
    events = data["device_traces"][0]
    for cut in (5, 17, 40, len(events) // 2):
        # A cut inside a request (segment events before its alloc) is not a state.
        while events[cut]["action"] in ("segment_free", "free_completed", "alloc"):
            cut += 1
        dev = snapshot_from_data({**data, "device_traces": [events[cut:]]}).device()
        start = start_state(dev)
        recorded = recorded_curve(dev, start)
        got = replay(dev, start=start, limit_bytes=implied_limit(dev, start).bytes)
        assert recorded[-1] == dev.reserved_bytes
        for i, e in enumerate(dev.trace):
            if e.action in ("alloc", "free_completed"):
                assert got.reserved[i] == recorded[i], (cut, i)


def test_a_trace_that_disagrees_with_its_segments_is_refused() -> None:
    data = _busy_builder().snapshot()
    events = data["device_traces"][0]
    first_alloc = next(i for i, e in enumerate(events) if e["action"] == "alloc")
    events.insert(first_alloc + 1, dict(events[first_alloc]))  # allocated twice
    with pytest.raises(ConfigError, match="does not agree"):
        start_state(snapshot_from_data(data).device())


def test_seeded_segments_and_real_addresses() -> None:
    m = AllocatorModel()
    handles = m.add_segment(1 << 40, 20 * MiB, live=[((1 << 40) + 4 * MiB, 4 * MiB)])
    assert m.reserved_bytes == 20 * MiB and m.allocated_bytes == 4 * MiB
    h = m.malloc(3 * MiB)  # best fit: the 4 MiB hole before the live block? it is 4 MiB
    assert m.address_of(h) == 1 << 40
    g = m.malloc(30 * MiB, segment_address=5 << 40)
    assert m.address_of(g) == 5 << 40
    m.free(handles[0])
    assert [s[0] for s in m.segments()] == [1 << 40, 5 << 40]
    with pytest.raises(ConfigError, match="does not fit"):
        m.add_segment(0, 2 * MiB, live=[(MiB, 2 * MiB)])


def test_garbage_collection_gives_back_old_cached_segments() -> None:
    def run(gc: float | None) -> AllocatorModel:
        m = AllocatorModel(limit_bytes=100 * MiB, garbage_collection_threshold=gc)
        old = [m.malloc(12 * MiB) for _ in range(4)]  # four 12 MiB segments
        for h in old:
            m.free(h)
        for _ in range(5):
            m.free(m.malloc(12 * MiB))  # best fit reuses one; the other three age
        m.malloc(40 * MiB)  # 48 reserved <= 50: no collection yet, a new segment
        assert m.reserved_bytes == 88 * MiB
        m.malloc(30 * MiB)  # 88 + 30 > 100
        return m

    without, with_gc = run(None), run(0.5)
    # Without: the attempt fails at the limit, then every cached segment goes (one retry).
    assert without.num_alloc_retries == 1 and without.num_segment_frees == 4
    # With: above half the limit the old cached segments go before any attempt.
    assert with_gc.num_alloc_retries == 0 and with_gc.num_segment_frees == 4
    assert with_gc.reserved_bytes == 70 * MiB
    with pytest.raises(ConfigError, match="between 0 and 1"):
        AllocatorModel(garbage_collection_threshold=1.5)


def test_garbage_collection_leaves_expandable_segments_alone() -> None:
    m = AllocatorModel(
        expandable_segments=True, limit_bytes=100 * MiB, garbage_collection_threshold=0.5
    )
    a = m.malloc(50 * MiB)
    m.free(a)
    m.malloc(70 * MiB)  # grows the one segment; no collection of its free tail
    assert m.reserved_bytes == 80 * MiB


def test_expandable_segments_unmap_free_pages_inside_and_map_them_again() -> None:
    """PyTorch's ``release_blocks`` unmaps every whole free page of an expandable segment,
    leaving holes; a later request that no mapped block holds maps the lowest hole that
    fits (``find_expandable_block``) before it grows the segment's end."""
    m = AllocatorModel(expandable_segments=True)
    a, b, c = (m.malloc(40 * MiB) for _ in range(3))  # pages [0,40) [40,80) [80,120)
    assert m.reserved_bytes == 120 * MiB
    m.free(b)
    m.empty_cache()  # b's two pages go: a hole between a and c
    assert m.reserved_bytes == 80 * MiB
    d = m.malloc(30 * MiB)  # the hole is mapped again (two pages), not the end
    assert m.address_of(d) == 40 * MiB
    assert m.reserved_bytes == 120 * MiB
    m.free(d)
    m.free(c)
    m.empty_cache()  # b's pages and c's: the segment ends after a
    assert m.reserved_bytes == 40 * MiB
    e = m.malloc(60 * MiB)  # grows from the end of a again
    assert m.address_of(e) == 40 * MiB and m.reserved_bytes == 100 * MiB
    m.free(a)
    m.free(e)
    m.empty_cache()
    assert m.reserved_bytes == 0


def test_a_hole_too_small_is_passed_over_for_the_end() -> None:
    m = AllocatorModel(expandable_segments=True, limit_bytes=200 * MiB)
    a, b, c = m.malloc(20 * MiB), m.malloc(20 * MiB), m.malloc(20 * MiB)
    m.free(b)
    m.empty_cache()  # a 20 MiB hole
    big = m.malloc(50 * MiB)  # the hole cannot hold it: the end grows by 60
    assert m.address_of(big) == 60 * MiB
    assert m.reserved_bytes == 100 * MiB
    with pytest.raises(OutOfMemory):
        m.malloc(150 * MiB)
    del a, c
