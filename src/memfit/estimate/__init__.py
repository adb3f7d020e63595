"""Measured estimates without a GPU: trace the user's real step.

A workload factory (``module:function``, named by ``memfit estimate`` or by a workload file
with ``estimator: torch|jax``) returns one of the two plain descriptions below. Neither
imports torch or jax; the tracers do, when they run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["JaxStep", "TorchStep"]


@dataclass(frozen=True)
class TorchStep:
    """A PyTorch training or inference step, as :func:`memfit.estimate_torch` traces it.

    The tracer sets the default device (``torch.set_default_device``) while it calls these, so
    create tensors without an explicit device (or with ``torch.get_default_device()``).

    Attributes:
        build: ``build() -> (model, optimizer)``; the optimizer may be ``None`` for inference.
        step: ``step(model, optimizer, batch) -> None``: one full step (forward, backward,
            optimizer update).
        make_batch: ``make_batch(batch_size) -> batch``: the inputs of one step.
        batch_knob: The workload knob the batch size stands for (``"batch_size"``,
            ``"num_envs"``, ...).
    """

    build: Callable[[], tuple[Any, Any]]
    step: Callable[[Any, Any, Any], Any]
    make_batch: Callable[[int], Any]
    batch_knob: str = "batch_size"


@dataclass(frozen=True)
class JaxStep:
    """A jittable JAX step, as :func:`memfit.estimate_jax` compiles it.

    Attributes:
        fn: The step function (jitted or not).
        make_args: ``make_args(batch_size) -> tuple`` of arguments: arrays, pytrees of arrays,
            or ``jax.ShapeDtypeStruct`` (nothing needs to be allocated).
        batch_knob: The workload knob the batch size stands for.
    """

    fn: Callable[..., Any]
    make_args: Callable[[int], tuple[Any, ...]]
    batch_knob: str = "batch_size"
