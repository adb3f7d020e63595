"""Worker for test_distributed_guard.py (a module, so torch.multiprocessing.spawn can import it)."""

from __future__ import annotations

import contextlib
import gc
import os
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from memfit.errors import OutOfMemory
from memfit.runtime.guard import TrainGuard
from memfit.testing import inject_oom


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))


def _optimizer(name: str, params: Any) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    return torch.optim.Adam(params, lr=1e-3)


def _run(
    rank: int,
    name: str,
    data: list[tuple[torch.Tensor, torch.Tensor]],
    rate: float,
    oom_rank: int,
    max_splits: int,
) -> dict[str, Any]:
    # Reference: plain DDP, no out-of-memory.
    ref = DDP(_model())
    ref_opt = _optimizer(name, ref.parameters())
    for x, y in data:
        ref_opt.zero_grad()
        nn.functional.mse_loss(ref(x), y).backward()
        ref_opt.step()

    # Guarded: out-of-memory injected on one rank only.
    ddp = DDP(_model())
    opt = _optimizer(name, ddp.parameters())

    def loss_fn(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return nn.functional.mse_loss(ddp(batch[0]), batch[1])

    guard = TrainGuard(opt, loss_fn, model=ddp, grow_back_after=5, max_splits=max_splits)
    chaos = inject_oom(rate, seed=rank) if rank == oom_rank else contextlib.nullcontext()
    gave_up: str | None = None
    with chaos as record:
        try:
            for batch in data:
                guard(batch)
        except OutOfMemory as exc:
            gave_up = exc.message
    return {
        "ref": [p.detach().clone() for p in ref.parameters()],
        "guard": [p.detach().clone() for p in ddp.parameters()],
        "ooms": record.total_raised if record is not None else 0,
        "splits": guard.splits,
        "kinds": [e.kind for e in guard.events],
        "steps": guard.steps,
        "gave_up": gave_up,
    }


def worker(
    rank: int,
    world: int,
    port: int,
    out_dir: str,
    steps: int,
    rate: float,
    oom_rank: int,
    names: tuple[str, ...],
    max_splits: int,
) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        gen = torch.Generator().manual_seed(100 + rank)  # each rank its own shard
        data = [
            (torch.randn(32, 16, generator=gen), torch.randn(32, 4, generator=gen))
            for _ in range(steps)
        ]

        results: dict[str, Any] = {}
        for name in names:
            results[name] = _run(rank, name, data, rate, oom_rank, max_splits)
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        # DDP modules sit in reference cycles that keep the process group alive until the
        # interpreter's final collection; a gloo worker thread that frees a finished
        # collective's tensor then (it needs the GIL) aborts the process with SIGABRT
        # ("terminate called without an active exception": about 1 run in 3 on a busy
        # 2-core machine). Collecting first lets destroy_process_group() really destroy the
        # group, joining its threads while the interpreter is alive.
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()
