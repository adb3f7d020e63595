"""Isaac Sim with the GUI on a card smaller than the viewport's one reading (issue 46,
item 9): the figure says it is one reading on a larger card and is not counted as that
card's fixed cost."""

from __future__ import annotations

import pytest

import memfit
from memfit.core.simulator_figures import SHARED, VIEWPORT_CARD_BYTES, viewport_on
from memfit.core.workload import load_workload
from memfit.errors import InfeasiblePlan


def _gui(name: str = "act_dual_camera") -> object:
    w = load_workload(name)
    assert w.simulator is not None
    return w.model_copy(update={"simulator": w.simulator.model_copy(update={"headless": False})})


def test_the_viewport_on_a_smaller_card_is_not_the_larger_cards_reading() -> None:
    small, basis = viewport_on("NVIDIA GeForce RTX 3070 Laptop GPU")
    assert small < SHARED.viewport_bytes
    assert small == round(SHARED.viewport_bytes * 8192 * 2**20 / VIEWPORT_CARD_BYTES)
    assert "one reading on a larger card" in basis and "assumption" in basis
    large, basis = viewport_on("NVIDIA GeForce RTX 4090")
    assert large == SHARED.viewport_bytes and "one reading on another card" in basis
    assert viewport_on("GPU with 8192MiB")[0] == small


def test_the_plan_says_what_the_viewport_rests_on() -> None:
    with pytest.raises(InfeasiblePlan) as info:
        memfit.plan(_gui(), gpu="RTX 3070 Laptop")  # type: ignore[arg-type]
    text = str(info.value)
    assert "the GUI's viewport counts" in text and "one reading on a larger card" in text
    plan = memfit.plan(_gui(), gpu="RTX 4090")  # type: ignore[arg-type]
    assert plan.breakdown["viewport"] == SHARED.viewport_bytes
    assert any("one reading on another card" in n for n in plan.notes)
