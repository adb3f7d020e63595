"""The snapshot reader is bounded in depth, in the objects it builds and in the numbers it
keeps, and reads a pickle exactly as ``pickle.loads`` would (issue 34).

Pickles are built opcode by opcode here where ``pickle.dumps`` cannot make them (a tuple
nested 200,000 deep would overflow the pickler's own C stack), and generated with
hypothesis elsewhere: random snapshots must read the same as through ``pickle.loads``, and
random damage to one must end in a ``ConfigError`` or a snapshot, nothing else.
"""

from __future__ import annotations

import gzip
import json
import pickle
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memfit.allocator import snapshot as snapshot_module
from memfit.allocator import snapshot_pickle
from memfit.allocator.snapshot import (
    ACTIONS,
    Trace,
    TraceEvent,
    load_snapshot,
    parse_snapshot,
    snapshot_from_data,
)
from memfit.allocator.snapshot_build import TraceBuilder
from memfit.errors import ConfigError

MiB = 2**20


def _s(text: str) -> bytes:
    raw = text.encode()
    return b"\x8c" + bytes([len(raw)]) + raw


def _snap(event_items: bytes) -> bytes:
    """A protocol 4 snapshot of one device with one event made of ``event_items``."""
    return (
        b"\x80\x04}("
        + _s("segments")
        + b"]"
        + _s("device_traces")
        + b"]]}("
        + event_items
        + b"uaau."
    )


def _deep_list(n: int) -> bytes:
    return b"]" * n + b"a" * (n - 1)


def _deep_tuple(n: int) -> bytes:
    return b")" + b"\x85" * n


def _deep_dict(n: int) -> bytes:
    return (b"}" + _s("a")) * n + b"}" + b"s" * n


DEEP = 200_000

DEEP_CASES = {
    "a frames list nested deep": _snap(
        _s("action") + _s("alloc") + _s("frames") + _deep_list(DEEP)
    ),
    "an action nested deep": _snap(_s("action") + _deep_tuple(DEEP)),
    "a frame's filename nested deep": _snap(
        _s("action")
        + _s("alloc")
        + _s("frames")
        + b"]}("
        + _s("filename")
        + _deep_dict(DEEP)
        + _s("line")
        + b"K\x01"
        + _s("name")
        + _s("f")
        + b"ua"
    ),
    "a block state nested deep": b"\x80\x04}("
    + _s("segments")
    + b"]}("
    + _s("blocks")
    + b"]}("
    + _s("state")
    + _deep_list(DEEP)
    + b"uauau.",
    "allocator settings nested deep": b"\x80\x04}("
    + _s("segments")
    + b"]"
    + _s("allocator_settings")
    + _deep_list(DEEP)
    + b"u.",
    "a tuple key nested deep": b"\x80\x04}("
    + _s("segments")
    + b"]"
    + _deep_tuple(DEEP)
    + b"K\x01u.",
    "a frozenset of a deep tuple": b"\x80\x04}("
    + _s("segments")
    + b"]"
    + _s("x")
    + b"("
    + _deep_tuple(DEEP)
    + b"\x91u.",
}


@pytest.mark.parametrize("name", sorted(DEEP_CASES))
def test_data_nested_200000_deep_is_refused_or_read_never_a_crash(name: str) -> None:
    """The C unpickler overflowed its stack on the deep tuple key (SIGSEGV); a nested
    field raised RecursionError. Each is now an error with a hint, or data read without
    following it (a field that is not what a snapshot holds is not kept)."""
    try:
        snap = parse_snapshot(DEEP_CASES[name], source="deep.pickle")
    except ConfigError as exc:
        assert exc.hint and exc.key_path == "deep.pickle"
    else:
        assert all(isinstance(d.trace, Trace) for d in snap.devices)


def test_a_memo_bomb_is_refused_after_a_few_references() -> None:
    """One block referenced 20,000 times in one segment, that segment 20,000 times: 400
    million blocks from about 200 kB."""
    block = {"address": 0x7F0000000000, "size": 512, "requested_size": 512, "state": "inactive"}
    segment = {"address": 0x7F0000000000, "total_size": 2 * MiB, "blocks": [block] * 20_000}
    blob = pickle.dumps({"segments": [segment] * 20_000, "device_traces": []}, protocol=4)
    assert len(blob) < 300_000
    with pytest.raises(ConfigError, match="stands for more than") as info:
        parse_snapshot(blob, source="bomb.pickle")
    assert info.value.key_path == "bomb.pickle" and info.value.hint


def test_shared_frames_are_not_counted_as_a_bomb() -> None:
    """A real trace shares its frame dicts among events, and a block its stack with the
    event that allocated it: references, each a few bytes, that a reader interns."""
    frames = [{"filename": f"/src/m{i}.py", "line": i, "name": f"f{i}"} for i in range(60)]
    stack = frames[:40]
    builder = TraceBuilder()
    for i in range(3000):
        builder.free(builder.malloc((1 + i % 7) * 4096, frames=[(f"/x{i % 5}.py", 1, "g")]))
    data = builder.snapshot()
    for ev in data["device_traces"][0]:
        ev["frames"] = stack
    snap = parse_snapshot(pickle.dumps(data, protocol=4))
    dev = snap.device()
    assert len(dev.trace) == len(data["device_traces"][0]) and len(dev.stacks) == 1


@pytest.mark.parametrize(
    ("items", "words"),
    [
        (_s("action") + _s("alloc") + _s("stream") + b"\x8b" + struct.pack("<i", 2000)
         + b"\x01" * 2000, "an integer of 2000 bytes"),
        (_s("action") + _s("alloc") + _s("stream") + b"\x8a\x09" + b"\x01" * 9, "65 bits"),
        (_s("action") + _s("alloc") + _s("addr") + b"\x8a\x09" + b"\x01" * 9, "not a size"),
        (_s("action") + _s("alloc") + _s("size") + b"J\xff\xff\xff\xff", "negative"),
        (_s("action") + _s("alloc") + _s("stream") + b"I" + b"1" * 5000 + b"\n",
         "more than 64 characters"),
        (_s("action") + _s("alloc") + _s("frames") + b"]}(" + _s("filename") + _s("a.py")
         + _s("line") + b"\x8a\x09" + b"\x01" * 9 + _s("name") + _s("f") + b"ua",
         "line is an integer of"),
    ],
)  # fmt: skip
def test_integers_past_64_bits_are_refused(items: bytes, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        parse_snapshot(_snap(items))


def test_a_json_stream_of_4000_digits_is_refused_as_not_an_integer_of_a_snapshot() -> None:
    data = {"segments": [], "device_traces": [[{"action": "alloc", "stream": 10**3999}]]}
    with pytest.raises(ConfigError, match="integer of"):
        parse_snapshot(json.dumps(data).encode())
    with pytest.raises(ConfigError, match="not valid JSON"):  # past Python's 4300 digits
        parse_snapshot(b'{"segments": [], "x": ' + b"1" * 5000 + b"}")


@pytest.mark.parametrize(
    ("blob", "words"),
    [
        (b"\x80\x04}(" + _s("segments") + b"]" + _s("device_traces") + b"]](}\x94("
         + _s("action") + _s("alloc") + b"uh\x01eau.", "memo reference to nothing kept"),
        (b"\x80\x04}(" + _s("segments") + b"]\x94h\x00au.", "after referring to it"),
        (b"\x80\x04}(" + _s("segments") + b"]" + b"\x97u.", "out-of-band buffer"),
        (b"\x80\x04" + _s("os") + _s("system") + b"\x93.", "the Python object os.system"),
        (b"\x80\x04}(" + _s("segments") + b"]\xffu.", "unknown opcode 0xff"),
        (b"\x80\x09}.", "pickle protocol 9"),
    ],
)  # fmt: skip
def test_what_no_snapshot_does_is_refused(blob: bytes, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        parse_snapshot(blob)


def test_max_bytes_lifts_the_cap_of_the_file_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 256 MiB cap on files a user names no longer caps a snapshot: ``max_bytes`` is the
    one bound (1 GiB by default, as the guide says)."""
    seen: list[int] = []
    real = snapshot_module.read_user_bytes

    def spy(path: Any, **kwargs: Any) -> bytes:
        seen.append(kwargs["max_bytes"])
        return real(path, **kwargs)

    monkeypatch.setattr(snapshot_module, "read_user_bytes", spy)
    path = tmp_path / "s.pickle"
    builder = TraceBuilder()
    builder.malloc(MiB)
    path.write_bytes(pickle.dumps(builder.snapshot()))
    load_snapshot(path)
    load_snapshot(path, max_bytes=3 * 2**30)
    assert seen == [snapshot_module.MAX_SNAPSHOT_BYTES, 3 * 2**30]


def test_gzip_takes_any_max_bytes() -> None:
    builder = TraceBuilder()
    builder.malloc(MiB)
    blob = gzip.compress(pickle.dumps(builder.snapshot()))
    for max_bytes in (2**63, 2**64, 10**30):
        assert parse_snapshot(blob, max_bytes=max_bytes).device().trace


def test_long_reads_report_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snapshot_pickle, "PROGRESS_BYTES", 4096)
    builder = TraceBuilder()
    for i in range(2000):
        builder.free(builder.malloc((1 + i % 9) * 4096))
    blob = pickle.dumps(builder.snapshot(), protocol=4)
    ticks: list[tuple[int, int]] = []
    parse_snapshot(blob, progress=lambda done, total: ticks.append((done, total)))
    assert len(ticks) > 3 and ticks[-1] == (len(blob), len(blob))
    assert [d for d, _ in ticks] == sorted(d for d, _ in ticks)


def test_a_trace_is_a_sequence_of_events_like_the_tuple_it_replaces() -> None:
    events = [
        TraceEvent("alloc", 1024, 512, 0, 17, 3, None),
        TraceEvent("oom", 0, 2**40, -5, None, -1, 12345),
        TraceEvent("segment_free", 2**64 - 1, 0, 2**62, -(2**62), -1, None),
    ]
    trace = Trace.of(events)
    assert len(trace) == 3 and list(trace) == events and trace == tuple(events)
    assert trace[1] == events[1] and trace[-1] == events[-1] and trace[1:] == events[1:]
    assert trace == Trace.of(events) and trace != events[:2]
    assert trace.has("oom") and not trace.has("free_completed") and not trace.has("jump")
    with pytest.raises(IndexError):
        trace[3]


# --- differential: what pickle.loads gives, read by memfit's interpreter ----------------------

_ints = st.integers(min_value=0, max_value=2**63 - 1)
_frames = st.lists(
    st.fixed_dictionaries(
        {
            "filename": st.text(max_size=12),
            "line": st.integers(0, 2**31),
            "name": st.text(max_size=8),
        }
    ),
    max_size=4,
)
_event = st.fixed_dictionaries(
    {"action": st.sampled_from(ACTIONS), "addr": _ints, "size": _ints},
    optional={
        "stream": st.integers(-(2**62), 2**62),
        "time_us": st.integers(-(2**70), 2**70),
        "frames": _frames,
        "device_free": _ints,
        "compile_context": st.text(max_size=6),
    },
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    traces=st.lists(st.lists(_event, max_size=30), min_size=1, max_size=3),
    protocol=st.sampled_from([2, 3, 4, 5]),
    share=st.booleans(),
)
def test_any_snapshot_reads_as_pickle_loads_then_the_dict_reader_would(
    traces: list[list[dict[str, Any]]], protocol: int, share: bool
) -> None:
    if share:  # events sharing one frames list, as a real trace's blocks and events do
        common = [{"filename": "a.py", "line": 1, "name": "f"}]
        for trace in traces:
            for ev in trace[::2]:
                ev["frames"] = common
    data = {"segments": [], "device_traces": traces, "allocator_settings": {"x": (1, 2)}}
    blob = pickle.dumps(data, protocol=protocol)
    expected = snapshot_from_data(pickle.loads(blob), kind="pickle")
    got = parse_snapshot(blob)
    assert got.devices == expected.devices and got.settings == expected.settings


def _valid_blob() -> bytes:
    builder = TraceBuilder()
    handles = [builder.malloc((1 + i) * 4096, frames=[(f"/m{i % 3}.py", i, "f")]) for i in range(8)]
    for h in handles[::2]:
        builder.free(h)
    return pickle.dumps(builder.snapshot(), protocol=4)


VALID = _valid_blob()


@settings(max_examples=300, deadline=None)
@given(
    edits=st.lists(
        st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), min_size=1, max_size=6
    ),
    cut=st.integers(2, len(VALID)),
)
def test_a_damaged_snapshot_is_an_error_or_a_snapshot_never_a_crash(
    edits: list[tuple[int, int]], cut: int
) -> None:
    blob = bytearray(VALID)
    for where, value in edits:
        blob[where] = value
    for data in (bytes(blob), bytes(blob[:cut])):
        try:
            parse_snapshot(data)
        except ConfigError as exc:
            assert exc.hint
