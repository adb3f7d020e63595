"""Measured estimates without a GPU: trace the user's real step.

A workload factory (``module:function``, named by ``memfit estimate`` or by a workload file
with ``estimator: torch|jax``) returns one of the two plain descriptions below. Neither
imports torch or jax; the tracers do, when they run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

__all__ = ["JaxStep", "TorchStep", "stand_in_scalars", "stand_in_scalars_active"]

_STAND_IN = threading.local()


@contextmanager
def stand_in_scalars() -> Iterator[None]:
    """Let values read to Python inside this block stand in as zeros under a memfit trace.

    A fake-tensor trace knows every tensor's shape but none of its values, so a step that
    reads one (``loss.item()``, ``float(t)``, ``bool(t)``, ``t.tolist()``, ``t.numpy()``) is
    refused. Where the value only feeds logging, a progress bar or a check, as the
    ``loss.item()`` inside many libraries' training loops, wrap the call::

        with memfit.estimate.stand_in_scalars():
            agent.train(gradient_steps=1, batch_size=256)

    Under :func:`memfit.estimate_torch` each such read then gives zero of the tensor's type
    (``0``, ``0.0``, ``False``; ``.numpy()`` an array of zeros of the right shape). Outside a
    trace the block changes nothing: the real run reads the real values. Do not use it where
    the value decides a shape (``x[: n.item()]``): the trace would follow the zero.
    ``build()`` runs as if inside this block (initialisers such as ``trunc_normal_`` read
    values while they sample).
    """
    depth = getattr(_STAND_IN, "depth", 0)
    _STAND_IN.depth = depth + 1
    try:
        yield
    finally:
        _STAND_IN.depth = depth


def stand_in_scalars_active() -> bool:
    """Whether this thread is inside :func:`stand_in_scalars`."""
    return bool(getattr(_STAND_IN, "depth", 0))


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
