"""Run each bundled example at its small setting (``pytest -m examples``).

Each runs in a subprocess, as a user would run it, and must exit 0 and print the lines
that show memfit at work: the plan, the guard or the check, and the recorder.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from memfit.allocator.xla_fraction import recommended_xla_fraction, xla_fraction_variable
from memfit.hardware.catalog import gpu

pytestmark = pytest.mark.examples

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def _run(script: str, *args: str, timeout: int = 600, tmp: Path | None = None) -> str:
    """Run an example as a user would; ``tmp``: its temporary folder (``TMPDIR``)."""
    env = dict(os.environ) if tmp is None else {**os.environ, "TMPDIR": str(tmp)}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    return out


def test_brax_ppo_small(tmp_path: Path) -> None:
    pytest.importorskip("brax", reason="brax is an optional extra (integrations)")
    fitted = tmp_path / "fitted.yaml"
    out = _run(
        "brax_ppo/run.py",
        "--tiers", "8,12,16,24",
        "--out", str(fitted),
        "--log", str(tmp_path / "brax.jsonl"),
    )  # fmt: skip
    assert "allocator settings: XLA_PYTHON_CLIENT_PREALLOCATE=false" in out
    assert "check_ppo: ok" in out
    assert "(jax.eval_shape)" in out
    assert "measured: " in out and "training step compiled at 3 settings" in out
    assert "trained " in out and "memory log:" in out
    configs = yaml.safe_load(fitted.read_text())["configs"]
    assert [c["gpu"] for c in configs] == [
        "NVIDIA GeForce RTX 3060 Ti",
        "NVIDIA GeForce RTX 4070",
        "NVIDIA GeForce RTX 4080",
        "NVIDIA GeForce RTX 4090",
    ]
    held = {(c["ppo"]["batch_size"], c["ppo"]["num_minibatches"], c["ppo"]["unroll_length"])
            for c in configs}  # fmt: skip
    assert held == {(16, 2, 5)}  # issue 22: the tier table holds how PPO learns
    assert "tier table holds batch_size=16, num_minibatches=2, unroll_length=5" in out
    for c in configs:
        k = c["ppo"]
        assert k["batch_size"] * k["num_minibatches"] % k["num_envs"] == 0
        assert c["predicted_bytes"] <= c["budget_bytes"]
        # the one XLA fraction memfit recommends for the card (memfit plan and memfit env
        # say the same: recommended_xla_fraction decides it); 0.85 on an 8 GB card
        advice = recommended_xla_fraction(gpu(c["gpu"]))
        assert c["env"][xla_fraction_variable()[0]] == advice.value
        assert {"env_state", "env_step_temporaries", "sgd_temporaries"} <= set(c["breakdown"])
    assert (tmp_path / "brax.jsonl").stat().st_size > 0


def test_brax_ppo_rejects_bad_arguments_before_brax(tmp_path: Path) -> None:
    pytest.importorskip("brax", reason="brax is an optional extra (integrations)")
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "brax_ppo/run.py"), "--num-envs", "512",
         "--batch-size", "128", "--num-minibatches", "2", "--skip-train"],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 1
    assert "nearest valid: num_minibatches=4 or batch_size=256" in done.stdout


def test_dqn_fire_small(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    log = tmp_path / "dqn.jsonl"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    out = _run("dqn_fire/run.py", "--log", str(log), tmp=scratch)
    assert "plan enhanced:" in out and "plan basic   :" in out
    assert "chosen: " in out and "replay buffer:" in out
    assert "memfit: recording simulated" in out
    # the first OOM is logged with its dump ("out of memory at step N ...; wrote ..."),
    # later ones as "TrainGuard oom"; one is injected at this setting since main's guard work
    assert "out of memory" in out and "TrainGuard retry" in out and "OOMs survived" in out
    assert "cleanup.after_call(save_checkpoint) at step 49:" in out  # the loop's step
    assert "simulated GPU: peak" in out
    assert log.stat().st_size > 0
    assert not list(scratch.glob("dqn_fire_ckpt_*"))  # the checkpoints went with the run


def test_act_dual_camera_small(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = _run("act_dual_camera/run.py", "--log", str(tmp_path / "act.jsonl"))
    assert "plan for NVIDIA GeForce RTX 3060 Ti: 2 rollouts x 2 cameras at" in out
    assert "every10" in out and "on_pressure" in out
    assert "cleanup.every at step 9:" in out  # the 10th step, stamped as the loop counts
    assert "on-pressure cleaned" in out
    assert (tmp_path / "act.every10.jsonl").stat().st_size > 0


def test_autoconfig_rehearsal() -> None:
    out = _run("autoconfig_rehearsal.py", timeout=120)
    assert "{'num_envs': 2} fits" in out
    assert "their terms are left out of the plan" in out
    assert "'PYTORCH_ALLOC_CONF': 'expandable_segments:True'" in out


def test_sweep_optuna_small() -> None:
    pytest.importorskip("optuna", reason="memfit[optuna] is not installed")
    out = _run("sweep_optuna/run.py", "--trials", "4", "--steps", "10")
    assert "configurations fit" in out
    assert "4 trials: 4 complete, 0 pruned for memory" in out


def test_sweep_ray_smoke() -> None:
    pytest.importorskip("ray", reason="memfit[ray] is not installed")
    out = _run("sweep_ray/run.py", "--smoke", "--steps", "6")
    assert "configurations fit a card of the cluster" in out
    assert "4 trials, 0 failed" in out
    assert out.count("measured peak") == 4
