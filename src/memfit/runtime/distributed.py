"""Agreement across ranks, so an out-of-memory on one rank never hangs the others.

Under ``torch.distributed`` a guard takes its decisions locally while it works through its
micro-batches (no collective runs then: DDP backward passes run under ``no_sync()``), and then
all ranks exchange one small vector with a single ``all_reduce(MAX)`` per step:

* whether a rank gave up (then every rank raises :class:`memfit.OutOfMemory` together),
* the number of micro-batches each rank needed (every rank uses the largest from the next
  step on),
* whether a rank had to split its batch further this step (every rank restarts its
  grow-back count).

When every rank has succeeded, the gradients are averaged with one more all-reduce of a
flattened buffer (what DDP would have done during backward, done once after all micro-batches
succeeded). Everything here is a no-op when ``torch.distributed`` is not initialised or the
world has one rank.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from memfit.runtime.oom import forget_exception, is_oom, no_alloc_section

if TYPE_CHECKING:
    import torch

__all__ = ["Decision", "agree", "average_gradients", "is_ddp", "is_distributed", "world_size"]


T = TypeVar("T")


def _allocate_retrying(fn: Callable[[], T], attempts: int = 5) -> T:
    """Run an allocation that comes before a collective; on out-of-memory free and retry.

    Nothing has been sent yet, so the other ranks simply wait a little longer.
    """
    for attempt in range(attempts):
        failed = False
        try:
            return fn()
        except Exception as exc:
            if not is_oom(exc) or attempt == attempts - 1:
                raise
            forget_exception(exc)
            failed = True
        if failed:
            gc.collect(1)
    raise AssertionError("unreachable")  # pragma: no cover


@dataclass(frozen=True)
class Decision:
    """What all ranks agreed on for one step.

    Attributes:
        gave_up: Some rank could not finish the step.
        splits: Micro-batches per step from now on (the largest any rank needed).
        split: Some rank had to split its batch further this step.
    """

    gave_up: bool
    splits: int
    split: bool


def is_distributed() -> bool:
    """Whether ``torch.distributed`` is initialised with more than one rank."""
    import torch.distributed as dist

    return bool(dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)


def world_size() -> int:
    """Ranks in the default group (1 when not distributed)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return int(dist.get_world_size())
    return 1


def is_ddp(model: Any) -> bool:
    """Whether ``model`` is a ``torch.nn.parallel.DistributedDataParallel`` module."""
    from torch.nn.parallel import DistributedDataParallel

    return isinstance(model, DistributedDataParallel)


def _collective_device() -> torch.device:
    import torch
    import torch.distributed as dist

    backend = str(dist.get_backend()).lower()
    if "nccl" in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def agree(*, gave_up: bool, splits: int, split: bool) -> Decision:
    """Agree on this step's outcome with every rank (one ``all_reduce(MAX)`` of 3 integers).

    Args:
        gave_up: This rank could not finish the step.
        splits: Micro-batches this rank ended the step with.
        split: This rank had to split its batch further in the step.

    Returns:
        The :class:`Decision` every rank gets; this rank's own values when not distributed.
    """
    if not is_distributed():
        return Decision(gave_up=gave_up, splits=splits, split=split)
    import torch
    import torch.distributed as dist

    device = _collective_device()
    flags = _allocate_retrying(
        lambda: torch.tensor(
            [int(gave_up), int(splits), int(split)], dtype=torch.int64, device=device
        )
    )
    with no_alloc_section():
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        values = [int(v) for v in flags.tolist()]
    return Decision(gave_up=bool(values[0]), splits=values[1], split=bool(values[2]))


def _flattener(group: list[torch.Tensor]) -> Callable[[], torch.Tensor]:
    import torch

    return lambda: torch.cat([g.reshape(-1) for g in group])


def _zeros_like(p: torch.Tensor) -> Callable[[], torch.Tensor]:
    import torch

    return lambda: torch.zeros_like(p)


def average_gradients(params: Sequence[torch.nn.Parameter]) -> None:
    """Average the ``.grad`` of ``params`` over all ranks with one all-reduce.

    A parameter without a gradient on this rank counts as a zero gradient, so every rank
    reduces the same buffer. No-op when not distributed.

    Args:
        params: Parameters in the same order on every rank.
    """
    if not is_distributed() or not params:
        return
    import torch.distributed as dist

    grads: list[torch.Tensor] = []
    for p in params:
        if p.grad is None:
            p.grad = _allocate_retrying(_zeros_like(p))
        grads.append(p.grad)
    by_dtype: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for g in grads:
        by_dtype.setdefault((g.dtype, g.device), []).append(g)
    n = dist.get_world_size()
    for group in by_dtype.values():
        flat = _allocate_retrying(_flattener(group))
        with no_alloc_section():
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            flat.div_(n)
            offset = 0
            for g in group:
                g.copy_(flat.narrow(0, offset, g.numel()).view_as(g))
                offset += g.numel()
