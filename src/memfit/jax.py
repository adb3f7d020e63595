"""memfit for JAX: ``memfit.jax.TrainGuard`` keeps a jitted training step alive through
``RESOURCE_EXHAUSTED`` by switching to a micro-batched ``lax.scan`` step with the same
full-batch gradient (see :mod:`memfit.runtime.jax_guard`).

>>> import memfit.jax
>>> memfit.jax.TrainGuard.__name__
'TrainGuard'
"""

from __future__ import annotations

from memfit.runtime.jax_guard import TrainGuard, next_divisor

__all__ = ["TrainGuard", "next_divisor"]
