"""A ``jax.pmap`` step is estimated per device, as ``jax.pmap`` builds it (issue 30: Brax and
multi-GPU JAX RL code map their training step with ``pmap``), without the devices."""

from __future__ import annotations

from typing import Any

import pytest

from memfit.errors import ConfigError
from memfit.estimate.xla import gpu as xla_gpu
from memfit.units import MiB

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from memfit.estimate.xla import step as jax_xla  # noqa: E402
from memfit.estimate.xla._pmap import PmapStep, pmap_step  # noqa: E402

needs_extra = pytest.mark.skipif(
    bool(xla_gpu.gpu_target_missing()), reason="the gpu-target extra is not installed"
)


def _step(w: Any, x: Any) -> Any:
    """Data-parallel SGD: the gradient averaged over the devices."""
    g = jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
    return w - 0.1 * jax.lax.pmean(g, "d")


W = jax.ShapeDtypeStruct((512, 512), jnp.float32)  # 1 MiB, replicated (in_axes None)
X = jax.ShapeDtypeStruct((2, 2048, 512), jnp.float32)  # 4 MiB per device


def test_a_pmap_step_is_recognised_with_its_options() -> None:
    mapped = jax.pmap(
        lambda w, x, scale: w * scale, axis_name="d", in_axes=(None, 0),
        static_broadcasted_argnums=(2,), donate_argnums=(0,),
    )  # fmt: skip
    found = pmap_step(mapped)
    assert isinstance(found, PmapStep)
    assert found.axis_name == "d" and found.in_axes == (None, 0)
    assert found.static == (2,) and found.donate == (0,)
    assert found.devices((W, X, 3.0), {}) == 2
    # a jitted function (it has .lower too) or a plain one is not a pmap
    assert pmap_step(jax.jit(_step)) is None and pmap_step(_step) is None


def test_here_each_device_s_program_is_compiled_with_the_mapped_axis_of_size_one() -> None:
    mapped = jax.pmap(_step, axis_name="d", in_axes=(None, 0))
    est = jax_xla.estimate_jax(mapped, W, X, compiler="cpu")
    # one device's arguments: the replicated weights and its 2048-row shard
    assert est.argument_bytes == 5 * MiB and est.output_bytes == 1 * MiB
    assert any("jax.pmap step over 2 devices" in n and "identity" in n for n in est.notes)
    unmapped = jax_xla.estimate_jax(
        jax.jit(lambda w, x: w - 0.1 * jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)),
        W, jax.ShapeDtypeStruct((2048, 512), jnp.float32), compiler="cpu",
    )  # fmt: skip
    assert est.executable_peak_bytes == unmapped.executable_peak_bytes


def test_static_and_donated_arguments_keep_their_roles() -> None:
    def scaled(w: Any, x: Any, lr: float) -> Any:
        return _step(w, x) * lr

    mapped = jax.pmap(
        scaled, axis_name="d", in_axes=(0, 0), static_broadcasted_argnums=(2,),
        donate_argnums=(0,),
    )  # fmt: skip
    w = jax.ShapeDtypeStruct((2, 512, 512), jnp.float32)
    est = jax_xla.estimate_jax(mapped, w, X, 0.5, compiler="cpu")
    assert est.argument_bytes == 5 * MiB
    assert est.alias_bytes == 1 * MiB  # each device's weights, donated


def test_mapped_arguments_of_different_sizes_are_refused() -> None:
    mapped = jax.pmap(_step, axis_name="d")
    with pytest.raises(ConfigError) as err:
        jax_xla.estimate_jax(
            mapped, jax.ShapeDtypeStruct((3, 512, 512), jnp.float32), X, compiler="cpu"
        )
    assert err.value.key_path == "args" and "3" in str(err.value)


@needs_extra
def test_a_pmap_step_compiles_for_its_devices_as_the_same_step_sharded_by_hand() -> None:
    """``jax.pmap`` is ``jit(shard_map)`` over the mapped axis: compiled for two compile-only
    RTX 4070s, it gives the figures of the same data-parallel step written as a jit over an
    ``AbstractMesh`` (XLA's SPMD partitioner), the all-reduce among its buffers."""
    from jax.sharding import AbstractMesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    est = jax_xla.estimate_jax(
        jax.pmap(_step, axis_name="d", in_axes=(None, 0)), W, X, gpu="RTX 4070", environ={}
    )
    mesh = AbstractMesh((2,), ("data",))

    def by_hand(w: Any, x: Any) -> Any:
        return w - 0.1 * jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)

    sharded = jax_xla.estimate_jax(
        jax.jit(by_hand),
        jax.ShapeDtypeStruct((512, 512), jnp.float32, sharding=NamedSharding(mesh, P())),
        jax.ShapeDtypeStruct((4096, 512), jnp.float32, sharding=NamedSharding(mesh, P("data"))),
        gpu="RTX 4070", environ={},
    )  # fmt: skip
    assert est.compiled_for == "cuda sm_89 (NVIDIA GeForce RTX 4070)"
    assert est.argument_bytes == sharded.argument_bytes == 5 * MiB
    assert est.temp_bytes == sharded.temp_bytes
    assert est.peak_bytes_in_use == sharded.peak_bytes_in_use
    assert any("jax.pmap step over 2 devices" in n for n in est.notes)
    assert any("compiled for 2 devices" in n for n in est.notes)
    assert any("all-reduce" in n for n in est.notes)


@needs_extra
def test_a_pmap_step_sweeps_per_device() -> None:
    """A batch sweep of a pmapped step for a card: each point per device, the batch axis
    split over the devices, the fit per device."""
    mapped = jax.pmap(_step, axis_name="d", in_axes=(None, 0))
    sweep = jax_xla.estimate_jax_sweep(
        mapped,
        lambda b: (W, jax.ShapeDtypeStruct((2, b, 512), jnp.float32)),
        [1024, 2048],
        gpu="RTX 4070",
        environ={},
    )
    small, large = sweep.points
    assert small.argument_bytes == 1 * MiB + 1024 * 512 * 4
    assert large.argument_bytes - small.argument_bytes == 1024 * 512 * 4
    assert all(p.compiled_for == "cuda sm_89 (NVIDIA GeForce RTX 4070)" for p in sweep.points)
    assert all(any("jax.pmap step over 2" in n for n in p.notes) for p in sweep.points)
