"""Choices PyTorch makes differently on CUDA, applied to a trace that runs on the CPU.

A step traced on the CPU for a CUDA target must make the choices CUDA would. Two are made
here (the kernels each op runs are :mod:`memfit.estimate.torch._cuda_kernels`'; autocast's casts
are :mod:`memfit.estimate.torch._autocast`'s).

**Autocast and loss scaling named after the tensors' device.** Code that derives its device
from its tensors (``torch.autocast(device_type=x.device.type)``, as Hugging Face's Trainer
and Accelerate do, ``torch.amp.GradScaler(device)``) is handed CPU tensors by the trace, and
would turn on CPU autocast, whose rules are not CUDA's (and whose default dtype is bfloat16,
not float16). Inside :class:`CudaDeviceDefaults` the tensors stand for CUDA tensors, so an
autocast region or a scaler made for ``"cpu"`` is made for ``"cuda"`` (with CUDA's default
dtype where none is given), exactly as the same code makes it on the GPU; the estimate
counts them in its notes.

**Optimizers' implementation.** An optimizer built without ``foreach=`` runs its
multi-tensor (``foreach``) implementation when every parameter is on CUDA and its
per-parameter loop on the CPU (``torch.optim.optimizer._default_to_fused_or_foreach``;
torch's docs: "we use foreach over the for-loop implementation on CUDA, since it is usually
significantly more performant").
The two differ in memory: Adam's foreach step makes ``sqrt(exp_avg_sq)`` for every parameter
at once (one more parameter-sized buffer at the step), the loop one parameter at a time.

The decision is read from the installed torch each time an optimizer steps, so
:func:`cuda_optimizer_defaults` wraps torch's own function in every ``torch.optim`` module that
imported it, deciding as torch does but as if the parameters were on CUDA; an optimizer given
``foreach=`` or ``fused=`` explicitly is left as it was built.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

__all__ = ["CudaDeviceDefaults", "cuda_optimizer_defaults"]

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


class CudaDeviceDefaults:
    """Inside: optimizers choose as on CUDA, and autocast regions and gradient scalers made
    for ``"cpu"`` are made for ``"cuda"`` (see the module docstring)."""

    def __init__(self) -> None:
        self.autocast_regions = 0
        self.scalers = 0
        self._stack: Any = None

    def __enter__(self) -> CudaDeviceDefaults:
        from contextlib import ExitStack

        stack = ExitStack()
        try:
            stack.enter_context(cuda_optimizer_defaults())
            stack.enter_context(self._retarget_amp())
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        return self

    def __exit__(self, *exc: object) -> None:
        if self._stack is not None:
            self._stack.close()
            self._stack = None

    @contextmanager
    def _retarget_amp(self) -> Iterator[None]:
        from torch.amp.autocast_mode import autocast
        from torch.amp.grad_scaler import GradScaler

        original_autocast: Any = autocast.__init__
        original_scaler: Any = GradScaler.__init__
        torch_root = os.path.dirname(torch.__file__) + os.sep

        def from_outside_torch() -> bool:
            """Whether the region is made by the user's code (or a library's), not by torch
            itself (``torch.utils.checkpoint`` restores the CPU's autocast state with an
            explicit ``autocast("cpu")``, which must stay the CPU's)."""
            frame = sys._getframe(2)
            while frame is not None and frame.f_code.co_filename == __file__:
                frame = frame.f_back  # type: ignore[assignment]
            return frame is None or not frame.f_code.co_filename.startswith(torch_root)

        def autocast_init(region: Any, device_type: str, *args: Any, **kwargs: Any) -> None:
            if device_type == "cpu" and from_outside_torch():
                self.autocast_regions += 1
                device_type = "cuda"
            original_autocast(region, device_type, *args, **kwargs)

        def scaler_init(scaler: Any, device: str = "cuda", *args: Any, **kwargs: Any) -> None:
            if device == "cpu" and from_outside_torch():
                self.scalers += 1
                device = "cuda"
            original_scaler(scaler, device, *args, **kwargs)

        autocast.__init__ = autocast_init  # type: ignore[method-assign,assignment]
        GradScaler.__init__ = scaler_init  # type: ignore[method-assign,assignment]
        try:
            yield
        finally:
            autocast.__init__ = original_autocast  # type: ignore[method-assign]
            GradScaler.__init__ = original_scaler  # type: ignore[method-assign]

    def notes(self) -> list[str]:
        """What was retargeted."""
        out = []
        if self.autocast_regions or self.scalers:
            out.append(
                f"{self.autocast_regions} autocast region(s) and {self.scalers} gradient "
                "scaler(s) made for 'cpu' (the device of the traced tensors, which stand for "
                "CUDA tensors) were made for 'cuda', as the same code makes them on the GPU"
            )
        return out
