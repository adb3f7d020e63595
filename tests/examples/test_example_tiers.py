"""Issue 22: the Brax example's tier table scales the memory knob and holds how PPO learns.

Runs without brax (the example imports it only in ``main``); the full example, with brax,
is ``pytest -m examples``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

import memfit

RUN = Path(__file__).resolve().parents[2] / "examples" / "brax_ppo" / "run.py"


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("brax_ppo_run", RUN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tier_table_holds_the_learning_hyperparameters() -> None:
    run = _example()
    args = run.parse_args(["--batch-size", "1024", "--num-minibatches", "32",
                           "--unroll-length", "10"])  # fmt: skip
    assert run.tier_pins(args) == {"batch_size": 1024, "num_minibatches": 32, "unroll_length": 10}
    # told otherwise: scale two knobs, or hold nothing
    both = run.parse_args(["--scale", "num_envs,batch_size", "--batch-size", "512"])
    assert run.tier_pins(both) == {"num_minibatches": 2, "unroll_length": 5}
    assert run.tier_pins(run.parse_args(["--hold", ""])) == {}
    with pytest.raises(memfit.ConfigError, match="not a Brax PPO knob"):
        run.tier_pins(run.parse_args(["--hold", "learning_rate"]))


def test_a_held_tier_plan_scales_only_num_envs() -> None:
    """The planner side, with brax's rules, on the bundled humanoid's recorded measurements."""
    from memfit.core.workload import load_workload
    from memfit.planning import plan

    w = load_workload("brax_humanoid_ppo")
    held = {"batch_size": 1024, "num_minibatches": 32, "unroll_length": 10}
    plans = [plan(w, g, held, measure="recorded") for g in ("RTX 3060 Ti", "RTX 4090")]
    for p in plans:
        assert {k: p.knobs[k] for k in held} == held
    assert plans[0].knobs["num_envs"] <= plans[1].knobs["num_envs"]
