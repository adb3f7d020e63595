"""The one CUDA-snapshot reader (``memfit.allocator.snapshot``): plain data in, nothing run."""

from __future__ import annotations

import copyreg
import gzip
import json
import os
import pickle
from pathlib import Path
from typing import Any

import pytest

from memfit.allocator.snapshot import (
    MAX_DEPTH,
    load_snapshot,
    parse_snapshot,
    snapshot_from_data,
    snapshot_to_data,
)
from memfit.allocator.snapshot_build import TraceBuilder
from memfit.errors import ConfigError

MiB = 2**20


def _data(frames: bool = True) -> dict[str, Any]:
    b = TraceBuilder()
    f = [("/home/me/train.py", 12, "step"), ("/usr/lib/python3.11/threading.py", 9, "run")]
    a = b.malloc(3 * MiB, frames=f if frames else None)
    c = b.malloc(1000, frames=f if frames else None)
    b.free(a)
    del c
    return b.snapshot()


class _Run:
    """An object whose unpickling would run a shell command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_a_pickle_that_would_run_a_command_is_refused_and_runs_nothing(
    tmp_path: Path, protocol: int
) -> None:
    marker = tmp_path / "ran"
    data = _data()
    data["segments"][0]["blocks"][0]["frames"] = [_Run(marker)]  # deep inside, not at the top
    blob = pickle.dumps(data, protocol=protocol)
    with pytest.raises(ConfigError) as err:
        parse_snapshot(blob, source="evil.pickle")
    assert "names the Python object" in str(err.value) and "system" in str(err.value)
    assert err.value.hint
    assert not marker.exists()


def test_a_class_instance_is_refused_too() -> None:
    from collections import OrderedDict

    blob = pickle.dumps({"segments": OrderedDict()}, protocol=2)
    with pytest.raises(ConfigError, match=r"collections\.OrderedDict"):
        parse_snapshot(blob)


def test_a_copyreg_extension_is_refused_even_when_registered(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    copyreg.add_extension(os.system.__module__, "system", 0x7E)
    try:
        blob = pickle.dumps({"segments": [], "x": _Run(marker)}, protocol=2)
        assert b"\x82\x7e" in blob  # EXT1 0x7E: the C unpickler would not ask find_class
        with pytest.raises(ConfigError, match="names the Python object"):
            parse_snapshot(blob)
    finally:
        copyreg.remove_extension(os.system.__module__, "system", 0x7E)
        copyreg.clear_extension_cache()
    assert not marker.exists()


def test_pickle_json_and_gzip_read_the_same(tmp_path: Path) -> None:
    data = _data()
    from_pickle = parse_snapshot(pickle.dumps(data))
    from_json = parse_snapshot(json.dumps(data).encode())
    from_gzip = parse_snapshot(gzip.compress(pickle.dumps(data)))
    assert from_pickle.devices == from_json.devices == from_gzip.devices
    assert from_pickle.kind == "pickle" and from_json.kind == "json"
    dev = from_pickle.device()
    assert [e.action for e in dev.trace][:2] == ["segment_alloc", "alloc"]
    assert dev.has_frames and dev.stack_frames(dev.trace[1].stack)[0].filename.endswith("train.py")
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(data))
    assert load_snapshot(path).devices == from_pickle.devices


def test_without_frames_and_written_back() -> None:
    snap = parse_snapshot(pickle.dumps(_data(frames=False)))
    assert not snap.device().has_frames
    again = snapshot_from_data(snapshot_to_data(snap))
    assert again.devices == snap.devices
    stripped = snapshot_from_data(
        snapshot_to_data(parse_snapshot(pickle.dumps(_data())), frames=False)
    )
    assert not stripped.device().has_frames


def test_several_devices() -> None:
    a = _data()
    b = TraceBuilder(device=1)
    b.malloc(5 * MiB)
    other = b.snapshot()
    merged = {
        "segments": a["segments"] + other["segments"],
        "device_traces": [a["device_traces"][0], other["device_traces"][1]],
    }
    snap = parse_snapshot(pickle.dumps(merged))
    assert [d.device for d in snap.devices] == [0, 1]
    assert snap.device(1).reserved_bytes == 20 * MiB
    with pytest.raises(ConfigError, match="no device 3"):
        snap.device(3)


def test_pytorch_2_0_blocks_with_history() -> None:
    data = _data(frames=False)
    block = data["segments"][-1]["blocks"][0]
    block["history"] = [
        {
            "addr": block["address"],
            "real_size": 1,
            "frames": [{"filename": "a.py", "line": 3, "name": "f"}],
        }
    ]
    snap = snapshot_from_data(data)
    stacks = [b.stack for s in snap.device().segments for b in s.blocks]
    assert max(stacks) >= 0


def test_a_cut_off_pickle() -> None:
    blob = pickle.dumps(_data())
    with pytest.raises(ConfigError, match="cut off") as err:
        parse_snapshot(blob[: len(blob) // 2], source="half.pickle")
    assert err.value.key_path == "half.pickle"


@pytest.mark.parametrize(
    ("obj", "words"),
    [
        ([1, 2, 3], "a list, not a dict"),
        ({"weights": [1.0]}, "no 'segments' key"),
        ({"segments": [{"address": "x"}]}, "not an integer"),
        ({"segments": [], "device_traces": [[{"action": "jump"}]]}, "action is 'jump'"),
        ({"segments": [{"blocks": [{"state": "odd"}]}]}, "state is 'odd'"),
    ],
)
def test_data_that_is_not_a_snapshot(obj: Any, words: str) -> None:
    for blob in (pickle.dumps(obj), json.dumps(obj).encode()):
        with pytest.raises(ConfigError, match="not a CUDA memory snapshot") as err:
            parse_snapshot(blob)
        assert words in str(err.value)
        assert err.value.hint


def test_neither_pickle_nor_json_empty_or_bad_json() -> None:
    with pytest.raises(ConfigError, match="neither a pickle"):
        parse_snapshot(b"\x00\x01 binary")
    with pytest.raises(ConfigError, match="zip archive"):
        parse_snapshot(b"PK\x03\x04 a torch.save file")
    lines = b'{"type": "sample", "step": 1}\n{"type": "event", "kind": "oom"}\n'
    with pytest.raises(ConfigError, match="Recorder log") as err:
        parse_snapshot(lines)
    assert err.value.hint and ".snapshot.pickle" in err.value.hint
    with pytest.raises(ConfigError, match="empty"):
        parse_snapshot(b"  \n")
    with pytest.raises(ConfigError, match="not valid JSON"):
        parse_snapshot(b'{"segments": [')


def test_caps_on_size_and_depth(tmp_path: Path) -> None:
    blob = pickle.dumps(_data())
    with pytest.raises(ConfigError, match="more than the 100 bytes"):
        parse_snapshot(blob, max_bytes=100)
    path = tmp_path / "big.pickle"
    path.write_bytes(blob)
    with pytest.raises(ConfigError, match="more than the 100 bytes"):
        load_snapshot(path, max_bytes=100)
    bomb = gzip.compress(b" " * (4 * MiB))
    with pytest.raises(ConfigError, match="after gzip"):
        parse_snapshot(bomb, max_bytes=MiB)
    deep: Any = []
    for _ in range(MAX_DEPTH + 5):
        deep = [deep]
    with pytest.raises(ConfigError, match="nested more than"):
        parse_snapshot(pickle.dumps({"segments": [], "x": deep}))
    with pytest.raises(ConfigError, match="nested more than"):
        parse_snapshot(b'{"segments": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")


def test_a_missing_file_and_a_folder(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        load_snapshot(tmp_path / "nope.pickle")
    with pytest.raises(ConfigError):
        load_snapshot(tmp_path)
