"""XLA memory analysis: byte counts against hand-computed sizes, allocator settings, Brax helper."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import pytest

from memfit.errors import ConfigError, EstimateError
from memfit.estimate.xla.step import (
    env_state_bytes,
    estimate_jax,
    estimate_jax_sweep,
    preallocation_from_env,
    tree_nbytes,
)
from memfit.hardware.catalog import gpu as lookup_gpu
from memfit.hardware.cuda import cuda_context_bytes


def _layer(x: Any, w: Any) -> Any:
    return jnp.tanh(x @ w)


def test_argument_and_output_bytes_match_the_shapes() -> None:
    x = jax.ShapeDtypeStruct((128, 256), jnp.float32)
    w = jax.ShapeDtypeStruct((256, 64), jnp.float32)
    est = estimate_jax(_layer, x, w)
    assert est.argument_bytes == (128 * 256 + 256 * 64) * 4
    assert est.output_bytes == 128 * 64 * 4
    assert est.alias_bytes == 0
    assert est.executable_peak_bytes >= est.argument_bytes + est.output_bytes
    assert est.backend == "cpu"
    assert est.device_used_bytes is None  # CPU backend and no GPU named


def test_real_arrays_and_shape_structs_give_the_same_analysis() -> None:
    x = jnp.ones((32, 16), jnp.float32)
    w = jnp.ones((16, 8), jnp.float32)
    real = estimate_jax(_layer, x, w)
    abstract = estimate_jax(
        _layer, jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(w.shape, w.dtype)
    )
    assert real.to_dict() == abstract.to_dict()


def test_donated_argument_shows_as_alias() -> None:
    double = jax.jit(lambda x: x * 2, donate_argnums=0)
    est = estimate_jax(double, jax.ShapeDtypeStruct((1024,), jnp.float32))
    assert est.alias_bytes == 4096
    assert est.executable_peak_bytes == 4096  # the output reuses the input buffer


def test_sweep_fits_bytes_per_item() -> None:
    w = jax.ShapeDtypeStruct((256, 64), jnp.float32)
    sweep = estimate_jax_sweep(
        _layer, lambda b: (jax.ShapeDtypeStruct((b, 256), jnp.float32), w), [64, 128, 256]
    )
    assert sweep.fit is not None
    # Every item adds at least its input row and its output row.
    assert sweep.fit.slope >= (256 + 64) * 4
    assert [p.batch_size for p in sweep.points] == [64, 128, 256]
    with pytest.raises(ConfigError, match="positive integer"):
        estimate_jax_sweep(_layer, lambda b: (), [0])


def test_device_level_prediction_follows_the_preallocation_policy() -> None:
    spec = lookup_gpu("H100")
    x = jax.ShapeDtypeStruct((128, 256), jnp.float32)
    w = jax.ShapeDtypeStruct((256, 64), jnp.float32)
    default = estimate_jax(_layer, x, w, gpu="H100", environ={}, compiler="cpu")
    own = default.executable_peak_bytes + default.generated_code_bytes
    assert default.device_used_bytes == int(spec.total_bytes * 0.75) + cuda_context_bytes(spec)
    half = estimate_jax(
        _layer, x, w, gpu="H100", environ={"XLA_PYTHON_CLIENT_MEM_FRACTION": ".5"}, compiler="cpu"
    )
    assert half.device_used_bytes == int(spec.total_bytes * 0.5) + cuda_context_bytes(spec)
    lazy = estimate_jax(
        _layer,
        x,
        w,
        gpu="H100",
        environ={"XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
        compiler="cpu",
    )
    assert lazy.device_used_bytes == own + cuda_context_bytes(spec)


def test_preallocation_settings_are_validated() -> None:
    assert preallocation_from_env({"XLA_CLIENT_MEM_FRACTION": "0.9"}).fraction == 0.9
    assert preallocation_from_env({"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}).platform_allocator
    with pytest.raises(ConfigError, match="XLA_PYTHON_CLIENT_MEM_FRACTION"):
        preallocation_from_env({"XLA_PYTHON_CLIENT_MEM_FRACTION": "1.5"})
    # read as jaxlib reads it (the one reading, memfit.allocator.settings.read_jax_env):
    # only false / False / 0 turn preallocation off
    for text, expected in (("maybe", True), ("no", True), ("FALSE", True), ("0", False)):
        got = preallocation_from_env({"XLA_PYTHON_CLIENT_PREALLOCATE": text}).preallocate
        assert got is expected, text


def test_value_dependent_python_control_flow_is_an_estimate_error() -> None:
    def step(x: Any) -> Any:
        if x.sum() > 0:
            return x
        return -x

    with pytest.raises(EstimateError, match="could not trace") as info:
        estimate_jax(step, jax.ShapeDtypeStruct((3,), jnp.float32))
    assert info.value.hint is not None and "static" in info.value.hint


class _PointEnv:
    """A Brax-like environment: reset(key) returns a pytree state for num_envs copies."""

    def __init__(self, num_envs: int) -> None:
        self.num_envs = num_envs

    def reset(self, key: Any) -> dict[str, Any]:
        obs = jax.random.normal(key, (self.num_envs, 17))
        return {
            "obs": obs,
            "pipeline": {"q": jnp.zeros((self.num_envs, 7)), "qd": jnp.zeros((self.num_envs, 7))},
            "reward": jnp.zeros((self.num_envs,)),
            "done": jnp.zeros((self.num_envs,), jnp.bool_),
            "steps": jnp.zeros((self.num_envs,), jnp.int32),
        }


def test_env_state_bytes_sums_the_reset_state() -> None:
    n = 4096
    expected = n * (17 + 7 + 7 + 1) * 4 + n * 1 + n * 4
    assert env_state_bytes(_PointEnv(n)) == expected
    assert env_state_bytes(_PointEnv(2 * n)) == 2 * expected
    assert tree_nbytes({"a": jax.ShapeDtypeStruct((2, 3), jnp.float16), "b": None}) == 12


def test_env_without_reset_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="no reset"):
        env_state_bytes(object())
