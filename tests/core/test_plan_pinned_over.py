"""A pinned configuration over its card names the term the pins grew and offers what would
fit instead (issue 46, item 4: ACT with --set num_envs=16 on an 8 GB laptop card)."""

from __future__ import annotations

import memfit


def test_act_over_its_card_names_the_grown_term_and_what_fits() -> None:
    plan = memfit.plan("act_dual_camera", gpu="RTX 3070 Laptop", overrides={"num_envs": 16})
    assert not plan.fits
    # the renderer's base is the largest term but a fixed cost: the cameras grew with num_envs
    assert plan.breakdown["renderer_base"] > plan.breakdown["renderer_cameras"]
    assert plan.binding == "renderer_cameras"
    fitting = {o["change"]: o for o in plan.would_fit if o["fits"]}
    fewer = [o for change, o in fitting.items() if change.startswith("a smaller num_envs")]
    assert len(fewer) == 1 and 1 <= fewer[0]["knobs"]["num_envs"] < 16
    assert fewer[0]["predicted_bytes"] <= plan.budget_bytes
    smaller = [o for change, o in fitting.items() if change.startswith("smaller cameras")]
    assert len(smaller) == 1 and smaller[0]["knobs"]["num_envs"] == 16
    assert "256x256" in next(c for c in fitting if c.startswith("smaller cameras"))


def test_fixed_costs_alone_keep_the_largest_term() -> None:
    # at the knob's smallest value nothing grew: the largest term is named
    plan = memfit.plan("act_dual_camera", gpu="4GiB", overrides={"num_envs": 1})
    assert not plan.fits
    assert plan.binding == max(
        (n for n in plan.breakdown if n not in ("cuda_context", "cublas_workspace")),
        key=lambda n: plan.breakdown[n],
    )
