"""RL knobs (issue 46, item 7): skrl's mini_batches as a knob (the lever against num_envs),
frame_stack on raster observations, observations stored as uint8/float16 in the buffer, and
"Next best" saying the host RAM each needs when host RAM limits."""

from __future__ import annotations

from typing import Any

import pytest
from _cli_run import run

import memfit
from memfit.core.workload import Workload, load_workload

GiB = 2**30


def _edit(name: str, change: Any) -> Workload:
    data = load_workload(name).model_dump(exclude_none=True)
    change(data)
    return Workload.model_validate(data)


def test_skrl_mini_batches_is_a_knob_that_buys_envs() -> None:
    def as_knob(d: dict[str, Any]) -> None:
        d["settings"].pop("mini_batches")
        d["knobs"]["mini_batches"] = {"choices": [1, 2, 4, 8, 16], "default": 2}

    fixed = memfit.plan("skrl_isaaclab_ppo", gpu="RTX 4060 Ti 8GB")
    free = memfit.plan(_edit("skrl_isaaclab_ppo", as_knob), gpu="RTX 4060 Ti 8GB")
    assert free.fits and free.knobs["mini_batches"] > 2
    grown = int(free.knobs["num_envs"]) * int(free.knobs["rollouts"])
    assert grown > int(fixed.knobs["num_envs"]) * int(fixed.knobs["rollouts"])


def _raster(d: dict[str, Any], **fields: Any) -> None:
    d["observations"]["raster"].update(fields)


def test_raster_frame_stack_and_storage_dtype() -> None:
    base = _edit("dqn_fire_raster@device_replay", lambda d: _raster(d, dtype="float32"))
    stacked = _edit(
        "dqn_fire_raster@device_replay", lambda d: _raster(d, dtype="float32", frame_stack=4)
    )

    def stored(kind: str) -> Workload:
        def change(d: dict[str, Any]) -> None:
            _raster(d, dtype="float32", frame_stack=4)
            d["observations"]["storage_dtype"] = kind

        return _edit("dqn_fire_raster@device_replay", change)

    pins = {"buffer_size": 50_000}
    one = memfit.plan(base, gpu="80GiB", overrides=pins).breakdown["replay_buffer"]
    four = memfit.plan(stacked, gpu="80GiB", overrides=pins).breakdown["replay_buffer"]
    u8 = memfit.plan(stored("uint8"), gpu="80GiB", overrides=pins).breakdown["replay_buffer"]
    f16 = memfit.plan(stored("float16"), gpu="80GiB", overrides=pins).breakdown["replay_buffer"]
    obs = 4 * 64 * 64 * 4  # one float32 raster
    assert four - one == pytest.approx(50_000 * 2 * 3 * obs, rel=1e-9)  # obs and next obs
    assert four - u8 == pytest.approx(50_000 * 2 * 4 * obs * 3 / 4, rel=1e-9)
    assert four - f16 == pytest.approx(50_000 * 2 * 4 * obs / 2, rel=1e-9)
    # the network reads the stack as channels: its first convolution takes 16 of them
    assert (
        memfit.plan(stacked, gpu="80GiB", overrides=pins).breakdown["parameters"]
        > memfit.plan(base, gpu="80GiB", overrides=pins).breakdown["parameters"]
    )


def test_next_best_says_the_host_ram_each_needs(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(
        capsys, "plan", "dqn_fire_raster", "--gpu", "3.68GiB", "--host-memory", "16GiB"
    )
    assert code == 0, err
    lines = out.split("Next best:")[1].split("Note:")[0].strip().splitlines()
    assert lines and all("of host RAM" in line for line in lines)
    hosts = [line.split("needs ")[1].split(" of host RAM")[0] for line in lines]
    assert len(set(hosts)) == len(hosts)  # each its own figure
