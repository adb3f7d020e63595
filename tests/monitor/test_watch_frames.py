"""The data side of ``memfit watch``: frames, history, sparklines, N/A reasons."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _monitor_runs import StaticProbe

from memfit.backends.base import DeviceSnapshot, ProcessSnapshot, SystemSnapshot
from memfit.backends.simulated import SimulatedDevice
from memfit.errors import ConfigError
from memfit.monitor.watch import (
    SPARK_CHARS,
    Watcher,
    append_log,
    field_note,
    frame_record,
    sparkline,
    used_fraction,
)

GiB = 2**30


def test_sparkline_levels_and_unknowns() -> None:
    assert sparkline([0.0, 1.0]) == SPARK_CHARS[0] + SPARK_CHARS[-1]
    assert sparkline([None, 2.0, -1.0]) == " " + SPARK_CHARS[-1] + SPARK_CHARS[0]
    assert sparkline([0.1, 0.2, 0.3], width=2) == sparkline([0.2, 0.3])
    assert sparkline([0.5], width=0) == ""


def test_used_fraction_needs_both_figures() -> None:
    assert used_fraction(DeviceSnapshot(0, "a", total_bytes=4, device_used_bytes=1)) == 0.25
    assert used_fraction(DeviceSnapshot(0, "a", total_bytes=None, device_used_bytes=1)) is None
    assert used_fraction(DeviceSnapshot(0, "a", total_bytes=4, device_used_bytes=None)) is None


def test_history_is_kept_per_device_and_bounded() -> None:
    dev = SimulatedDevice("4GiB")
    watcher = Watcher(dev, history=3)
    for _ in range(5):
        dev.allocate(GiB // 2)
        frame = watcher.frame()
    assert frame.history[0] == (0.375, 0.5, 0.625)
    assert frame.snapshot.devices[0].device_used_bytes == 5 * GiB // 2


def test_pid_filter_keeps_only_the_asked_processes() -> None:
    procs = (ProcessSnapshot(pid=10, used_bytes=1), ProcessSnapshot(pid=11, used_bytes=2))
    snap = SystemSnapshot("static", devices=(DeviceSnapshot(0, "g", processes=procs),))
    frame = Watcher(StaticProbe(snap), pids=[11]).frame()
    assert [p.pid for p in frame.snapshot.devices[0].processes] == [11]
    everything = Watcher(StaticProbe(snap)).frame()
    assert len(everything.snapshot.devices[0].processes) == 2


def test_field_note_finds_the_reason() -> None:
    device = DeviceSnapshot(
        0,
        "g",
        notes=(
            "utilization: not supported on this device (NVML: Not Supported)",
            "compute processes: no permission (NVML: Insufficient Permissions)",
        ),
    )
    assert field_note(device, "utilization") is not None
    assert field_note(device, "utilization").startswith("utilization")  # type: ignore[union-attr]
    assert field_note(device, "processes") == device.notes[1]
    assert field_note(device, "memory") is None


def test_frame_record_and_log_round_trip(tmp_path: Path) -> None:
    dev = SimulatedDevice("2GiB")
    frame = Watcher(dev).frame()
    record = frame_record(frame)
    assert record["time"] == frame.time
    assert SystemSnapshot.from_dict(record) == frame.snapshot
    log = tmp_path / "w.jsonl"
    append_log(log, frame)
    append_log(log, frame)
    assert [json.loads(x)["source"] for x in log.read_text().splitlines()] == ["simulated"] * 2


def test_unwritable_log_is_a_config_error(tmp_path: Path) -> None:
    frame = Watcher(SimulatedDevice("1GiB")).frame()
    with pytest.raises(ConfigError, match="cannot append"):
        append_log(tmp_path / "missing-dir" / "w.jsonl", frame)


def test_history_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="history"):
        Watcher(SimulatedDevice("1GiB"), history=0)


def test_module_doctests() -> None:
    import doctest

    import memfit.monitor._leaks as leaks
    import memfit.monitor.watch as watch

    for module in (leaks, watch):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__
