"""The bulk path of the snapshot reader (issue 45): runs of trace events read by one regular
expression into columns must read exactly as ``pickle.loads`` and the dict reader would,
count the same objects, keep the memo exact and hand anything odd to the interpreter."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from memfit.allocator import snapshot_bulk
from memfit.allocator.snapshot import parse_snapshot, snapshot_from_data
from memfit.allocator.snapshot_bulk import Bulk
from memfit.errors import ConfigError

BASE = 0x7F0000000000


@pytest.fixture
def bulks(monkeypatch: pytest.MonkeyPatch) -> list[Bulk]:
    """Every bulk path made while the test runs (to see how many events it read)."""
    made: list[Bulk] = []
    init = Bulk.__init__

    def spy(self: Bulk, *args: Any) -> None:
        init(self, *args)
        made.append(self)

    monkeypatch.setattr(Bulk, "__init__", spy)
    return made


def _frames(count: int) -> list[dict[str, Any]]:
    return [{"filename": f"/src/m{i}.py", "line": i, "name": f"f{i}"} for i in range(count)]


def _trace(n: int, *, frames: bool = True, extra: bool = False) -> list[dict[str, Any]]:
    """Events as ``_snapshot()`` writes them: shared frame dicts, stacks shared between
    events (a list referred to again) and new ones, empty ones, all widths of integers."""
    pool = _frames(12)
    shared = [[pool[(i + j) % 12] for j in range(1 + i % 4)] for i in range(6)]
    actions = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free")
    sizes = (0, 7, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**40, 2**62)
    out: list[dict[str, Any]] = []
    previous: list[Any] = []
    for i in range(n):
        event: dict[str, Any] = {
            "action": actions[i % 5],
            "addr": BASE + (i % 97) * 512 if i % 11 else i % 3,
            "size": sizes[i % len(sizes)],
            "stream": 0 if i % 13 else 2**40 + i,
            "time_us": 1_700_000_000_000_000 + i,
        }
        if extra:
            event["compile_context"] = "N/A" if i % 2 else None
            event["user_metadata"] = i % 300
        if frames:
            kind = i % 4
            if kind == 0:
                stack = shared[i % 6]  # shared with other events: a memo reference
            elif kind == 1:
                stack = [pool[i % 12], pool[(i + 5) % 12]]  # a new list
            elif kind == 2:
                stack = previous  # the list of the event before (torch shares one context)
            else:
                stack = [] if i % 8 == 3 else [pool[i % 12]]
            previous = stack
            event["frames"] = stack
        out.append(event)
    return out


def _data(trace: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
    return {"segments": [], "device_traces": [trace], "allocator_settings": {}, **more}


def _same(blob: bytes) -> None:
    got = parse_snapshot(blob)
    want = snapshot_from_data(pickle.loads(blob), kind="pickle")
    assert got.devices == want.devices
    assert dict(got.settings) == dict(want.settings)


@pytest.mark.parametrize("extra", [False, True])
@pytest.mark.parametrize("frames", [False, True])
def test_bulk_reads_as_pickle_loads_would(bulks: list[Bulk], frames: bool, extra: bool) -> None:
    blob = pickle.dumps(_data(_trace(6000, frames=frames, extra=extra)), protocol=4)
    _same(blob)
    assert bulks and bulks[0].events > 4000  # most events went the bulk way


def test_chunks_and_their_seams_read_the_same(
    bulks: list[Bulk], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(snapshot_bulk, "CHUNK_BYTES", 997)
    _same(pickle.dumps(_data(_trace(3000)), protocol=5))
    assert bulks[0].events > 2000


def test_a_list_read_in_bulk_is_built_when_referred_to_later() -> None:
    trace = _trace(400)
    later = [e["frames"] for e in trace[-40:]]
    blob = pickle.dumps({**_data(trace), "kept": later}, protocol=4)
    got = parse_snapshot(blob)
    assert got.devices == snapshot_from_data(pickle.loads(blob), kind="pickle").devices


def test_memo_indices_named_turn_the_bulk_path_off(bulks: list[Bulk]) -> None:
    _same(pickle.dumps(_data(_trace(2000)), protocol=2))  # BINPUT, no MEMOIZE
    assert bulks[0].events == 0 and not bulks[0].on


def test_odd_values_go_to_the_interpreter() -> None:
    trace = _trace(600, frames=False)
    trace[300]["stream"] = -1  # a negative integer: not the bulk path's
    trace[301]["addr"] = 2**64 - 1  # nine bytes
    trace[302]["time_us"] = None
    trace[303]["size"] = None
    _same(pickle.dumps(_data(trace), protocol=4))
    trace[304]["size"] = True
    with pytest.raises(ConfigError, match=r"\[0\]\[304\]\.size is True, not an integer"):
        parse_snapshot(pickle.dumps(_data(trace), protocol=4))


def test_a_bad_action_is_the_interpreters_message() -> None:
    trace = _trace(500, frames=False)
    trace[400]["action"] = "addr"  # a memo reference to a string that is no action
    blob = pickle.dumps(_data(trace), protocol=4)
    with pytest.raises(ConfigError, match=r"device_traces\[0\]\[400\]\.action"):
        parse_snapshot(blob)


def test_references_in_bulk_events_count_what_they_hold() -> None:
    big = [list(range(1000)) for _ in range(100)]  # 100,000 objects behind one reference
    trace = _trace(3000, frames=False, extra=True)
    for event in trace:
        event["user_metadata"] = big
    blob = pickle.dumps(_data(trace), protocol=4)
    with pytest.raises(ConfigError, match="stands for more than"):
        parse_snapshot(blob)


def test_two_devices_keep_their_own_stacks(bulks: list[Bulk]) -> None:
    first, second = _trace(1500), _trace(1500)
    second.reverse()  # the same frame dicts, other stacks first: other indices
    _same(pickle.dumps({"segments": [], "device_traces": [first, second]}, protocol=4))
    assert bulks[0].events > 2000


def test_progress_is_reported_while_the_bulk_path_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    from memfit.allocator import snapshot_pickle

    monkeypatch.setattr(snapshot_pickle, "PROGRESS_BYTES", 8192)
    blob = pickle.dumps(_data(_trace(20000, frames=False)), protocol=4)
    ticks: list[int] = []
    parse_snapshot(blob, progress=lambda done, total: ticks.append(done))
    assert len(ticks) > 10 and ticks == sorted(ticks) and ticks[-1] == len(blob)
