"""Agreement across ranks, so an out-of-memory on one rank never hangs the others.

Under ``torch.distributed`` a guard takes its decisions locally while it works through its
micro-batches (no collective runs then: DDP backward passes run under ``no_sync()``), and then
all ranks exchange one small vector with a single ``all_reduce(MAX)`` (:func:`agree`):

* whether a rank gave up (then every rank raises :class:`memfit.OutOfMemory` together),
* the number of micro-batches each rank needed (every rank uses the largest from the next
  step on),
* whether a rank had to split its batch further this step (every rank restarts its
  grow-back count),
* whether a rank stopped with another error (then every other rank stops too),
* whether a rank wants its optimizer step snapshotted (then every rank takes one).

When every rank has succeeded, the gradients are averaged with one more all-reduce of a
flattened buffer (what DDP would have done during backward, done once after all micro-batches
succeeded). After ``optimizer.step()`` the ranks :func:`settle` the step with one more small
all-reduce: when the step failed on some ranks but not all, the ranks that failed receive
the parameters and optimizer state of the lowest rank that succeeded
(:func:`repair_optimizer`; every rank computed the same update from the same averaged
gradients), so no rank is ever a step behind or half a step ahead of the others.

Everything here is a no-op when ``torch.distributed`` is not initialised or the world has
one rank.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from memfit.runtime.oom import allocate_retrying, no_alloc_section

if TYPE_CHECKING:
    import torch

__all__ = [
    "Decision",
    "Settlement",
    "agree",
    "average_gradients",
    "gather_ints",
    "is_ddp",
    "is_distributed",
    "rank",
    "repair_optimizer",
    "settle",
    "try_abort",
    "world_size",
]


T = TypeVar("T")


@dataclass(frozen=True)
class Decision:
    """What all ranks agreed on for one step.

    Attributes:
        gave_up: Some rank could not finish the step.
        splits: Micro-batches per step from now on (the largest any rank needed).
        split: Some rank had to split its batch further this step.
        aborted: Some rank stopped with an error that is not an out-of-memory.
        snapshot: Some rank wants the optimizer step snapshotted.
    """

    gave_up: bool
    splits: int
    split: bool
    aborted: bool = False
    snapshot: bool = False


@dataclass(frozen=True)
class Settlement:
    """How an optimizer step ended on all ranks.

    Attributes:
        aborted: Some rank stopped with an error that is not an out-of-memory.
        failed: Some rank's step ran out of memory and could not be done.
        all_failed: Every rank's step failed.
        source: The lowest rank whose step succeeded (``None`` when none did).
    """

    aborted: bool
    failed: bool
    all_failed: bool
    source: int | None


def is_distributed() -> bool:
    """Whether ``torch.distributed`` is initialised with more than one rank."""
    import torch.distributed as dist

    return bool(dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)


def rank() -> int:
    """This process's rank in the default group (0 when not distributed)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    return 0


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


def _all_max(values: list[int]) -> list[int]:
    """One ``all_reduce(MAX)`` of a few integers."""
    import torch
    import torch.distributed as dist

    device = _collective_device()
    flags = allocate_retrying(lambda: torch.tensor(values, dtype=torch.int64, device=device))
    with no_alloc_section():
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        return [int(v) for v in flags.tolist()]


def gather_ints(values: Sequence[int]) -> list[list[int]]:
    """Every rank's ``values`` (the same count on every rank), in rank order, by one
    ``all_reduce(SUM)`` in which each rank fills only its own slots; ``[values]`` when not
    distributed. For small readings (a device's total and free bytes, a peak), never for
    tensors. Every rank must call it, in the same order as the other collectives.
    """
    own = [int(v) for v in values]
    if not is_distributed():
        return [own]
    import torch
    import torch.distributed as dist

    world, me, n = world_size(), rank(), len(own)
    flat = [0] * (n * world)
    flat[me * n : (me + 1) * n] = own
    device = _collective_device()
    slots = allocate_retrying(lambda: torch.tensor(flat, dtype=torch.int64, device=device))
    with no_alloc_section():
        dist.all_reduce(slots, op=dist.ReduceOp.SUM)
        out = [int(v) for v in slots.tolist()]
    return [out[r * n : (r + 1) * n] for r in range(world)]


def agree(
    *, gave_up: bool, splits: int, split: bool, aborted: bool = False, snapshot: bool = False
) -> Decision:
    """Agree on this step's outcome with every rank (one ``all_reduce(MAX)`` of 5 integers).

    Args:
        gave_up: This rank could not finish the step.
        splits: Micro-batches this rank ended the step with.
        split: This rank had to split its batch further in the step.
        aborted: This rank is stopping with an error that is not an out-of-memory.
        snapshot: This rank wants the optimizer step snapshotted.

    Returns:
        The :class:`Decision` every rank gets; this rank's own values when not distributed.
    """
    if not is_distributed():
        return Decision(gave_up, splits, split, aborted, snapshot)
    values = _all_max([int(gave_up), int(splits), int(split), int(aborted), int(snapshot)])
    return Decision(
        gave_up=bool(values[0]),
        splits=values[1],
        split=bool(values[2]),
        aborted=bool(values[3]),
        snapshot=bool(values[4]),
    )


def settle(*, failed: bool, aborted: bool = False) -> Settlement:
    """Agree on how the optimizer step ended (one ``all_reduce(MAX)`` of 4 integers).

    Args:
        failed: This rank's step ran out of memory and could not be done.
        aborted: This rank is stopping with an error that is not an out-of-memory.

    Returns:
        The :class:`Settlement`; this rank's own when not distributed.
    """
    if not is_distributed():
        return Settlement(aborted, failed, failed, None if failed else 0)
    world, me = world_size(), rank()
    # MAX of (world - rank) over the ranks that succeeded picks the lowest of them.
    values = _all_max([int(aborted), int(failed), int(not failed), 0 if failed else world - me])
    return Settlement(
        aborted=bool(values[0]),
        failed=bool(values[1]),
        all_failed=not values[2],
        source=world - values[3] if values[2] else None,
    )


def try_abort(*, during_step: bool) -> None:
    """Tell the other ranks this one is stopping with an error (best effort, then return).

    Joins the collective the other ranks are waiting in (the step's agreement, or the
    settlement after ``optimizer.step()`` when ``during_step``) with the abort flag set, so
    they stop too instead of waiting for this rank forever. Errors of the collective itself
    are swallowed: the caller is already raising the error that matters.
    """
    if not is_distributed():
        return
    try:
        if during_step:
            settle(failed=True, aborted=True)
        else:
            agree(gave_up=False, splits=1, split=False, aborted=True)
    except Exception:  # a broken process group: the caller's own error is what to report
        return


def repair_optimizer(optimizer: Any, source: int) -> None:
    """Copy ``source``'s parameters and optimizer state to every other rank.

    Every rank calls it (the collectives must match). The ranks whose step succeeded hold
    the same values already (the same update of the same averaged gradients), so the copy
    changes nothing there and makes the ranks whose step failed whole again. The state's
    layout travels first (keys, shapes, dtypes, devices, plain values), so a rank whose
    failed step left state missing or half-made gets it complete.

    Args:
        optimizer: The optimizer (the same parameters in the same order on every rank).
        source: The rank whose parameters and state are copied.
    """
    import torch
    import torch.distributed as dist

    me = rank()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    layout_list: list[Any] = []
    if me == source:
        layout_list = [
            {
                key: (
                    (
                        "tensor",
                        tuple(value.shape),
                        str(value.dtype).replace("torch.", ""),
                        value.device == p.device,
                    )
                    if isinstance(value, torch.Tensor)
                    else ("plain", value)
                )
                for key, value in optimizer.state.get(p, {}).items()
            }
            for p in params
        ]
    layout = _broadcast_object(layout_list, source)
    device = _collective_device()
    tensors: list[torch.Tensor] = []
    for p, keys in zip(params, layout, strict=True):
        tensors.append(p)
        if me != source:
            state = optimizer.state[p]
            for key in [k for k in state if k not in keys]:
                del state[key]
            if not keys:
                optimizer.state.pop(p, None)
        for key, spec in keys.items():
            if spec[0] == "plain":
                if me != source:
                    optimizer.state[p][key] = spec[1]
                continue
            current = optimizer.state[p].get(key)
            shape, dtype, on_param = spec[1], getattr(torch, spec[2]), spec[3]
            where = p.device if on_param else torch.device("cpu")
            if not (
                isinstance(current, torch.Tensor)
                and tuple(current.shape) == shape
                and current.dtype == dtype
                and current.device == where
            ):
                current = allocate_retrying(_zeros(shape, dtype, where))
                optimizer.state[p][key] = current
            tensors.append(current)
    with torch.no_grad(), no_alloc_section():
        for t in tensors:
            if t.device == device or (device.type == "cpu" and not t.is_cuda):
                dist.broadcast(t, src=source)
            else:  # a CPU scalar under NCCL: through the collective device and back
                moved = allocate_retrying(_copy_to(t, device))
                dist.broadcast(moved, src=source)
                t.copy_(moved)


def _flattener(group: list[torch.Tensor]) -> Callable[[], torch.Tensor]:
    import torch

    return lambda: torch.cat([g.reshape(-1) for g in group])


def _copy_to(t: torch.Tensor, device: torch.device) -> Callable[[], torch.Tensor]:
    return lambda: t.to(device, copy=True)


def _broadcast_object(obj: Any, source: int) -> Any:
    """``source``'s ``obj`` on every rank: a pickle in two broadcasts (its size, its bytes).

    Like ``broadcast_object_list``, with every allocation made before its collective and
    retried on out-of-memory, so that a rank cannot drop out between the two collectives.
    """
    import pickle

    import torch
    import torch.distributed as dist

    device = _collective_device()
    payload = pickle.dumps(obj) if rank() == source else b""
    size = allocate_retrying(lambda: torch.tensor([len(payload)], dtype=torch.int64, device=device))
    with no_alloc_section():
        dist.broadcast(size, src=source)
    n = int(size.item())
    buffer = allocate_retrying(
        lambda: (
            torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device)
            if payload
            else torch.empty(n, dtype=torch.uint8, device=device)
        )
    )
    with no_alloc_section():
        dist.broadcast(buffer, src=source)
    if rank() == source:
        return obj
    data = allocate_retrying(lambda: buffer.cpu().numpy().tobytes())
    return pickle.loads(data)


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Callable[[], Any]:
    import torch

    return lambda: torch.zeros(shape, dtype=dtype, device=device)


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
            p.grad = allocate_retrying(_zeros_like(p))
        grads.append(p.grad)
    by_dtype: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for g in grads:
        by_dtype.setdefault((g.dtype, g.device), []).append(g)
    n = dist.get_world_size()
    for group in by_dtype.values():
        flat = allocate_retrying(_flattener(group))
        with no_alloc_section():
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            flat.div_(n)
            offset = 0
            for g in group:
                g.copy_(flat.narrow(0, offset, g.numel()).view_as(g))
                offset += g.numel()
