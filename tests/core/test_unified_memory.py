"""Issue 41, item 4: on a card whose memory the CPU shares (Jetson), the device buffers and
what would live in host RAM are one pool, and the plan says so."""

from __future__ import annotations

import memfit
from memfit.planning import feasible


def test_a_jetson_plan_counts_device_and_host_in_one_pool() -> None:
    plan = memfit.plan("dqn_fire_raster", gpu="Jetson Orin Nano 8GB")
    assert plan.host_bytes == 0  # nothing apart from the shared memory
    assert "replay_buffer" in plan.breakdown  # the buffer counts against the one budget
    assert plan.predicted_bytes <= plan.budget_bytes < 8 * 2**30
    assert plan.host_memory_bytes is None  # no host RAM of this machine relied on
    assert any(n.startswith("unified memory: the CPU and the GPU share") for n in plan.notes)


def test_a_discrete_card_keeps_the_buffer_in_host_ram_and_says_nothing_of_one_pool() -> None:
    plan = memfit.plan("dqn_fire_raster", gpu="RTX 4070", host_memory_bytes=64 * 2**30)
    assert plan.host_bytes > 0 and "replay_buffer" not in plan.breakdown
    assert not any(n.startswith("unified memory") for n in plan.notes)


def test_feasible_and_plan_keep_the_same_host_reserve() -> None:
    """The sweep's space and the plan take the same process baseline and OS reserve off
    the host RAM: the plan's choice is one of the feasible configurations."""
    for gpu in ("3.68GiB", "Jetson Orin Nano 8GB"):
        plan = memfit.plan("dqn_fire_raster", gpu=gpu, host_memory_bytes=16 * 2**30)
        space = feasible("dqn_fire_raster", gpu=gpu, host_memory_bytes=16 * 2**30)
        assert plan.knobs["buffer_size"] == max(space.values("buffer_size"))
