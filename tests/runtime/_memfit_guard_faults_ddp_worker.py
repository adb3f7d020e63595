"""Worker for test_distributed_faults.py: faults on one rank, every rank must end the same."""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils._python_dispatch import TorchDispatchMode

from memfit.errors import MemfitError, OutOfMemory
from memfit.runtime.guard import TrainGuard
from memfit.runtime.oom import in_no_alloc_section
from memfit.testing import inject_oom

STEPS = 10


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2)).double()


def _data(rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(100 + rank)
    return [
        (
            torch.randn(16, 8, generator=gen, dtype=torch.float64),
            torch.randn(16, 2, generator=gen, dtype=torch.float64),
        )
        for _ in range(STEPS)
    ]


def _reference(data: list[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
    ref = DDP(_model())
    opt = torch.optim.Adam(ref.parameters(), lr=1e-2, foreach=True)
    for x, y in data:
        opt.zero_grad()
        nn.functional.mse_loss(ref(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in ref.parameters()]


class _PerParameter(TrainGuard):
    """The default journal, holding one parameter at a time (as for a large model)."""

    journal_bytes = 1


class _RaiseInStep(TorchDispatchMode):
    """Raise ``error`` at the ``at``-th operation inside ``optimizer.step()`` (in-place ones
    included), or count them when ``error`` is ``None``."""

    def __init__(self, error: BaseException | None, at: int) -> None:
        super().__init__()
        self.error, self.at, self.seen, self.inside = error, at, 0, 0

    def __enter__(self) -> Any:
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        def pre(*_: Any) -> None:
            self.inside += 1

        def post(*_: Any) -> None:
            self.inside = max(0, self.inside - 1)

        self.handles = [
            register_optimizer_step_pre_hook(pre),
            register_optimizer_step_post_hook(post),
        ]
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        for h in self.handles:
            h.remove()
        super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if self.inside and not (
            in_no_alloc_section()
            or func.is_view
            or func.namespace == "profiler"  # as inject_oom counts them
            or func._opname == "_local_scalar_dense"
        ):
            index = self.seen
            self.seen += 1
            if index == self.at and self.error is not None:
                self.inside = 0
                raise self.error
        return func(*args, **(kwargs or {}))


def _guarded(
    data: list[tuple[torch.Tensor, torch.Tensor]],
    fault: Callable[[int], contextlib.AbstractContextManager[Any]],
    loss_hook: Callable[[int], None] = lambda step: None,
    guard_class: type[TrainGuard] = TrainGuard,
    **kwargs: Any,
) -> dict[str, Any]:
    ddp = DDP(_model())
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-2, foreach=True)
    state = {"step": 0}

    def loss_fn(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        loss_hook(state["step"])
        return nn.functional.mse_loss(ddp(batch[0]), batch[1])

    guard = guard_class(opt, loss_fn, model=ddp, **kwargs)
    raised: str | None = None
    try:
        for step, batch in enumerate(data):
            state["step"] = step
            with fault(step):
                guard(batch)
    except BaseException as exc:  # KeyboardInterrupt too: the scenario provokes it
        raised = f"{type(exc).__name__}: {exc}"
    return {
        "params": [p.detach().clone() for p in ddp.parameters()],
        "state": [
            v.clone()
            for p in ddp.parameters()
            for _, v in sorted(opt.state.get(p, {}).items())
            if isinstance(v, torch.Tensor)
        ],
        "steps": guard.steps,
        "raised": raised,
        "kinds": [e.kind for e in guard.events],
        "messages": [e.message for e in guard.events],
    }


def _sqrt_index() -> int:
    """Index of Adam's last allocating operation (sqrt of the second moment) in its step."""
    model = _model()
    opt = torch.optim.Adam(model.parameters(), foreach=True)
    for _ in range(2):
        model(torch.ones(2, 8, dtype=torch.float64)).sum().backward()
        with inject_oom(0.0, where=("optimizer",)) as probe:
            opt.step()
    return probe.ops_seen - 1


class _Halfway(contextlib.AbstractContextManager[Any]):
    """Inside the block, optimizer.step() updates one parameter, then raises."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __enter__(self) -> Any:
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        def hook(opt: Any, args: Any, kwargs: Any) -> None:
            first = opt.param_groups[0]["params"][0]
            with torch.no_grad():
                first.add_(1.0)
            raise self.error

        self.handle = register_optimizer_step_pre_hook(hook)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.handle.remove()


def worker(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    none = contextlib.nullcontext
    try:
        data = _data(rank)
        sqrt = _sqrt_index()
        results: dict[str, Any] = {"reference": _reference(data)}

        # 1. Rank 1's optimizer step fails halfway (no snapshot): rank 0's state repairs it.
        def halfway_oom(step: int) -> Any:
            if rank == 1 and step in (3, 7):
                return inject_oom(0.0, where=("optimizer",), at=[sqrt])
            return none()

        results["one_rank_step_fails"] = _guarded(data, halfway_oom, snapshot_optimizer="never")

        # 2. Every rank's step keeps failing: all give up together, restored, identical.
        def always_oom(step: int) -> Any:
            return inject_oom(1.0, where=("optimizer",)) if step == 4 else none()

        results["every_rank_step_fails"] = _guarded(data, always_oom, snapshot_optimizer="always")

        # 3. Rank 1 raises a RuntimeError inside optimizer.step(): every rank stops.
        def step_error(step: int) -> Any:
            return _Halfway(RuntimeError("a bug")) if rank == 1 and step == 5 else none()

        results["error_in_step"] = _guarded(data, step_error, snapshot_optimizer="always")

        # 4. Rank 1 is interrupted in its forward: every rank stops.
        def interrupt(step: int) -> None:
            if rank == 1 and step == 2:
                raise KeyboardInterrupt

        results["interrupt_in_forward"] = _guarded(data, lambda step: none(), loss_hook=interrupt)

        # 5. The default policy: a fault on rank 1 inside step 3's optimizer.step(), at its
        # second operation, in its middle and at its last, in one chunk and per parameter.
        model = _model()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2, foreach=True)
        for _ in range(2):
            model(torch.ones(2, 8, dtype=torch.float64)).sum().backward()
            with _RaiseInStep(None, -1) as probe:
                opt.step()
        ops = probe.seen
        for chunked in (False, True):
            for kind in ("oom", "error", "interrupt"):
                for at in (1, ops // 2, ops - 1):

                    def fault(step: int, kind: str = kind, at: int = at) -> Any:
                        if rank != 1 or step != 3:
                            return none()
                        if kind == "oom":
                            return inject_oom(0.0, where=("optimizer",), at=[at], inplace=True)
                        error = RuntimeError("a bug") if kind == "error" else KeyboardInterrupt()
                        return _RaiseInStep(error, at)

                    name = f"default_{kind}_{'chunked' if chunked else 'whole'}_{at}"
                    results[name] = _guarded(
                        data, fault, guard_class=_PerParameter if chunked else TrainGuard
                    )
        results["default_ops"] = ops
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    except OutOfMemory as exc:  # pragma: no cover - reported through the missing file
        raise MemfitError(str(exc)) from exc
    finally:
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()
