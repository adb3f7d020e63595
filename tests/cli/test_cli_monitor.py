"""``memfit watch`` and ``memfit report`` through ``memfit.cli.main.main``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _monitor_runs import StaticProbe, record_run

import memfit.cli.watch as watch_cli
from memfit.backends.base import DeviceProbe, DeviceSnapshot, ProcessSnapshot, SystemSnapshot
from memfit.backends.simulated import SimulatedDevice
from memfit.cli.main import main

MiB = 2**20


def _use_probe(monkeypatch: pytest.MonkeyPatch, probe: DeviceProbe | None, *reasons: str) -> None:
    monkeypatch.setattr(watch_cli, "make_probe", lambda: (probe, list(reasons)))


def test_watch_without_a_gpu_says_so_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _use_probe(monkeypatch, None, "NVML unavailable: the NVML library was not found")
    assert main(["watch"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    assert out.startswith("No GPU to watch: NVML unavailable")


def test_watch_json_without_a_gpu_is_an_empty_snapshot(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _use_probe(monkeypatch, None, "no driver")
    assert main(["watch", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["devices"] == [] and "no driver" in data["notes"]


def test_watch_once_shows_the_device(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    dev = SimulatedDevice("8GiB", name="Sim 8G", used_by_others="2GiB")
    _use_probe(monkeypatch, dev)
    assert main(["watch", "--once"]) == 0
    out = capsys.readouterr().out
    assert "0: Sim 8G" in out
    assert "2048MiB / 8192MiB" in out  # as nvidia-smi shows it
    assert "GiB" not in out
    assert "25%" in out
    assert "other processes" in out


def test_watch_json_and_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    dev = SimulatedDevice("8GiB")
    dev.allocate(GiB := 2**30)
    _use_probe(monkeypatch, dev)
    log = tmp_path / "watch.jsonl"
    assert main(["watch", "--json", "--log", str(log)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["devices"][0]["device_used_bytes"] == GiB
    assert len(log.read_text().splitlines()) == 1
    assert main(["watch", "--once", "--log", str(log)]) == 0
    assert len(log.read_text().splitlines()) == 2


def test_watch_live_stops_after_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _use_probe(monkeypatch, SimulatedDevice("8GiB"))
    log = tmp_path / "live.jsonl"
    assert main(["watch", "--interval", "0.01", "--count", "3", "--log", str(log)]) == 0
    assert len(log.read_text().splitlines()) == 3
    assert "memfit watch" in capsys.readouterr().out


def test_watch_shows_na_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    device = DeviceSnapshot(
        index=0,
        name="GPU in WSL",
        total_bytes=8 * 2**30,
        device_used_bytes=2**30,
        processes=(ProcessSnapshot(pid=4242, name="python", used_bytes=None),),
        notes=(
            "compute processes: per-process memory not available (Windows WDDM / WSL)",
            "utilization: not supported (NVML: Not Supported)",
        ),
        backend="nvml",
    )
    _use_probe(monkeypatch, StaticProbe(SystemSnapshot("nvml", devices=(device,)), "nvml"))
    assert main(["watch", "--once"]) == 0
    out = capsys.readouterr().out
    assert "N/A" in out
    assert "GPU 0 processes: N/A because compute processes: per-process" in out
    assert "GPU 0 utilization: N/A because utilization: not supported" in out
    assert "4242" in out


def test_watch_pid_filter(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    procs = (
        ProcessSnapshot(pid=100, name="a", command="python a.py", used_bytes=MiB),
        ProcessSnapshot(pid=200, name="b", command="python b.py", used_bytes=MiB),
    )
    device = DeviceSnapshot(0, "g", total_bytes=2**30, device_used_bytes=MiB, processes=procs)
    _use_probe(monkeypatch, StaticProbe(SystemSnapshot("nvml", devices=(device,)), "nvml"))
    assert main(["watch", "--json", "--pid", "200"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [p["pid"] for p in data["devices"][0]["processes"]] == [200]


def test_watch_bad_interval_is_an_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _use_probe(monkeypatch, SimulatedDevice("1GiB"))
    assert main(["watch", "--interval", "0"]) == 1
    err = capsys.readouterr().err
    assert "Error:" in err and "--interval" in err and "Hint:" in err


def _run_file(path: Path) -> Path:
    cleanup = ("cleanup", "cleanup.every", "emptied")
    return record_run(path, 40, events={20: [cleanup]})


def test_report_prints_the_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run_file(tmp_path / "run.jsonl")
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr().out
    assert "memfit report: run.jsonl" in out
    assert "1.0 MiB/step since step 0" in out
    assert "cleanup" in out


def test_report_json_and_outputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run_file(tmp_path / "run.jsonl")
    png = tmp_path / "r.png"
    assert main(["report", str(run), "-o", str(png), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["output"] == str(png)
    assert data["growth"]["bytes_per_step"] == pytest.approx(MiB)
    assert png.read_bytes().startswith(b"\x89PNG")
    html_path = tmp_path / "r.html"
    assert main(["report", str(run), "-o", str(html_path)]) == 0
    assert "data:image/png;base64," in html_path.read_text()


def test_report_bad_line_is_an_error_with_its_line_number(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "run.jsonl"
    path.write_text('{"type":"sample","step":0,"allocated_bytes":1}\n{"type": "sam\n')
    assert main(["report", str(path)]) == 1
    err = capsys.readouterr().err
    assert "Error:" in err and "line 2 is not JSON" in err and f"{path}:2" in err
    assert "Hint:" in err
    assert "Traceback" not in err


def test_report_missing_file_and_bad_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(tmp_path / "none.jsonl")]) == 1
    assert "no such file" in capsys.readouterr().err
    run = _run_file(tmp_path / "run.jsonl")
    assert main(["report", str(run), "-o", str(tmp_path / "r.pdf")]) == 1
    assert "report.png" in capsys.readouterr().err
