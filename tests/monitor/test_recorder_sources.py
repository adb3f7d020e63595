"""Which numbers the Recorder reads: torch.cuda and JAX (through fakes), and the order."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
from _fake_torch_cuda import FakeTorchCuda

import memfit.backends.live as live
import memfit.monitor._oom_dump as oom_dump
import memfit.monitor.recorder as recorder_module
from memfit.backends.simulated import SimulatedDevice
from memfit.monitor.recorder import Recorder
from memfit.runtime.events import MemoryEvent

GiB = 2**30


class _FakeCuda(FakeTorchCuda):
    """The parts of ``torch.cuda`` the Recorder reads, with set figures."""

    def __init__(self) -> None:
        super().__init__(
            free=70 * GiB,
            total=80 * GiB,
            allocated=GiB,
            reserved=3 * GiB,
            peak_allocated=2 * GiB,
            peak_reserved=3 * GiB,
        )
        self.history: list[dict[str, Any]] = []
        self.memory = types.SimpleNamespace(
            _record_memory_history=lambda **kw: self.history.append(kw),
            _snapshot=lambda: {"segments": [], "device_traces": []},
        )

    def current_device(self) -> int:
        return 0

    def get_device_properties(self, index: int) -> Any:
        return types.SimpleNamespace(total_memory=80 * GiB)


@pytest.fixture
def fake_torch(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    fake = types.SimpleNamespace(cuda=_FakeCuda())
    # The one live-memory reader looks torch up among the imported modules: make it this.
    monkeypatch.setattr(live, "torch_cuda_available", lambda: fake)
    monkeypatch.setattr(live, "torch_cuda", lambda: fake)
    monkeypatch.setattr(recorder_module, "_torch_cuda", lambda: fake)
    monkeypatch.setattr(oom_dump, "torch_cuda_available", lambda: fake)
    return fake


def test_torch_cuda_figures(fake_torch: types.SimpleNamespace) -> None:
    with Recorder(log=False, budget="40GiB") as rec:
        sample = rec.step()
    assert rec.source == "torch.cuda"
    assert sample is not None
    assert sample["allocated_bytes"] == GiB
    assert sample["reserved_bytes"] == 3 * GiB
    assert sample["peak_allocated_bytes"] == 2 * GiB
    assert sample["device_used_bytes"] == 10 * GiB
    assert sample["total_bytes"] == 80 * GiB
    assert sample["budget_bytes"] == 40 * GiB


def test_torch_comes_before_a_probe(fake_torch: types.SimpleNamespace) -> None:
    with Recorder(log=False, device=SimulatedDevice("1GiB")) as rec:
        rec.step()
    assert rec.source == "torch.cuda"


def test_cuda_oom_dump_has_a_snapshot_and_history_is_bounded(
    fake_torch: types.SimpleNamespace, tmp_path: Any
) -> None:
    with Recorder(tmp_path / "run.jsonl", log=False, memory_history=50_000) as rec:
        rec.step()
        rec.on_event(MemoryEvent("oom", 0, "TrainGuard", "CUDA out of memory"))
    names = sorted(p.name for p in rec.oom_files)
    assert names == ["run.oom1.samples.jsonl", "run.oom1.snapshot.pickle"]
    # history switched on with the bound at start, and off again at close
    assert fake_torch.cuda.history == [{"max_entries": 50_000}, {"enabled": None}]


def test_jax_memory_stats(monkeypatch: pytest.MonkeyPatch) -> None:
    stats = {
        "bytes_in_use": 5 * GiB,
        "peak_bytes_in_use": 6 * GiB,
        "bytes_limit": 60 * GiB,
        "bytes_reserved": 7 * GiB,
    }
    gpu = types.SimpleNamespace(platform="gpu", memory_stats=lambda: stats)
    cpu = types.SimpleNamespace(platform="cpu", memory_stats=lambda: None)
    fake_jax = types.SimpleNamespace(devices=lambda: [cpu, gpu])
    monkeypatch.setattr(recorder_module, "_torch_cuda", lambda: None)
    monkeypatch.setitem(sys.modules, "jax", fake_jax)
    with Recorder(log=False) as rec:
        sample = rec.step()
    assert rec.source == "jax"
    assert sample is not None
    assert sample["allocated_bytes"] == 5 * GiB
    assert sample["peak_allocated_bytes"] == 6 * GiB
    assert sample["reserved_bytes"] == 7 * GiB
    assert sample["budget_bytes"] == 60 * GiB
    assert sample["total_bytes"] is None


def test_jax_on_cpu_only_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = types.SimpleNamespace(platform="cpu", memory_stats=lambda: None)
    monkeypatch.setattr(recorder_module, "_torch_cuda", lambda: None)
    monkeypatch.setitem(sys.modules, "jax", types.SimpleNamespace(devices=lambda: [cpu]))
    with Recorder(log=False, device=SimulatedDevice("1GiB")) as rec:
        rec.step()
    assert rec.source == "simulated"  # the probe's name
