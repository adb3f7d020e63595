"""Choices PyTorch makes differently on CUDA, applied to a trace that runs on the CPU.

A step traced on the CPU for a CUDA target must make the choices CUDA would. The one handled
here: an optimizer built without ``foreach=`` runs its multi-tensor (``foreach``)
implementation when every parameter is on CUDA and its per-parameter loop on the CPU
(``torch.optim.optimizer._default_to_fused_or_foreach``; torch's docs: "we use foreach over
the for-loop implementation on CUDA, since it is usually significantly more performant").
The two differ in memory: Adam's foreach step makes ``sqrt(exp_avg_sq)`` for every parameter
at once (one more parameter-sized buffer at the step), the loop one parameter at a time.

The decision is read from the installed torch each time an optimizer steps, so
:func:`cuda_optimizer_defaults` wraps torch's own function in every ``torch.optim`` module that
imported it, deciding as torch does but as if the parameters were on CUDA; an optimizer given
``foreach=`` or ``fused=`` explicitly is left as it was built.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

__all__ = ["cuda_optimizer_defaults"]

_NAME = "_default_to_fused_or_foreach"


def _as_on_cuda(
    original: Callable[..., tuple[bool, bool]],
) -> Callable[..., tuple[bool, bool]]:
    def choose(
        params: list[Any], differentiable: bool, use_fused: bool = False
    ) -> tuple[bool, bool]:
        if differentiable:
            return original(params, differentiable, use_fused)
        tensors = all(p is None or isinstance(p, torch.Tensor) for p in params)
        fused = (
            use_fused and tensors and all(p is None or torch.is_floating_point(p) for p in params)
        )
        return fused, (not fused and tensors)

    choose.__wrapped__ = original  # type: ignore[attr-defined]
    return choose


def _optim_modules() -> Iterator[Any]:
    import torch.optim

    yield importlib.import_module("torch.optim.optimizer")
    for info in pkgutil.iter_modules(torch.optim.__path__):
        if info.name.startswith("_") and info.name != "_adafactor":
            continue
        try:
            module = importlib.import_module(f"torch.optim.{info.name}")
        except ImportError:  # a module of this torch that does not import here
            continue
        if hasattr(module, _NAME):
            yield module


@contextmanager
def cuda_optimizer_defaults() -> Iterator[list[str]]:
    """Inside: torch's optimizers choose their implementation as on CUDA.

    Yields:
        The ``torch.optim`` modules whose choice was wrapped (for the estimate's notes).
    """
    patched: list[tuple[Any, Any]] = []
    try:
        for module in _optim_modules():
            original = getattr(module, _NAME)
            if getattr(original, "__wrapped__", None) is not None:
                continue  # already wrapped by an outer trace
            patched.append((module, original))
            setattr(module, _NAME, _as_on_cuda(original))
        yield [m.__name__ for m, _ in patched]
    finally:
        for module, original in reversed(patched):
            setattr(module, _NAME, original)
