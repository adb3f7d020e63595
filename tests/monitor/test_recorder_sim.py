"""The Recorder on the simulated GPU with real CPU torch training loops."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from memfit.backends.base import DeviceSnapshot, SystemSnapshot
from memfit.backends.simulated import SimulatedDevice
from memfit.errors import BackendUnavailable, ConfigError
from memfit.monitor.recorder import SAMPLE_FIELDS, Recorder
from memfit.runtime.events import MemoryEvent
from memfit.runtime.simulate import simulate_gpu

MiB = 2**20


def _train(
    rec: Recorder,
    *,
    steps: int,
    seed: int,
    leak_floats: int = 0,
    noise_floats: int = 0,
) -> list[torch.Tensor]:
    """A small MLP trained with SGD; optionally keeps a tensor per step (the leak) and a
    randomly sized tensor alive across steps (noise without growth)."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    kept: list[torch.Tensor] = []
    carry = torch.zeros(1)
    for step in range(steps):
        batch = int(torch.randint(8, 64, (1,), generator=gen))
        x = torch.randn(batch, 16, generator=gen)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if leak_floats:
            kept.append(torch.zeros(leak_floats))
        if noise_floats:
            size = int(torch.randint(1, noise_floats, (1,), generator=gen))
            carry = torch.zeros(size)
        rec.step(step=step)
    del carry
    return kept


def test_planted_leak_is_flagged_with_its_slope_within_ten_percent(tmp_path: Path) -> None:
    leak_floats = 16_384  # 64 KiB per step, already a multiple of 512 bytes
    with simulate_gpu("256MiB"), Recorder(tmp_path / "run.jsonl", log=False) as rec:
        kept = _train(rec, steps=100, seed=0, leak_floats=leak_floats, noise_floats=50_000)
    assert len(kept) == 100
    leaks = rec.leaks()
    assert len(leaks) == 1
    leak = leaks[0]
    assert leak.metric == "allocated_bytes"
    assert leak.bytes_per_step == pytest.approx(leak_floats * 4, rel=0.10)
    assert leak.start_step <= 10
    assert leak.limit_bytes == 256 * MiB
    assert leak.projected_oom_step is not None and leak.projected_oom_step > 100


@pytest.mark.parametrize("seed", range(20))
def test_seeded_noisy_runs_without_a_leak_raise_no_alarm(seed: int) -> None:
    with simulate_gpu("256MiB"), Recorder(log=False, log_every=10) as rec:
        _train(rec, steps=48, seed=seed, noise_floats=200_000)
    assert rec.leaks() == []
    values = [s["allocated_bytes"] for s in rec.samples]
    assert max(values) - min(values) > 100_000  # the noise really is there


def test_samples_and_file_have_every_field(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    with simulate_gpu("64MiB"), Recorder(path, log=False) as rec:
        keep = torch.zeros(1024)
        rec.step()
        keep2 = torch.zeros(2048)
        rec.step()
    del keep, keep2
    assert rec.source == "simulated"
    first, second = rec.samples
    assert tuple(first) == SAMPLE_FIELDS
    assert (first["step"], second["step"]) == (0, 1)
    assert first["step_seconds"] is None and second["step_seconds"] > 0
    assert second["allocated_bytes"] - first["allocated_bytes"] == 2048 * 4
    assert first["budget_bytes"] == 64 * MiB
    assert first["reserved_bytes"] is None  # the simulated GPU has no caching allocator
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["type"] for r in records] == ["start", "sample", "sample", "end"]
    assert records[1]["allocated_bytes"] == first["allocated_bytes"]
    assert records[0]["source"] == "simulated"
    # issue 22: the start record carries the simulated GPU's budget, not null
    assert records[0]["budget_bytes"] == 64 * MiB


def test_every_n_steps_and_callback_form() -> None:
    rec = Recorder(every=5, log=False, device=SimulatedDevice("1GiB"))
    for step in range(12):
        rec(step)
    rec({"loss": 0.5})  # a callback called with something else counts the call
    rec.close()
    assert [s["step"] for s in rec.samples] == [0, 5, 10]
    with pytest.raises(ConfigError, match="closed"):
        rec.start()


def test_step_numbers_default_to_a_count() -> None:
    with Recorder(log=False, device=SimulatedDevice("1GiB"), every=2) as rec:
        for _ in range(5):
            rec.step()
    assert [s["step"] for s in rec.samples] == [0, 2, 4]


def test_probe_source_reads_a_simulated_device() -> None:
    dev = SimulatedDevice("1GiB", used_by_others="100MiB")
    with Recorder(log=False, device=dev, source="probe") as rec:
        dev.allocate(10 * MiB)
        sample = rec.step()
    assert sample is not None
    assert sample["source"] == "simulated"
    assert sample["allocated_bytes"] == 10 * MiB
    assert sample["device_used_bytes"] == 110 * MiB
    assert sample["total_bytes"] == 2**30


def test_csv_output(tmp_path: Path) -> None:
    path = tmp_path / "run.csv"
    dev = SimulatedDevice("1GiB")
    with Recorder(path, csv=True, log=False, device=dev) as rec:
        rec.step()
        rec.on_event(MemoryEvent("cleanup", 0, "cleanup.every", "emptied the cache"))
        rec.step()
    lines = path.read_text().splitlines()
    assert lines[0].startswith("type,mode,step,time")
    kinds = [line.split(",")[0] for line in lines[1:]]
    assert kinds == ["start", "sample", "event", "sample", "end"]
    assert "emptied the cache" in lines[3]


def test_events_are_recorded_written_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "run.jsonl"
    caplog.set_level(logging.INFO, logger="memfit")
    with Recorder(path, device=SimulatedDevice("1GiB")) as rec:
        rec.step()
        rec.on_event(
            MemoryEvent("cleanup", 0, "cleanup.every", "emptied the cache", {"freed_bytes": 5})
        )
        rec.on_event(MemoryEvent("split", 1, "TrainGuard", "2 micro-batches"))
    assert [e.kind for e in rec.events] == ["cleanup", "split"]
    events = [json.loads(x) for x in path.read_text().splitlines() if '"event"' in x]
    assert [(e["kind"], e["source"]) for e in events] == [
        ("cleanup", "cleanup.every"),
        ("split", "TrainGuard"),
    ]
    assert events[0]["data"] == {"freed_bytes": 5}
    text = caplog.text
    assert "memfit: recording simulated" in text
    assert "cleanup.every at step 0: emptied the cache; now allocated" in text
    assert "TrainGuard split at step 1" in text


def test_leak_warning_goes_through_logging(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="memfit")
    dev = SimulatedDevice("1GiB")
    with Recorder(device=dev, log_every=20, leak_check_seconds=0) as rec:
        for step in range(60):
            dev.allocate(MiB)
            rec.step(step=step)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1  # warned once, not at every check
    assert "possible memory leak: allocated grows 1.00 MiB/step" in warnings[0].getMessage()
    assert "around step 1023" in warnings[0].getMessage()


def test_no_logging_when_log_is_false(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="memfit")
    dev = SimulatedDevice("1GiB")
    with Recorder(device=dev, log=False, log_every=20) as rec:
        for step in range(60):
            dev.allocate(MiB)
            rec.step(step=step)
    assert caplog.records == []
    assert len(rec.leaks()) == 1


class _FragmentedProbe:
    """A probe whose allocator holds far more than its peak (fragmentation)."""

    name = "fake-torch"

    def snapshot(self) -> SystemSnapshot:
        device = DeviceSnapshot(
            index=0,
            name="fake",
            total_bytes=16 * 2**30,
            device_used_bytes=9 * 2**30,
            allocated_bytes=2 * 2**30,
            peak_allocated_bytes=3 * 2**30,
            allocator_reserved_bytes=8 * 2**30,
        )
        return SystemSnapshot(source="fake-torch", devices=(device,))


def test_fragmentation_warns_and_suggests_expandable_segments(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="memfit")
    with Recorder(device=_FragmentedProbe()) as rec:
        rec.step()
    frag = rec.fragmentation()
    assert frag is not None and frag.slack_bytes == 5 * 2**30
    assert "expandable_segments:True" in caplog.text


def test_background_sampling_runs_in_a_daemon_thread_and_stops() -> None:
    dev = SimulatedDevice("1GiB")
    rec = Recorder(device=dev, interval=0.01, log=False)
    with rec:
        dev.allocate(3 * MiB)
        threads = [t for t in threading.enumerate() if t.name == "memfit-recorder"]
        assert threads and all(t.daemon for t in threads)
        deadline = time.monotonic() + 5.0
        while rec.background_ticks < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        rec.step()
    assert not any(t.name == "memfit-recorder" for t in threading.enumerate())
    background = rec.background_samples
    assert len(background) >= 5
    assert background[-1]["allocated_bytes"] == 3 * MiB
    assert background[-1]["source"] == "simulated"
    assert rec.background_cpu_seconds >= 0.0
    ticks = rec.background_ticks
    time.sleep(0.05)
    assert rec.background_ticks == ticks  # stopped


def test_background_samples_go_to_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bg.jsonl"
    dev = SimulatedDevice("1GiB")
    with Recorder(path, device=dev, interval=0.01, log=False) as rec:
        deadline = time.monotonic() + 5.0
        while rec.background_ticks < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    modes = [json.loads(line).get("mode") for line in path.read_text().splitlines()]
    assert modes.count("background") >= 3


def test_oom_in_a_with_block_dumps_the_last_samples(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    keep = []
    with (
        pytest.raises(torch.OutOfMemoryError),
        simulate_gpu("1MiB"),
        Recorder(path, log=False, oom_samples=3) as rec,
    ):
        for step in range(10):
            keep.append(torch.zeros(32_768))  # 128 KiB a step: the 9th does not fit
            rec.step(step=step)
    assert [p.name for p in rec.oom_files] == ["run.oom1.samples.jsonl", "run.oom1.snapshot.pickle"]
    lines = [json.loads(x) for x in rec.oom_files[0].read_text().splitlines()]
    assert [r["step"] for r in lines if r["type"] == "sample"] == [5, 6, 7]
    assert [r["kind"] for r in lines if r["type"] == "event"] == ["oom"]
    assert any('"kind":"oom"' in line for line in path.read_text().splitlines())


def test_oom_events_dump_at_most_max_oom_dumps(tmp_path: Path) -> None:
    rec = Recorder(device=SimulatedDevice("1GiB"), oom_dir=tmp_path, log=False, max_oom_dumps=2)
    with rec:
        rec.step()
        for step in range(4):
            rec.on_event(MemoryEvent("oom", step, "TrainGuard", "out of memory"))
    dumps = sorted(p.name for p in tmp_path.iterdir())
    assert len(dumps) == 2
    assert all(name.endswith(".samples.jsonl") for name in dumps)
    assert len(rec.events) == 4


def test_excepthook_dumps_on_oom_then_calls_the_previous_hook(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Any] = []
    monkeypatch.setattr(sys, "excepthook", lambda *args: seen.append(args[0]))
    rec = Recorder(device=SimulatedDevice("1GiB"), oom_dir=tmp_path, log=False)
    rec.start().install_excepthook()
    rec.step()
    sys.excepthook(ValueError, ValueError("not memory"), None)
    assert seen == [ValueError] and list(tmp_path.iterdir()) == []
    exc = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    sys.excepthook(type(exc), exc, None)
    assert seen == [ValueError, torch.OutOfMemoryError]
    assert len(list(tmp_path.iterdir())) == 1
    rec.close()
    assert sys.excepthook is not None and seen  # previous hook put back
    sys.excepthook(KeyError, KeyError("x"), None)
    assert seen[-1] is KeyError


def test_trainguard_events_reach_the_recorder(tmp_path: Path) -> None:
    from memfit.runtime.guard import TrainGuard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(512, 64)
    y = torch.randn(512, 1)
    with simulate_gpu("1MiB"), Recorder(tmp_path / "g.jsonl", log=False) as rec:
        guard = TrainGuard(
            opt,
            lambda b: torch.nn.functional.mse_loss(model(b[0]), b[1]),
            on_event=rec.on_event,
        )
        for step in range(3):
            guard((x, y))
            rec.step(step=step)
    kinds = {e.kind for e in rec.events}
    assert "split" in kinds
    assert all(e.source == "TrainGuard" for e in rec.events)


def test_bad_settings_raise_config_errors() -> None:
    with pytest.raises(ConfigError, match="every"):
        Recorder(every=0)
    with pytest.raises(ConfigError, match="interval"):
        Recorder(interval=-1.0)
    with pytest.raises(ConfigError, match="unknown source"):
        Recorder(source="nvidia-smi")
    with pytest.raises(ConfigError, match="DeviceProbe"):
        Recorder(device=object())
    with pytest.raises(ConfigError, match="log_every"):
        Recorder(log_every=0)
    with pytest.raises(ConfigError, match="step must be"):
        Recorder(device=SimulatedDevice("1GiB"), log=False).step(step=1.5)  # type: ignore[arg-type]


def test_forced_sources_that_are_not_there() -> None:
    if not torch.cuda.is_available():
        with pytest.raises(BackendUnavailable, match="CUDA"):
            Recorder(source="torch", log=False).start()
    with pytest.raises(BackendUnavailable, match="DeviceProbe"):
        Recorder(source="probe", log=False).start()


def test_no_source_records_step_times_only(monkeypatch: pytest.MonkeyPatch) -> None:
    import memfit.backends.live as live

    monkeypatch.delitem(sys.modules, "memfit.runtime.simulate", raising=False)
    monkeypatch.setattr(live, "resident_bytes", lambda: None)  # no host reading either
    with Recorder(log=False) as rec:
        rec.step()
        sample = rec.step()
    assert rec.source == "none"
    assert sample is not None and sample["allocated_bytes"] is None
    assert sample["step_seconds"] is not None
