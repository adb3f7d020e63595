"""The jitted MLP SGD step of ``bench/xla_floor_probe.py`` (the step its H100 rows measured),
with abstract arguments for a deviceless compile: built by that script, the bench scripts that
reuse its rows and the tests that check memfit's figure for them."""

from __future__ import annotations

from typing import Any


def mlp_step(batch: int, width: int, depth: int) -> tuple[Any, tuple[Any, ...]]:
    """The probe's MLP step with abstract arguments, for a deviceless compile."""
    import jax
    import jax.numpy as jnp

    def loss(params: Any, x: Any) -> Any:
        h = x
        for w in params:
            h = jnp.tanh(h @ w)
        return jnp.mean(h**2)

    def step(params: Any, x: Any) -> Any:
        grads = jax.grad(loss)(params, x)
        return [p - 1e-3 * g for p, g in zip(params, grads, strict=True)]

    params = [jax.ShapeDtypeStruct((width, width), jnp.float32)] * depth
    return jax.jit(step, donate_argnums=(0,)), (
        params,
        jax.ShapeDtypeStruct((batch, width), jnp.float32),
    )
