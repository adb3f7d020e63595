"""A training loop of several jitted calls replayed through the BFC allocator
(``memfit.estimate.xla.program``)."""

from __future__ import annotations

import json

import pytest

from memfit.errors import ConfigError
from memfit.estimate.xla.program import (
    Allocate,
    Call,
    PhaseBuffers,
    Rebind,
    Release,
    phase_buffers,
    replay_program,
)

MiB = 2**20

ROLLOUT = PhaseBuffers("rollout", ((22 * MiB, 4096), (90_000,)), temp_bytes=2 * MiB)
UPDATE = PhaseBuffers(
    "update", ((3 * MiB, 3 * MiB, 256), (4,)), temp_bytes=38 * MiB, first_call_bytes=50 * MiB
)
PHASES = {"rollout": ROLLOUT, "update": UPDATE}
LOOP = [
    Allocate("key", (8,)),
    Call("rollout", ("batch", "carry_new")),
    Call("update", ("state_new", "loss")),
    Rebind("carry", "carry_new"),
    Rebind("state", "state_new"),
    Release("batch"),
    Release("loss"),
    Release("key"),
]
INITIAL = {"state": [3 * MiB, 3 * MiB, 256], "carry": [90_000]}


def test_the_replay_counts_what_the_loop_holds_and_the_first_calls_autotuning() -> None:
    out = replay_program(INITIAL, PHASES, LOOP, limit_bytes=1 << 30, iterations=6)
    # during the update: the state twice, the carry twice, the batch, the temporaries
    live = 2 * (6 * MiB + 256) + 2 * 90_112 + 22 * MiB + 4096 + 256 + 256 + 38 * MiB
    assert out.live_peak_bytes >= live
    assert out.peak_bytes_in_use >= out.live_peak_bytes
    first_call = 6 * MiB + 256 + 2 * 90_112 + 22 * MiB + 4096 + 256 + 50 * MiB
    assert out.peak_bytes_in_use >= first_call
    assert len(out.iteration_peaks) == 6
    assert list(out.iteration_peaks) == sorted(out.iteration_peaks)
    assert out.out_of_memory is None and out.pool_bytes == 1 << 30
    assert out.assumptions
    plain = out.to_dict()
    assert plain["peak_bytes_in_use"] == out.peak_bytes_in_use
    assert plain["iteration_peaks"] == list(out.iteration_peaks)
    json.dumps(plain)


def test_freed_arrays_leave_holes_a_later_request_takes_whole() -> None:
    """The second batch lands in the hole the first batch and the old state left, less than
    twice its size: the chunk counts whole, above what the arrays need."""
    update = PhaseBuffers("update", ((8 * MiB,), (256,)), temp_bytes=30 * MiB)
    rollout = PhaseBuffers("rollout", ((10 * MiB,),), temp_bytes=MiB)
    loop = [
        Call("rollout", ("batch",)),
        Call("update", ("new", "loss")),
        Rebind("state", "new"),
        Release("batch"),
        Release("loss"),
    ]
    phases = {"update": update, "rollout": rollout}
    out = replay_program({"state": [8 * MiB]}, phases, loop, limit_bytes=1 << 30)
    assert out.live_peak_bytes == (8 + 10 + 8) * MiB + 256 + 30 * MiB
    assert out.peak_bytes_in_use == out.live_peak_bytes + 8 * MiB
    assert out.peak_at == "iteration 2, update"


def test_a_growing_pool_and_one_that_runs_out() -> None:
    grown = replay_program(INITIAL, PHASES, LOOP, limit_bytes=1 << 30, preallocate=False)
    assert grown.pool_bytes < 1 << 30
    assert grown.peak_bytes_in_use >= grown.live_peak_bytes
    small = replay_program(INITIAL, PHASES, LOOP, limit_bytes=40 * MiB)
    assert small.out_of_memory is not None and small.out_of_memory.startswith("iteration 1")


@pytest.mark.parametrize(
    ("loop", "initial", "key_path"),
    [
        ([Call("nope", ("x",))], {}, "loop.0.phase"),
        ([Call("update", ("only_one",))], {}, "loop.0.outputs"),
        (["not an event"], {}, "loop.0"),
        ([], {"state": [-1]}, "initial.state"),
        ([], {"state": ["big"]}, "initial.state"),
        ([Release("typo")], {"state": [8]}, "loop.0"),
        ([], {"state": 8}, "initial.state"),
        ([Allocate("key", ("8",))], {}, "loop.0.sizes"),
        ([Call("rollout", ("a", "b")), Rebind("state", "nope")], {"state": [8]}, "loop.1"),
    ],
)
def test_a_bad_loop_is_a_config_error(loop: list, initial: dict, key_path: str) -> None:
    with pytest.raises(ConfigError) as err:
        replay_program(initial, PHASES, loop, limit_bytes=1 << 30)
    assert err.value.key_path == key_path
    assert err.value.hint


def test_iterations_must_be_positive() -> None:
    with pytest.raises(ConfigError) as err:
        replay_program(INITIAL, PHASES, LOOP, limit_bytes=1 << 30, iterations=0)
    assert err.value.key_path == "iterations"


def test_phase_buffers_needs_a_gpu_compile() -> None:
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    def step(x: jax.Array) -> tuple[jax.Array, jax.Array]:
        return x * 2, jnp.sum(x)

    x = jax.ShapeDtypeStruct((1024, 16), jnp.float32)
    with pytest.raises(ConfigError) as err:
        phase_buffers("step", jax.jit(step), x, compiler="cpu")
    assert err.value.key_path == "gpu"


def test_phase_buffers_for_a_card() -> None:
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    from memfit.estimate.xla import gpu as xla_gpu

    if xla_gpu.gpu_target_missing():
        pytest.skip("the gpu-target extra is not installed")

    def step(x: jax.Array) -> tuple[jax.Array, jax.Array]:
        return jnp.tanh(x @ x.T) * 2, jnp.sum(x)

    x = jax.ShapeDtypeStruct((512, 64), jnp.float32)
    buffers, est = phase_buffers("step", jax.jit(step), x, gpu="RTX 4090", compiler="gpu")
    assert buffers.outputs == ((512 * 512 * 4,), (4,))
    assert buffers.temp_bytes == est.temp_bytes
    assert buffers.first_call_bytes == est.first_call_bytes > 0
