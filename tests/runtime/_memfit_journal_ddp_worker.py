"""Worker for test_guard_journal_budget.py: the default journal on a tight budget under DDP.

Each rank measures the peak of the guard without a journal (``"never"``) on a simulated GPU,
then runs the default guard on a budget of exactly that peak: the journal must move its
copy to host memory, and the run must be the unjournaled one, bit for bit.
"""

from __future__ import annotations

import gc
import os
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import memfit
from memfit.runtime.guard import TrainGuard

STEPS = 3


def _optimizer(name: str, foreach: bool, params: Any) -> torch.optim.Optimizer:
    if name == "SGD":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9, foreach=foreach)
    cls = getattr(torch.optim, name)
    return cls(params, lr=1e-3, foreach=foreach)  # type: ignore[no-any-return]


def _run(name: str, foreach: bool, policy: str, budget: int, data: list[Any]) -> dict[str, Any]:
    with memfit.simulate_gpu(budget) as gpu:
        torch.manual_seed(0)
        ddp = DDP(nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 8)))
        opt = _optimizer(name, foreach, ddp.parameters())
        guard = TrainGuard(
            opt, lambda b: nn.functional.mse_loss(ddp(b[0]), b[1]), model=ddp,
            snapshot_optimizer=policy,
        )  # fmt: skip
        error: str | None = None
        try:
            for batch in data:
                guard(batch)
        except Exception as exc:  # reported to the test, which fails on it
            error = f"{type(exc).__name__}: {exc}"
        return {
            "peak": gpu.peak_allocated_bytes,
            "params": [p.detach().clone() for p in ddp.parameters()],
            "on_host": guard.journal_on_host,
            "error": error,
        }


def worker(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        gen = torch.Generator().manual_seed(100 + rank)
        data = [(torch.randn(16, 64, generator=gen), torch.randn(16, 8, generator=gen))
                for _ in range(STEPS)]  # fmt: skip
        results: dict[str, Any] = {}
        for name, foreach in (("SGD", True), ("Adam", True), ("AdamW", False)):
            never = _run(name, foreach, "never", 2**30, data)
            budget = int(never["peak"])
            auto = _run(name, foreach, "auto", budget, data)
            results[f"{name}-{foreach}"] = {
                "never": never["params"],
                "auto": auto["params"],
                "on_host": auto["on_host"],
                "peak": auto["peak"],
                "budget": budget,
                "error": never["error"] or auto["error"],
            }
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        gc.collect()  # see _memfit_guard_ddp_worker.py: destroy the group while alive
        dist.barrier()
        dist.destroy_process_group()
