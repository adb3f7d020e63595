"""Bytes of a JAX pytree's arrays, and of one environment state from ``jax.eval_shape``."""

from __future__ import annotations

from typing import Any

from memfit.errors import ConfigError, EstimateError

__all__ = ["env_state_bytes", "tree_nbytes"]


def tree_nbytes(tree: Any) -> int:
    """Bytes of every array-like leaf (anything with ``shape`` and ``dtype``) of a pytree."""
    import jax
    import numpy as np

    total = 0
    for leaf in jax.tree_util.tree_leaves(tree):
        shape = getattr(leaf, "shape", None)
        dtype = getattr(leaf, "dtype", None)
        if shape is None or dtype is None:
            continue
        total += int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return total


def env_state_bytes(env: Any, key: Any = None) -> int:
    """Bytes of one environment state, from ``jax.eval_shape(env.reset, key)`` (Brax helper).

    Works with any object whose ``reset(key)`` returns a pytree of arrays (Brax, gymnax,
    MJX); nothing is run or allocated. For a batched env (``num_envs`` in the shapes) this is
    the whole batch.

    Args:
        env: The environment.
        key: A PRNG key (or its ``ShapeDtypeStruct``); default ``jax.random.PRNGKey(0)``.

    Raises:
        ConfigError: When ``env`` has no callable ``reset``.
        EstimateError: When ``reset`` cannot be traced abstractly.
    """
    import jax

    reset = getattr(env, "reset", None)
    if not callable(reset):
        raise ConfigError(
            f"{type(env).__name__} has no reset(key) method",
            key_path="env",
            hint="pass a JAX environment (Brax, gymnax, MJX) whose reset(key) returns its state",
        )
    if key is None:
        key = jax.random.PRNGKey(0)
    try:
        state = jax.eval_shape(reset, key)
    except (TypeError, ValueError, jax.errors.JAXTypeError) as exc:
        raise EstimateError(
            f"could not trace {type(env).__name__}.reset abstractly: {exc}",
            hint="reset must be a pure JAX function of the key",
        ) from exc
    return tree_nbytes(state)
