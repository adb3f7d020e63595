"""The jitted MLP SGD step of ``bench/xla_floor_probe.py`` (the step its H100 rows measured),
with abstract arguments for a deviceless compile, and the steps of ``bench/xla_deviceless.py``
(:func:`make_step`): built by those scripts, the bench scripts that reuse their rows and the
tests that check memfit's figure for them."""

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


def make_step(kind: str, size: int, *, concrete: bool = False) -> tuple[Any, tuple[Any, ...]]:
    """One benchmark step and its arguments (arrays when ``concrete``, else shapes)."""
    import jax
    import jax.numpy as jnp

    def arg(shape: tuple[int, ...], dtype: Any = jnp.float32) -> Any:
        if concrete:
            return jnp.ones(shape, dtype)
        return jax.ShapeDtypeStruct(shape, dtype)

    if kind == "mlp":  # the floor probe's tanh MLP step, 3 x 512 wide
        step, (params, x) = mlp_step(size, 512, 3)
        return step, ([arg(w.shape) for w in params], arg(x.shape))
    if kind == "matmul":
        return jax.jit(lambda a, b: (a @ b).sum()), (arg((size, size)), arg((size, size)))
    if kind == "permute":
        return jax.jit(lambda x, k: x[jax.random.permutation(k, x.shape[0])]), (
            arg((size, 16)),
            jax.random.PRNGKey(0) if concrete else jax.ShapeDtypeStruct((2,), jnp.uint32),
        )
    if kind == "conv":

        def conv(x: Any, w: Any) -> Any:
            return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME").sum()

        return jax.jit(jax.grad(conv, argnums=1)), (arg((size, 3, 84, 84)), arg((32, 3, 8, 8)))
    raise ValueError(kind)
