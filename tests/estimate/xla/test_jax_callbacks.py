"""Issue 43: a jitted step with host callbacks (``jax.debug.callback``, ``jax.debug.print``,
``io_callback``, ``pure_callback``) compiles for a card as what the callbacks hold on it; other
export failures are lowered for CUDA directly, and only then compiled on the CPU, with a
warning."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from memfit.errors import EstimateError
from memfit.estimate.xla import gpu as xla_gpu
from memfit.estimate.xla._callbacks import has_callbacks, strip_callbacks

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

READY = not xla_gpu.gpu_target_missing()
needs_extra = pytest.mark.skipif(not READY, reason="the gpu-target extra is not installed")

N = 128


def _train(callbacks: bool) -> Any:
    """The issue's reproduction (``callbacks=True``) and the same program without them."""

    def train(x: Any) -> Any:
        def body(c: Any, _: Any) -> Any:
            c = jnp.tanh(c @ c)
            if callbacks:
                jax.debug.callback(lambda m: None, {"loss": c.sum()})
            return c, None

        return jax.lax.scan(body, x, None, length=3)[0].sum()

    return jax.jit(train)


def _every_kind(callbacks: bool) -> Any:
    """Every kind of host callback, nested in a scan, a cond and a remat; the callbacks'
    results are the zeros the stripped program stands in for them."""
    from jax.experimental import io_callback

    def zeros(a: Any) -> Any:
        return jax.numpy.zeros_like(a)

    def train(x: Any) -> Any:
        def body(c: Any, _: Any) -> Any:
            c = jnp.tanh(c @ c)
            if callbacks:
                jax.debug.print("loss {}", c.sum())
                y = jax.pure_callback(zeros, jax.ShapeDtypeStruct((8,), jnp.float32), c[0, :8])
                z = io_callback(zeros, jax.ShapeDtypeStruct((8,), jnp.float32), c[1, :8])
            else:
                y = z = jnp.zeros((8,), jnp.float32)

            def branch(c: Any) -> Any:
                if callbacks:
                    jax.debug.callback(lambda m: None, c[0])
                return c * 0.5

            c = jax.lax.cond(c[0, 0] > 0, branch, lambda c: c, c)
            c = jax.checkpoint(jnp.sin)(c)
            return c + y.sum() + z.sum(), c.mean()

        return jax.lax.scan(body, x, None, length=2)

    return jax.jit(train, donate_argnums=0)


def _leaves() -> list[Any]:
    return [jax.ShapeDtypeStruct((N, N), jnp.float32)]


def _flat(fn: Any) -> Any:
    def flat(*leaves: Any) -> Any:
        return jax.tree_util.tree_leaves(fn(*leaves))

    return flat


def test_every_kind_of_callback_is_found_and_replaced_by_what_it_holds() -> None:
    stripped = strip_callbacks(_flat(_every_kind(True)), _leaves())
    assert stripped is not None
    run, donated, held = stripped
    assert donated == (0,)  # the step's own donation, read from its jit
    assert dict(held.kinds) == {
        "debug_print": 1,
        "pure_callback": 1,
        "io_callback": 1,
        "debug_callback": 1,
    }
    # the operands: a scalar, two rows of 8 and a row of N; the results: two vectors of 8
    assert held.operand_bytes == 4 + 8 * 4 + 8 * 4 + N * 4
    assert held.result_bytes == 2 * 8 * 4
    assert held.held_bytes == held.operand_bytes + held.result_bytes
    assert held.describe().startswith("4 host callbacks (1 debug_callback, 1 debug_print")
    assert not has_callbacks(jax.make_jaxpr(run)(*_leaves()))
    # the stripped program computes what the program without callbacks computes
    x = jnp.linspace(-1.0, 1.0, N * N, dtype=jnp.float32).reshape(N, N)
    want = jax.tree_util.tree_leaves(_every_kind(False)(x + 0))
    got = jax.jit(run)(x + 0)
    for a, b in zip(want, got, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert jnp.allclose(a, b)


def test_a_step_without_callbacks_is_left_as_it_is() -> None:
    assert strip_callbacks(_flat(_train(False)), _leaves()) is None


def test_a_step_with_callbacks_is_exported_for_cuda_without_them() -> None:
    pytest.importorskip("flatbuffers")
    step = xla_gpu.export_step(_train(True), *_leaves())
    assert step.route == "callbacks"
    assert step.held is not None and step.held.operand_bytes == 4
    assert xla_gpu.export_step(_train(False), *_leaves()).route == "export"


def test_an_export_refused_for_another_reason_is_lowered_for_cuda_directly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("flatbuffers")

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("refused by jax.export")

    monkeypatch.setattr(jax.export, "export", refuse)
    step = xla_gpu.export_step(_train(False), *_leaves())
    assert step.route == "lowered" and step.held is None
    exported = jax.export.deserialize(bytearray(step.serialized))
    assert [a.shape for a in exported.in_avals] == [(N, N)]


@needs_extra
def test_an_export_nothing_can_lower_warns_and_compiles_on_this_backend(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from memfit.estimate.xla import step as jax_xla

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise EstimateError("JAX could not export the step for CUDA: refused")

    monkeypatch.setattr(xla_gpu, "export_step", refuse)
    with pytest.warns(RuntimeWarning, match="not XLA's GPU compiler for .*: JAX could not"):
        est = jax_xla.estimate_jax(_train(False), *_leaves(), gpu="RTX 4090", environ={})
    assert est.compiled_for == "cpu"
    assert any("could not export the step for CUDA" in n for n in est.notes)
    with pytest.raises(EstimateError, match="refused"):
        jax_xla.estimate_jax(_train(False), *_leaves(), gpu="RTX 4090", compiler="gpu")


@pytest.mark.slow  # two child compiles (about 20 s on the 2-core VM)
@needs_extra
def test_the_issues_reproduction_gives_an_estimate_for_two_cards() -> None:
    """The reproduction for one card through ``estimate_jax``; for a second card, the
    program with and without its callback (and the plain one lowered directly) in one child:
    the figure with the callback is the one without it plus the callback's operand."""
    import memfit
    from memfit.estimate.xla.step import _from_gpu_compile
    from memfit.hardware.catalog import gpu as lookup_gpu
    from memfit.hardware.xla_target import target_config

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no fallback to the CPU compile
        est = memfit.estimate_jax(_train(True), jnp.ones((N, N)), gpu="RTX 4090", environ={})
    assert est.compiled_for == "cuda sm_89 (NVIDIA GeForce RTX 4090)"
    assert est.peak_bytes_in_use is not None
    assert any("1 host callback (1 debug_callback)" in n for n in est.notes)
    held_term = [b for t, b, _ in est.breakdown if t.startswith("host callbacks'")]
    assert held_term == [4]

    spec = lookup_gpu("A100 40GB")
    target = target_config(spec)
    steps = [xla_gpu.export_step(_train(flag), *_leaves()) for flag in (True, False)]
    with_cb, without = xla_gpu.compile_exported(steps, target)
    assert with_cb.callbacks is not None and without.callbacks is None
    held = with_cb.callbacks.held_bytes
    assert held == 4
    assert with_cb.temp_bytes == without.temp_bytes  # compiled as the program without it
    leaves = [N * N * 4]
    a = _from_gpu_compile(with_cb, spec, target, leaves, {}, None)
    b = _from_gpu_compile(without, spec, target, leaves, {}, None)
    assert a.executable_peak_bytes - b.executable_peak_bytes == held
    assert a.peak_bytes_in_use is not None and b.peak_bytes_in_use is not None
    assert abs(a.peak_bytes_in_use - b.peak_bytes_in_use) <= held


@needs_extra
def test_a_sweep_nothing_can_lower_warns_once_and_compiles_every_size_here(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from memfit.estimate.xla import step as jax_xla

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise EstimateError("JAX could not export the step for CUDA: refused")

    monkeypatch.setattr(xla_gpu, "export_step", refuse)
    with pytest.warns(RuntimeWarning, match="not XLA's GPU compiler"):
        sweep = jax_xla.estimate_jax_sweep(
            _train(False), lambda b: (jax.ShapeDtypeStruct((b, b), jnp.float32),), [16, 32],
            gpu="RTX 4090", environ={},
        )  # fmt: skip
    assert [p.compiled_for for p in sweep.points] == ["cpu", "cpu"]
    assert sweep.points[1].argument_bytes == 32 * 32 * 4
