"""``clip_grad_norm``: gradient clipping as a ``before_step`` hook that survives faults."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from memfit._checks import require
from memfit.errors import ConfigError
from memfit.runtime.oom import no_alloc_section

__all__ = ["BeforeStep", "clip_grad_norm"]

BeforeStep = Callable[[Any], Any]


def clip_grad_norm(
    max_norm: float, norm_type: float = 2.0, *, error_if_nonfinite: bool = False
) -> BeforeStep:
    """A ``before_step`` hook that clips the gradients' total norm, as
    ``torch.nn.utils.clip_grad_norm_`` does.

    It computes the norm and the clipping factor first (the only allocations) and scales the
    gradients in place last, so an out-of-memory can only strike before any gradient
    changed and TrainGuard can run it again. With a ``GradScaler`` it sees the gradients
    after ``unscale_``, as the AMP recipe wants.

    Args:
        max_norm: The largest total norm allowed.
        norm_type: The norm's order (``2.0``, ``float("inf")``, ...).
        error_if_nonfinite: Raise when the total norm is NaN or infinite.

    Returns:
        ``hook(optimizer) -> total_norm``: pass it as ``TrainGuard(..., before_step=...)``;
        the guard keeps its last result in ``guard.last_before_step``.

    Raises:
        ConfigError: When ``max_norm`` is not a positive number.
    """
    require("norm_type", norm_type, "number")
    require("error_if_nonfinite", error_if_nonfinite, "bool")
    require("max_norm", max_norm, "number", hint="the largest total gradient norm, e.g. 1.0")
    assert isinstance(max_norm, (int, float))
    if not max_norm > 0:
        raise ConfigError(f"max_norm must be a number > 0, not {max_norm!r}", key_path="max_norm")

    def hook(optimizer: Any) -> Any:
        import torch

        grads = [
            p.grad
            for group in optimizer.param_groups
            for p in group["params"]
            if p.grad is not None
        ]
        if not grads:
            return torch.tensor(0.0)
        total = torch.nn.utils.get_total_norm(
            grads, norm_type, error_if_nonfinite=error_if_nonfinite
        )
        factor = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        by_device: dict[Any, list[torch.Tensor]] = {}
        for g in grads:
            by_device.setdefault(g.device, []).append(g)
        factors = {device: factor.to(device) for device in by_device}
        with torch.no_grad(), no_alloc_section():
            for device, group in by_device.items():
                torch._foreach_mul_(group, factors[device])
        return total

    hook.__name__ = hook.__qualname__ = f"clip_grad_norm({max_norm})"
    return hook
