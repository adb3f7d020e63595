"""Real CUDA allocator traces from public repositories, replayed exactly (issue 26 part 3).

Each file of the public corpus is a ``torch.cuda.memory._dump_snapshot()`` of a real run
(source, commit and licence in its ``memfit`` section and in
``tests/data/gpu_truth/public_sources.md``), reduced by ``bench/reduce_snapshot.py``. The files
are data taken from public repositories, which developers do not commit: they live in the
steering repository's ``shared/gpu_truth/public/`` (CI lays ``shared/`` beside the checkout) or
where ``MEMFIT_PUBLIC_SNAPSHOTS`` points; without them these tests skip and say so.
Most were recorded mid-run, so the allocator's state at
the first event is rebuilt from the final segments and the trace walked backwards
(:func:`memfit.allocator.replay.start_state`), then the trace's requests are replayed through
:class:`memfit.allocator.model.AllocatorModel`. The trace's own segment events are the truth:
the reserved bytes after every allocation and every free, the reserved peak and the number of
segments obtained must match to the byte.
"""

from __future__ import annotations

import pytest
from public_snapshots import SOURCES, corpus_dir

from memfit.allocator.replay import implied_limit, recorded_curve, replay, start_state
from memfit.allocator.snapshot import Snapshot, load_snapshot, snapshot_from_data, snapshot_to_data

PUBLIC = corpus_dir()
FILES = sorted(PUBLIC.glob("*.json.gz")) if PUBLIC is not None else []
_MISSING = (
    "the public snapshot corpus is not here: it is data from public repositories, kept in the "
    "steering repository's shared/gpu_truth/public/ (or set MEMFIT_PUBLIC_SNAPSHOTS); "
    "bench/reduce_snapshot.py makes it from the raw files listed in "
    "tests/data/gpu_truth/public_sources.md"
)
pytestmark = pytest.mark.skipif(not FILES, reason=_MISSING)


def test_the_public_corpus_is_there_and_small() -> None:
    assert len(FILES) >= 14
    sizes = [p.stat().st_size for p in FILES]
    assert max(sizes) < 300_000
    assert sum(sizes) < 5_000_000
    listed = SOURCES.read_text()
    for path in FILES:
        assert path.name.removesuffix(".json.gz") in listed, path.name


@pytest.fixture(scope="module", params=FILES, ids=[p.name.removesuffix(".json.gz") for p in FILES])
def snapshot(request: pytest.FixtureRequest) -> Snapshot:
    return load_snapshot(request.param)


def test_each_names_its_source_and_licence(snapshot: Snapshot) -> None:
    meta = snapshot.meta
    assert str(meta["source"]).startswith("https://github.com/")
    assert len(str(meta["commit"])) == 40
    assert meta["licence"] in ("MIT", "Apache-2.0")


def test_replay_matches_the_recorded_trace_exactly(snapshot: Snapshot) -> None:
    dev = snapshot.device()
    start = start_state(dev)
    recorded = recorded_curve(dev, start)
    assert recorded[-1] == dev.reserved_bytes  # the trace walks back to the end's segments
    limit = implied_limit(dev, start)
    assert limit.consistent
    got = replay(
        dev,
        start=start,
        limit_bytes=limit.bytes,
        max_split_size=snapshot.max_split_size,
        expandable_segments=snapshot.expandable_segments,
    )
    checked = 0
    for index, event in enumerate(dev.trace):
        if event.action in ("alloc", "free_completed"):
            assert got.reserved[index] == recorded[index], (index, event)
            checked += 1
    assert checked > 0
    assert got.peak_reserved == max([start.reserved_bytes, *recorded])
    assert got.segments == sum(e.action == "segment_alloc" for e in dev.trace)
    assert got.reserved[-1] == dev.reserved_bytes
    assert not got.failed


def test_the_start_state_holds_what_the_trace_frees_without_allocating(
    snapshot: Snapshot,
) -> None:
    dev = snapshot.device()
    start = start_state(dev)
    starts = {a for s in start.segments for a, _ in s.live}
    allocated: set[int] = set()
    for event in dev.trace:
        if event.action == "alloc":
            allocated.add(event.addr)
        elif event.action == "free_completed" and event.addr not in allocated:
            assert event.addr in starts
    assert all(s.size > 0 for s in start.segments)


def test_written_back_and_read_again_it_is_the_same(snapshot: Snapshot) -> None:
    again = snapshot_from_data(snapshot_to_data(snapshot))
    assert again.devices == snapshot.devices
    assert dict(again.settings) == dict(snapshot.settings)
