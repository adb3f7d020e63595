"""Snapshots to and from JSON (SystemSnapshot.save / load, to_dict / from_dict)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memfit import ConfigError
from memfit.backends.base import (
    SNAPSHOT_FORMAT,
    DeviceSnapshot,
    ProcessSnapshot,
    SystemSnapshot,
    utc_now,
)


def _snapshot() -> SystemSnapshot:
    proc = ProcessSnapshot(
        pid=12,
        name="python",
        command="python train.py",
        user="ada",
        used_bytes=2**30,
        kind="compute",
        note=None,
    )
    hidden = ProcessSnapshot(pid=99, note="PID not visible here")
    dev = DeviceSnapshot(
        index=0,
        name="NVIDIA H100 80GB HBM3",
        uuid="GPU-1",
        total_bytes=85520809984,
        device_used_bytes=2**31,
        free_bytes=85520809984 - 2**31,
        driver_reserved_bytes=552599552,
        utilization_percent=50,
        processes=(proc, hidden),
        notes=("n1",),
        compute_capability=(9, 0),
        backend="nvml",
    )
    return SystemSnapshot(
        source="nvml",
        taken_at="2026-01-31T12:00:00Z",
        driver_version="550.54.15",
        devices=(dev,),
        notes=("x",),
        cuda_version="12.4",
    )


def test_round_trip_through_file(tmp_path: Path) -> None:
    snap = _snapshot()
    path = snap.save(tmp_path / "snap.json")
    data = json.loads(path.read_text())
    assert data["format"] == SNAPSHOT_FORMAT
    assert data["devices"][0]["compute_capability"] == [9, 0]
    assert SystemSnapshot.load(path) == snap


def test_unknown_values_stay_none(tmp_path: Path) -> None:
    snap = SystemSnapshot(source="jax", devices=(DeviceSnapshot(index=0, name="cpu"),))
    back = SystemSnapshot.load(snap.save(tmp_path / "s.json"))
    dev = back.devices[0]
    assert dev.total_bytes is None and dev.free_bytes is None and dev.compute_capability is None


def test_total_bytes_helper() -> None:
    snap = _snapshot()
    assert snap.total_bytes(0) == 85520809984
    assert snap.total_bytes(1) is None


def test_utc_now_format() -> None:
    text = utc_now()
    assert text.endswith("Z") and "T" in text and len(text) == 20


@pytest.mark.parametrize(
    ("data", "key_path"),
    [
        ([], "snapshot"),
        ({"source": "nvml", "format": 99}, "snapshot.format"),
        ({"format": 1}, "snapshot.source"),
        ({"source": "nvml", "devices": {}}, "snapshot.devices"),
        ({"source": "nvml", "devices": [{"index": 0}]}, "devices[0]"),
        ({"source": "nvml", "devices": [{"index": "0", "name": "x"}]}, "devices[0].index"),
        (
            {"source": "nvml", "devices": [{"index": 0, "name": "x", "total_bytes": 1.5}]},
            "devices[0].total_bytes",
        ),
        (
            {"source": "nvml", "devices": [{"index": 0, "name": "x", "compute_capability": [9]}]},
            "devices[0].compute_capability",
        ),
        (
            {"source": "nvml", "devices": [{"index": 0, "name": "x", "processes": [{"pid": "a"}]}]},
            "devices[0].processes[0].pid",
        ),
        ({"source": "nvml", "notes": "one"}, "snapshot.notes"),
        (
            {"source": "nvml", "devices": [{"index": 0, "name": "x", "free_bytes": True}]},
            "devices[0].free_bytes",
        ),
    ],
)
def test_from_dict_rejects_with_key_path(data: object, key_path: str) -> None:
    with pytest.raises(ConfigError) as info:
        SystemSnapshot.from_dict(data)  # type: ignore[arg-type]
    assert info.value.key_path == key_path


def test_load_missing_and_not_json(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read snapshot"):
        SystemSnapshot.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not JSON"):
        SystemSnapshot.load(bad)


def test_save_to_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot write snapshot"):
        _snapshot().save(tmp_path / "no" / "such" / "dir.json")
