"""core.plan.feasible_space / memfit.planning.feasible: every configuration that keeps the
rules and fits, by the planner's own search (issue 24)."""

from __future__ import annotations

import itertools
import math

import pytest

import memfit
from memfit.core.constraints import check
from memfit.core.plan import feasible_space, plan_for_gpu
from memfit.core.workload import load_workload
from memfit.errors import ConfigError, InfeasiblePlan
from memfit.hardware.catalog import gpu
from memfit.planning import feasible


@pytest.mark.parametrize(
    ("name", "card"),
    [("brax_humanoid_ppo@quick", "RTX 4070"), ("dqn_fire_raster@device_replay", "RTX 3060")],
)
def test_the_space_is_every_fitting_valid_configuration(name: str, card: str) -> None:
    workload = load_workload(name)
    space = feasible_space(workload, gpu(card))
    declared = math.prod(len(k.values()) for k in workload.knobs.values())
    assert 0 < len(space) < declared
    found = {tuple(c[n] for n in space.order) for c in space.configs}
    assert len(found) == len(space)  # no duplicates
    for config, predicted in zip(space.configs, space.predicted_bytes, strict=True):
        assert predicted <= space.budget_bytes
        assert check(workload, {k: v for k, v in config.items() if isinstance(v, int)}) == []
    # a configuration left out is one that breaks a rule or does not fit
    for values in itertools.product(*(space.domains[n] for n in space.order)):
        if values in found:
            continue
        pins = dict(zip(space.order, values, strict=True))
        broken = check(workload, pins) != []
        pinned = plan_for_gpu(workload, gpu(card), pins) if not broken else None
        assert broken or (pinned is not None and not pinned.fits), pins
    # the plan's choice is one of them
    assert plan_for_gpu(workload, gpu(card)).knobs in space.configs


def test_values_and_index() -> None:
    space = feasible("brax_humanoid_ppo@quick", gpu="RTX 4070")
    envs = space.values("num_envs")
    assert envs == tuple(sorted({int(c["num_envs"]) for c in space.configs}))
    given = {"num_envs": envs[0]}
    after = space.values("batch_size", given)
    assert after and all(
        any(c["num_envs"] == envs[0] and c["batch_size"] == b for c in space.configs) for b in after
    )
    assert space.index(space.configs[3]) == 3
    assert space.index({"num_envs": 3}) is None
    with pytest.raises(ConfigError, match="not a searched knob"):
        space.values("lr")


def test_fixed_knobs_pin_the_space_and_nothing_fitting_is_an_error() -> None:
    space = feasible("brax_humanoid_ppo", gpu="RTX 4070", fixed={"num_envs": 4096})
    assert space.domains["num_envs"] == (4096,)
    assert {c["num_envs"] for c in space.configs} == {4096}
    with pytest.raises(InfeasiblePlan):
        feasible("brax_humanoid_ppo", gpu="64MiB")
    every = dict(memfit.plan("act_dual_camera", gpu="RTX 4090").knobs)
    pinned = feasible("act_dual_camera", gpu="RTX 4090", fixed=every)
    assert list(pinned.configs) == [every]
