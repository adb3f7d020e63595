"""What TrainGuard costs per step, against a bare loop and against today's cleanup habit.

Four ways to run the same training step, measured in one process, interleaved in rounds
(bare, guard, guard always, habit, bare, ...) so drifts in machine load hit all alike:

* ``bare``: ``zero_grad(); loss.backward(); step()``;
* ``guard``: ``memfit.TrainGuard(optimizer, loss_fn)(batch)`` (no out-of-memory happens: this
  is the price of being ready for one: ``autograd.grad`` and the bookkeeping; with the default
  ``snapshot_optimizer="auto"`` no host snapshot is taken while memory is not at risk);
* ``guard_snapshot_always``: the same with ``snapshot_optimizer="always"`` (a host copy of
  parameters and optimizer state before every ``optimizer.step()``);
* ``habit``: the bare loop plus what many training loops do blindly: ``empty_cache()`` every 10
  steps, ``gc.collect()`` every 50, a full reset every 200 (``memfit.cleanup``).

For a small MLP and a small CNN whose step takes about 5 ms on the device. The result is
steps/s per mode and the ratios to bare (median over rounds). Then the DDP part: 2 processes
(gloo on CPU, NCCL on 2+ GPUs is not attempted), plain DDP (reduce during backward) against
the guard's way (``no_sync()`` backward, then one flattened all-reduce), steps/s each.

    python bench/guard_overhead.py                 # CPU (and CUDA too when available)
    python bench/guard_overhead.py --quick         # fewer rounds

Writes ``bench/out/guard_overhead.json`` and ``.md`` and prints the markdown table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"


def _mlp(device: str) -> tuple[Any, Any, Callable[[], Any]]:
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
    ).to(device)
    x = torch.randn(192, 256, device=device)
    y = torch.randint(0, 10, (192,), device=device)
    return model, (x, y), lambda: nn.functional.cross_entropy


def _cnn(device: str) -> tuple[Any, Any, Callable[[], Any]]:
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(16 * 16, 10),
    ).to(device)
    x = torch.randn(8, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (8,), device=device)
    return model, (x, y), lambda: nn.functional.cross_entropy


MODELS: dict[str, Callable[[str], tuple[Any, Any, Callable[[], Any]]]] = {
    "mlp": _mlp,
    "cnn": _cnn,
}


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def bench_model(name: str, device: str, rounds: int, steps: int) -> dict[str, Any]:
    """Steps/s of bare, guard and habit for one model, interleaved over ``rounds``."""
    import torch

    import memfit
    from memfit import cleanup

    model, batch, make_loss = MODELS[name](device)
    loss = make_loss()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)

    def loss_fn(b: Any) -> Any:
        return loss(model(b[0]), b[1])

    def bare_step() -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(batch).backward()
        opt.step()

    guard = memfit.TrainGuard(opt, loss_fn)
    guard_always = memfit.TrainGuard(opt, loss_fn, snapshot_optimizer="always")

    def guard_step() -> None:
        guard(batch)

    def guard_always_step() -> None:
        guard_always(batch)

    empty_10 = cleanup.every(10, empty_cache=True)
    gc_50 = cleanup.every(50, empty_cache=False, gc_collect=True)
    reset_200 = cleanup.every(200, empty_cache=True, gc_collect=True, reset=True)

    def habit_step() -> None:
        bare_step()
        empty_10()
        gc_50()
        reset_200()

    modes = {
        "bare": bare_step,
        "guard": guard_step,
        "guard_snapshot_always": guard_always_step,
        "habit": habit_step,
    }
    for fn in modes.values():  # warm up: allocator, optimizer state, snapshot buffers
        for _ in range(5):
            fn()
    _sync(device)
    per_mode: dict[str, list[float]] = {m: [] for m in modes}
    cpu_ms: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(rounds):
        for mode, fn in modes.items():
            _sync(device)
            start = time.perf_counter()
            cpu_start = time.process_time()
            for _ in range(steps):
                fn()
            _sync(device)
            per_mode[mode].append(steps / (time.perf_counter() - start))
            cpu_ms[mode].append(1000.0 * (time.process_time() - cpu_start) / steps)
    rate = {m: statistics.median(v) for m, v in per_mode.items()}
    # The best round of each mode: what the step costs when nothing else interferes.
    best = {m: max(v) for m, v in per_mode.items()}
    # CPU time of this process per step: on a shared machine it leaves out the time the
    # process waited for a core, which wall time does not (one torch thread: CPU = work).
    cpu = {m: statistics.median(v) for m, v in cpu_ms.items()}
    return {
        "cpu_ms_per_step": cpu,
        "cpu_guard_ratio": cpu["bare"] / cpu["guard"],
        "cpu_guard_snapshot_always_ratio": cpu["bare"] / cpu["guard_snapshot_always"],
        "cpu_habit_ratio": cpu["bare"] / cpu["habit"],
        "model": name,
        "device": device,
        "step_ms_bare": 1000.0 / rate["bare"],
        "steps_per_s": rate,
        "best_steps_per_s": best,
        "guard_ratio": rate["guard"] / rate["bare"],
        "guard_snapshot_always_ratio": rate["guard_snapshot_always"] / rate["bare"],
        "habit_ratio": rate["habit"] / rate["bare"],
        "best_guard_ratio": best["guard"] / best["bare"],
        "best_guard_snapshot_always_ratio": best["guard_snapshot_always"] / best["bare"],
        "best_habit_ratio": best["habit"] / best["bare"],
        "rounds": rounds,
        "steps_per_round": steps,
        "habit_cleanups": {
            "empty_cache_every_10": empty_10.stats.to_dict(),
            "gc_collect_every_50": gc_50.stats.to_dict(),
            "full_reset_every_200": reset_200.stats.to_dict(),
        },
        "guard_events": len(guard.events),
    }


def _ddp_worker(rank: int, world: int, port: int, steps: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import memfit

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model, batch, make_loss = _mlp("cpu")
        loss = make_loss()
        plain = DDP(model)
        opt = torch.optim.Adam(plain.parameters(), lr=1e-4)

        def plain_step() -> None:
            opt.zero_grad(set_to_none=True)
            loss(plain(batch[0]), batch[1]).backward()
            opt.step()

        guarded_model, _, _ = _mlp("cpu")
        guarded = DDP(guarded_model)
        g_opt = torch.optim.Adam(guarded.parameters(), lr=1e-4)
        guard = memfit.TrainGuard(g_opt, lambda b: loss(guarded(b[0]), b[1]), model=guarded)

        def guard_step() -> None:
            guard(batch)

        rates: dict[str, list[float]] = {"plain_ddp": [], "guard_ddp": []}
        for fn in (plain_step, guard_step):
            for _ in range(5):
                fn()
        for _ in range(5):
            for mode, fn in (("plain_ddp", plain_step), ("guard_ddp", guard_step)):
                dist.barrier()
                start = time.perf_counter()
                for _ in range(steps):
                    fn()
                dist.barrier()
                rates[mode].append(steps / (time.perf_counter() - start))
        if rank == 0:
            summary = {m: statistics.median(v) for m, v in rates.items()}
            summary.update({f"best_{m}": max(v) for m, v in rates.items()})
            Path(out).write_text(json.dumps(summary))
    finally:
        dist.destroy_process_group()


def bench_ddp(steps: int) -> dict[str, Any]:
    """Plain DDP against the guard's no_sync + one all-reduce, 2 gloo processes on CPU."""
    import tempfile

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "ddp.json")
        mp.start_processes(_ddp_worker, args=(2, port, steps, out), nprocs=2, start_method="spawn")
        rates = json.loads(Path(out).read_text())
    return {
        "world_size": 2,
        "backend": "gloo",
        "model": "mlp",
        "steps_per_s": rates,
        "guard_ratio": rates["guard_ddp"] / rates["plain_ddp"],
        "best_guard_ratio": rates["best_guard_ddp"] / rates["best_plain_ddp"],
    }


def _markdown(result: dict[str, Any]) -> str:
    lines = [
        f"# TrainGuard overhead ({result['date']}, {result['machine']})",
        "",
        f"Command: `{result['command']}`",
        "",
        "| model | device | bare step (ms) | bare steps/s | guard steps/s "
        "| guard, snapshot always | habit steps/s | guard / bare | guard always / bare "
        "| habit / bare |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["models"]:
        sps = r["steps_per_s"]
        lines.append(
            f"| {r['model']} | {r['device']} | {r['step_ms_bare']:.2f} | {sps['bare']:.1f} "
            f"| {sps['guard']:.1f} | {sps['guard_snapshot_always']:.1f} | {sps['habit']:.1f} "
            f"| {r['guard_ratio']:.3f} | {r['guard_snapshot_always_ratio']:.3f} "
            f"| {r['habit_ratio']:.3f} |"
        )
    lines += [
        "",
        "CPU time of the process per step (median ms; ratio = bare / mode, as steps/s):",
        "",
        "| model | device | bare | guard | guard always | habit | guard / bare "
        "| guard always / bare | habit / bare |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["models"]:
        c = r["cpu_ms_per_step"]
        lines.append(
            f"| {r['model']} | {r['device']} | {c['bare']:.3f} | {c['guard']:.3f} "
            f"| {c['guard_snapshot_always']:.3f} | {c['habit']:.3f} "
            f"| {r['cpu_guard_ratio']:.3f} | {r['cpu_guard_snapshot_always_ratio']:.3f} "
            f"| {r['cpu_habit_ratio']:.3f} |"
        )
    lines += [
        "",
        "Best round of each mode (least disturbed by other load):",
        "",
        "| model | device | guard / bare | guard always / bare | habit / bare |",
        "|---|---|---:|---:|---:|",
    ]
    for r in result["models"]:
        lines.append(
            f"| {r['model']} | {r['device']} | {r['best_guard_ratio']:.3f} "
            f"| {r['best_guard_snapshot_always_ratio']:.3f} | {r['best_habit_ratio']:.3f} |"
        )
    ddp = result.get("ddp")
    if ddp:
        sps = ddp["steps_per_s"]
        lines += [
            "",
            "| DDP (2 ranks, gloo, CPU) | plain DDP steps/s | guard (no_sync + 1 all-reduce) "
            "steps/s | guard / plain (median) | guard / plain (best round) |",
            "|---|---:|---:|---:|---:|",
            f"| {ddp['model']} | {sps['plain_ddp']:.1f} | {sps['guard_ddp']:.1f} "
            f"| {ddp['guard_ratio']:.3f} | {ddp['best_guard_ratio']:.3f} |",
        ]
    lines += [
        "",
        "Ratios are steps/s over bare (1.000 = free; below 1 = slower): wall-clock medians, "
        "process CPU time, and best wall-clock rounds, over "
        f"{result['models'][0]['rounds']} interleaved rounds.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and steps")
    parser.add_argument("--no-ddp", action="store_true", help="skip the DDP comparison")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    rounds, steps = (3, 40) if args.quick else (11, 60)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    models = [bench_model(name, dev, rounds, steps) for dev in devices for name in MODELS]
    result: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, "
        f"torch {torch.__version__}, {args.threads} thread(s)"
        + (f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""),
        "command": "python bench/guard_overhead.py" + (" --quick" if args.quick else ""),
        "models": models,
    }
    if not args.no_ddp:
        result["ddp"] = bench_ddp(steps)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "guard_overhead.json").write_text(json.dumps(result, indent=2))
    table = _markdown(result)
    (OUT / "guard_overhead.md").write_text(table)
    sys.stdout.write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
