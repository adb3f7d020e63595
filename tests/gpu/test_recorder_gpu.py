"""The Recorder on a real CUDA device (skips itself without one)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from memfit.monitor.recorder import Recorder


def test_step_samples_are_torch_cuda_figures(tmp_path: Path) -> None:
    x = torch.zeros(1024, 1024, device="cuda")
    with Recorder(tmp_path / "run.jsonl", log=False) as rec:
        sample = rec.step()
    assert rec.source == "torch.cuda"
    assert sample is not None
    assert sample["allocated_bytes"] == torch.cuda.memory_allocated()
    assert sample["reserved_bytes"] == torch.cuda.memory_reserved()
    assert sample["total_bytes"] == torch.cuda.get_device_properties(0).total_memory
    assert sample["device_used_bytes"] >= sample["reserved_bytes"]
    del x


def test_planted_cuda_leak_is_flagged() -> None:
    kept = []
    with Recorder(log=False) as rec:
        for step in range(100):
            kept.append(torch.zeros(262_144, device="cuda"))  # 1 MiB a step
            rec.step(step=step)
    leaks = rec.leaks()
    assert len(leaks) == 1
    assert leaks[0].bytes_per_step == pytest.approx(2**20, rel=0.10)
    del kept


def test_oom_writes_a_memory_snapshot(tmp_path: Path) -> None:
    total = torch.cuda.get_device_properties(0).total_memory
    with (
        pytest.raises(torch.OutOfMemoryError),
        Recorder(tmp_path / "run.jsonl", log=False, memory_history=10_000) as rec,
    ):
        rec.step()
        torch.empty(2 * total, dtype=torch.uint8, device="cuda")
    snapshot_files = [p for p in rec.oom_files if p.suffix == ".pickle"]
    assert len(snapshot_files) == 1
    with snapshot_files[0].open("rb") as handle:
        snapshot = pickle.load(handle)
    assert "segments" in snapshot
