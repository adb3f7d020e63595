"""memfit.jax.TrainGuard on CPU JAX, with RESOURCE_EXHAUSTED injected for large chunks.

CPU JAX does not run out of memory, so the loss raises the error XLA raises
(``JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate N bytes.``)
whenever it is traced for a chunk larger than a cap: a device that fits ``cap`` items.
"""

from __future__ import annotations

from typing import Any

import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import memfit.jax  # noqa: E402
from memfit.errors import OutOfMemory  # noqa: E402
from memfit.runtime.jax_guard import next_divisor  # noqa: E402
from memfit.runtime.oom import is_oom  # noqa: E402

LR = 0.05


def _params() -> dict[str, Any]:
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    return {
        "w": jax.random.normal(k1, (8, 3)) * 0.3,
        "b": jnp.zeros(3),
        "v": jax.random.normal(k2, (3,)),
    }


def _data(steps: int) -> list[dict[str, Any]]:
    key = jax.random.PRNGKey(1)
    out = []
    for _ in range(steps):
        key, a, b = jax.random.split(key, 3)
        out.append({"x": jax.random.normal(a, (24, 8)), "y": jax.random.normal(b, (24,))})
    return out


def _loss(cap: int | None) -> Any:
    def loss_fn(params: dict[str, Any], batch: dict[str, Any]) -> Any:
        if cap is not None and batch["x"].shape[0] > cap:
            raise jax.errors.JaxRuntimeError(
                f"RESOURCE_EXHAUSTED: Out of memory while trying to allocate "
                f"{batch['x'].shape[0] * 4096} bytes."
            )
        h = jnp.tanh(batch["x"] @ params["w"] + params["b"])
        return jnp.mean((h @ params["v"] - batch["y"]) ** 2)

    return loss_fn


def _update(params: Any, state: Any, grads: Any) -> tuple[Any, Any]:
    # SGD with momentum, written out (no optax needed).
    state = jax.tree_util.tree_map(lambda m, g: 0.9 * m + g, state, grads)
    params = jax.tree_util.tree_map(lambda p, m: p - LR * m, params, state)
    return params, state


def _run(guard: Any, data: list[dict[str, Any]]) -> Any:
    params = _params()
    state = jax.tree_util.tree_map(jnp.zeros_like, params)
    for batch in data:
        params, state, _ = guard(params, state, batch)
    return params


def test_micro_batched_step_matches_the_full_batch_step() -> None:
    data = _data(16)
    reference = _run(memfit.jax.TrainGuard(_loss(None), _update), data)
    guard = memfit.jax.TrainGuard(_loss(6), _update, grow_back_after=6)
    params = _run(guard, data)
    for key in reference:
        rel = float(jnp.linalg.norm(params[key] - reference[key]) / jnp.linalg.norm(reference[key]))
        assert rel <= 1e-5, key
    kinds = [e.kind for e in guard.events]
    assert kinds[:4] == ["oom", "retry", "oom", "split"]
    assert "grow_back" in kinds
    assert guard.steps == 16 and guard.splits == 4  # 24 items in chunks of 6


def test_each_split_count_compiles_once() -> None:
    guard = memfit.jax.TrainGuard(_loss(6), _update, grow_back_after=1000)
    _run(guard, _data(12))
    assert guard.traces[4] == 1  # settled at 4 chunks, traced once for all 12 steps
    assert guard.splits == 4


def test_token_weighting_through_count_fn() -> None:
    data = _data(3)
    mask = (jnp.arange(24) % 3 != 0).astype(jnp.float32)

    def loss_fn(params: Any, batch: Any) -> Any:
        h = jnp.tanh(batch["x"] @ params["w"] + params["b"])
        err = (h @ params["v"] - batch["y"]) ** 2
        return jnp.sum(err * batch["m"]) / jnp.sum(batch["m"])

    def count(batch: Any) -> Any:
        return jnp.sum(batch["m"])

    weighted = [dict(b, m=mask) for b in data]
    whole = memfit.jax.TrainGuard(loss_fn, _update, count_fn=count)
    split = memfit.jax.TrainGuard(loss_fn, _update, count_fn=count)
    split.splits = 3
    a, b = _run(whole, weighted), _run(split, weighted)
    for key in a:
        assert jnp.allclose(a[key], b[key], rtol=1e-5, atol=1e-6)


def test_gives_up_with_what_was_tried() -> None:
    guard = memfit.jax.TrainGuard(_loss(0), _update, max_splits=4)
    with pytest.raises(OutOfMemory, match="retry x1, split x2, split x4") as info:
        _run(guard, _data(1))
    assert info.value.tried == ["retry x1", "split x2", "split x4"]
    assert guard.events[-1].kind == "give_up"


def test_other_errors_pass_through() -> None:
    def broken(params: Any, batch: Any) -> Any:
        raise ValueError("not an out-of-memory")

    with pytest.raises(ValueError, match="not an out-of-memory"):
        _run(memfit.jax.TrainGuard(broken, _update), _data(1))


def test_resource_exhausted_is_recognised_by_type_and_prefix() -> None:
    assert is_oom(
        jax.errors.JaxRuntimeError(
            "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 8 bytes."
        )
    )
    assert not is_oom(jax.errors.JaxRuntimeError("INVALID_ARGUMENT: bad shape"))


def test_next_divisor() -> None:
    assert [next_divisor(24, k) for k in (1, 2, 5, 7, 13, 30)] == [1, 2, 6, 8, 24, 24]
