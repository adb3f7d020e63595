"""A gloo rank for test_autoconfig_distributed: autoconfig on a simulated card of its own
size, then a Recorder comparing the ranks' peaks."""

from __future__ import annotations

import gc
import json
import os
from typing import Any

import torch
import torch.distributed as dist

import memfit


def worker(
    rank: int,
    world: int,
    port: int,
    out_dir: str,
    budgets: tuple[str, ...],
    workload: str,
    per_rank: tuple[str, ...],
    heavy_rank: int,
) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    result: dict[str, Any] = {}
    try:
        with memfit.simulate_gpu(budgets[rank]):
            try:
                cfg = memfit.autoconfig(workload, distributed=True, per_rank=per_rank)
                result["knobs"] = cfg.knobs
                result["fits"] = cfg.plan.fits
                result["ranks"] = [r.free_bytes for r in cfg.ranks]
                result["notes"] = cfg.notes
            except memfit.InfeasiblePlan as exc:
                result["infeasible"] = str(exc)
        with memfit.simulate_gpu("1GiB"), memfit.Recorder(None, ranks_every=2, log=False) as rec:
            kept = []
            for step in range(8):
                # every rank holds 1 MiB more per step; the heavy rank 3 MiB more from step 4
                extra = 3 if (rank == heavy_rank and step >= 4) else 1
                kept.append(torch.zeros(extra * 2**18))
                rec.step(step)
            result["events"] = [e.to_dict() for e in rec.events if e.kind == "rank_imbalance"]
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w", encoding="utf-8") as fh:
            json.dump(result, fh)
    finally:
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()
