"""Tables of cards in one command: --gpu A,B and --tiers, laptop cards and the XLA fraction
in the tier table, and which knob's maximum to raise where a range or a rule limits the
plan (issue 46, item 5)."""

from __future__ import annotations

import pytest
from _cli_run import run, run_json, user_error

import memfit
from memfit.cli.plan import tier_gpus
from memfit.planning import TIER_GPUS


def test_gpu_list_plans_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "plan", "dqn_fire_raster", "--gpu", "8GiB,12GiB", "--json")
    assert [p["gpu_total_bytes"] for p in data["plans"]] == [8 * 2**30, 12 * 2**30]
    code, _out, err = run(capsys, "plan", "dqn_fire_raster", "--gpu", "8GiB,,12GiB")
    user_error(code, err, "--gpu", "empty GPU name")


def test_tiers_name_one_card_per_tier(capsys: pytest.CaptureFixture[str]) -> None:
    assert tier_gpus("8,12,16,24") == ["RTX 3060 Ti", "RTX 4070", "RTX 4080", "RTX 4090"]
    assert tier_gpus("48") == ["48GB"]
    data = run_json(capsys, "plan", "dqn_fire_raster", "--tiers", "8,12", "--json")
    assert [p["gpu"] for p in data["plans"]] == [
        "NVIDIA GeForce RTX 3060 Ti",
        "NVIDIA GeForce RTX 4070",
    ]
    code, _out, err = run(capsys, "plan", "dqn_fire_raster", "--tiers", "eight")
    user_error(code, err, "--tiers")


def test_the_tier_table_has_laptop_cards_and_the_xla_fraction(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert any("Laptop" in name for name in TIER_GPUS)
    # the 4 GB tier's card gets 0.85, the larger ones 0.90 (since the context by card of
    # 2026-11-29 the 8 GB tier's RTX 3060 Ti gets 0.90 too)
    code, out, err = run(capsys, "plan", "brax_humanoid_ppo", "--tiers", "4,8,80")
    assert code == 0, err
    assert "XLA frac" in out
    assert "0.85" in out and "0.90" in out
    # the 80 GB card is limited by knobs.num_envs's maximum, and the note says so
    assert "raise knobs.num_envs.max" in " ".join(out.split())


def test_a_rule_that_limits_the_plan_says_what_to_raise() -> None:
    plan = memfit.plan(
        "brax_humanoid_ppo", gpu="H100", overrides={"batch_size": 64, "num_minibatches": 4}
    )
    assert plan.binding is not None and plan.binding.startswith("rule: ")
    note = next(n for n in plan.notes if n.startswith("limited by a rule"))
    assert "batch_size=64" in note and "num_minibatches=4" in note and "--set" in note
