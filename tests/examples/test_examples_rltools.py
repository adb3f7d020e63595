"""The issue-25 examples (skrl, off-policy SAC, metrics), each run as a user runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.examples

ROOT = Path(__file__).resolve().parents[2]


def _run(script: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / script), *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    return out


def test_skrl_ppo() -> None:
    pytest.importorskip("skrl", reason="the example trains skrl's PPO")
    out = _run("skrl_ppo/run.py", "--timesteps", "32")
    assert "plan on NVIDIA GeForce RTX 4060 Ti: num_envs=" in out
    assert "skrl:oom, skrl:retry" in out and "RolloutGuard:oom" in out
    assert "recorder: 32 samples from the trainer" in out
    assert "same transitions as a run without faults: True; same parameters: True" in out


def test_offpolicy_sac() -> None:
    out = _run("offpolicy_sac/run.py")
    assert "mujoco#1431 as reported:" in out and "replay_buffer (49.62 GiB)" in out
    assert "mujoco#1431 answer: pass max_replay_size to sac.train: max_replay_size=" in out
    assert "sac_pixels_8gb@sb3_buffer on NVIDIA GeForce RTX 4060 Ti" in out


def test_metrics(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client", reason="the example serves Prometheus metrics")
    pytest.importorskip("tensorboard", reason="the example writes TensorBoard events")
    out = _run("metrics/run.py", "--logdir", str(tmp_path / "tb"), "--steps", "8")
    assert 'memfit_events_total{kind="oom",source="TrainGuard"}' in out
    assert "memfit_step 7.0" in out
    assert "8 points of memory/allocated_mib" in out
