"""What TrainGuard costs per step, against a bare loop and against today's cleanup habit.

The same training step run seven ways in one process:

* ``bare``: ``zero_grad(); loss.backward(); step()``;
* ``bare_again``: the same again, measured as if it were another mode: the noise floor of
  the method (its ratio to ``bare`` should be 1 within the noise);
* ``bare_item``: ``bare`` plus ``loss.item()``, i.e. a bare loop that also gets the loss as a
  float, which ``TrainGuard.__call__`` returns (on a GPU this waits for the step to finish);
* ``guard``: ``memfit.TrainGuard(optimizer, loss_fn)(batch)`` (no out-of-memory happens: this
  is the price of being ready for one; the default ``snapshot_optimizer="auto"`` copies the
  parameters and optimizer state being stepped to a journal on their device before every
  ``optimizer.step()``); it returns the loss as a float, so compare it with ``bare_item``;
* ``guard_never``: the same with ``snapshot_optimizer="never"`` (no copy at all: what the
  default cost before issue 21 made it exact; ``guard`` against ``guard_never`` is the
  journal's price);
* ``guard_step``: ``guard.step(batch)``, the same step returning the loss as a tensor, without
  waiting for the device: compare it with ``bare``;
* ``guard_snapshot_always``: the same with ``snapshot_optimizer="always"`` (a host copy of
  parameters and optimizer state before every ``optimizer.step()``);
* ``habit``: the bare loop plus what many training loops do blindly: ``empty_cache()`` every 10
  steps, ``gc.collect()`` every 50, a full reset every 200 (``memfit.cleanup``).

For a small MLP and a small CNN whose batch is scaled until the bare step takes about
``--step-ms`` (5 ms) on the device. The modes run in short blocks, in a new random order in
every round, and each block's time is compared with the ``bare`` block of the same round
(a paired design: a slow stretch of a shared machine hits a whole round, not one mode). The
result is the median of those per-round ratios (steps/s of the mode over bare; 1.000 = free),
with its interquartile range, from process CPU time and from wall-clock time (on CUDA the
device is synchronised at the end of each block). Then the DDP part: 2 processes (gloo on CPU,
NCCL on 2+ GPUs is not attempted), plain DDP (reduce during backward) against the guard's way
(``no_sync()`` backward, then one flattened all-reduce), steps/s each.

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
import random
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"


def _mlp(device: str, batch: int = 192) -> tuple[Any, Any, Callable[[], Any]]:
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
    ).to(device)
    x = torch.randn(batch, 256, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    return model, (x, y), lambda: nn.functional.cross_entropy


def _cnn(device: str, batch: int = 8) -> tuple[Any, Any, Callable[[], Any]]:
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
    x = torch.randn(batch, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    return model, (x, y), lambda: nn.functional.cross_entropy


MODELS: dict[str, tuple[Callable[..., tuple[Any, Any, Callable[[], Any]]], int]] = {
    "mlp": (_mlp, 192),
    "cnn": (_cnn, 8),
}


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _bare_ms(name: str, device: str, batch: int) -> float:
    """Median wall-clock ms of a bare step at ``batch`` (for the calibration)."""
    import torch

    build, _ = MODELS[name]
    model, (x, y), make_loss = build(device, batch)
    loss = make_loss()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    times = []
    for i in range(25):
        _sync(device)
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss(model(x), y).backward()
        opt.step()
        _sync(device)
        if i >= 5:
            times.append(time.perf_counter() - start)
    return 1000.0 * statistics.median(times)


def calibrate(name: str, device: str, step_ms: float) -> int:
    """The batch whose bare step takes about ``step_ms`` on ``device``."""
    batch = MODELS[name][1]
    for _ in range(6):
        ms = _bare_ms(name, device, batch)
        if abs(ms - step_ms) <= 0.1 * step_ms:
            break
        # Steps have a fixed part (launches, Python), so move in bounded jumps.
        factor = min(8.0, max(0.125, step_ms / ms))
        batch = max(1, round(batch * factor))
    return batch


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(values, n=4)
    return q[0], statistics.median(values), q[2]


def bench_model(name: str, device: str, rounds: int, block: int, step_ms: float) -> dict[str, Any]:
    """Paired, randomised comparison of the modes for one model (see the module docstring)."""
    import torch

    import memfit
    from memfit import cleanup

    batch_items = calibrate(name, device, step_ms)
    build, _ = MODELS[name]
    model, batch, make_loss = build(device, batch_items)
    loss = make_loss()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)

    def loss_fn(b: Any) -> Any:
        return loss(model(b[0]), b[1])

    def bare_step() -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(batch).backward()
        opt.step()

    def bare_item_step() -> None:
        opt.zero_grad(set_to_none=True)
        value = loss_fn(batch)
        value.backward()
        opt.step()
        value.item()

    guard = memfit.TrainGuard(opt, loss_fn)
    guard_always = memfit.TrainGuard(opt, loss_fn, snapshot_optimizer="always")
    guard_never = memfit.TrainGuard(opt, loss_fn, snapshot_optimizer="never")

    def guard_step() -> None:
        guard(batch)

    def guard_always_step() -> None:
        guard_always(batch)

    def guard_never_step() -> None:
        guard_never(batch)

    def guard_tensor_step() -> None:
        guard.step(batch)

    empty_10 = cleanup.every(10, empty_cache=True)
    gc_50 = cleanup.every(50, empty_cache=False, gc_collect=True)
    reset_200 = cleanup.every(200, empty_cache=True, gc_collect=True, reset=True)

    def habit_step() -> None:
        bare_step()
        empty_10()
        gc_50()
        reset_200()

    modes: dict[str, Callable[[], None]] = {
        "bare": bare_step,
        "bare_again": bare_step,
        "bare_item": bare_item_step,
        "guard": guard_step,
        "guard_step": guard_tensor_step,
        "guard_snapshot_always": guard_always_step,
        "guard_never": guard_never_step,
        "habit": habit_step,
    }
    for fn in modes.values():  # warm up: allocator, optimizer state, snapshot buffers
        for _ in range(5):
            fn()
    _sync(device)
    wall: dict[str, list[float]] = {m: [] for m in modes}
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    shuffle = random.Random(0).shuffle
    order = list(modes)
    for _ in range(rounds):
        shuffle(order)
        for mode in order:
            fn = modes[mode]
            _sync(device)
            start = time.perf_counter()
            cpu_start = time.process_time()
            for _ in range(block):
                fn()
            _sync(device)
            wall[mode].append((time.perf_counter() - start) / block)
            cpu[mode].append((time.process_time() - cpu_start) / block)

    def paired(times: dict[str, list[float]]) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for mode in modes:
            ratios = [b / t for b, t in zip(times["bare"], times[mode], strict=True)]
            low, mid, high = _quartiles(ratios)
            # Whole-run ratio (total bare time over total mode time): what steps/s over the
            # run say, and the right figure for costs that come every n steps (the habit).
            total = sum(times["bare"]) / sum(times[mode])
            out[mode] = {"ratio": total, "median": mid, "q1": low, "q3": high}
        return out

    return {
        "model": name,
        "device": device,
        "batch": batch_items,
        "rounds": rounds,
        "steps_per_block": block,
        "ms_per_step_wall": {m: 1000.0 * statistics.median(v) for m, v in wall.items()},
        "ms_per_step_cpu": {m: 1000.0 * statistics.median(v) for m, v in cpu.items()},
        "wall": paired(wall),
        "cpu": paired(cpu),
        "habit_cleanups": {
            "empty_cache_every_10": empty_10.stats.to_dict(),
            "gc_collect_every_50": gc_50.stats.to_dict(),
            "full_reset_every_200": reset_200.stats.to_dict(),
        },
        "guard_events": len(guard.events),
        # What the default's journal holds between steps (device memory on CUDA only
        # during optimizer.step(); kept in host memory on a CPU).
        "journal_bytes": guard.journal_held_bytes,
        "parameter_and_state_bytes": sum(
            t.numel() * t.element_size()
            for p in model.parameters()
            for t in [p, *(v for v in opt.state[p].values() if isinstance(v, torch.Tensor))]
        ),
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


MODES = (
    "bare_again",
    "bare_item",
    "guard",
    "guard_step",
    "guard_never",
    "guard_snapshot_always",
    "habit",
)


def _markdown(result: dict[str, Any]) -> str:
    lines = [
        f"# TrainGuard overhead ({result['date']}, {result['machine']})",
        "",
        f"Command: `{result['command']}`",
        "",
        "Steps/s of each mode over steps/s of bare (1.000 = free, below 1 = slower): the "
        "whole-run ratio, then in brackets the median and interquartile range of the "
        "per-round paired ratios.",
        "",
    ]
    for clock, what in (("cpu", "process CPU time"), ("wall", "wall-clock time")):
        lines += [
            f"**{what}**",
            "",
            "| model | device | batch | bare ms | " + " | ".join(MODES) + " |",
            "|---|---|---:|---:|" + "---:|" * len(MODES),
        ]
        for r in result["models"]:
            ms = r[f"ms_per_step_{clock}"]["bare"]
            cells = [
                f"{r[clock][m]['ratio']:.3f} ({r[clock][m]['median']:.3f}; "
                f"{r[clock][m]['q1']:.3f}-{r[clock][m]['q3']:.3f})"
                for m in MODES
            ]
            lines.append(
                f"| {r['model']} | {r['device']} | {r['batch']} | {ms:.2f} | "
                + " | ".join(cells)
                + " |"
            )
        lines.append("")
    ddp = result.get("ddp")
    if ddp:
        sps = ddp["steps_per_s"]
        lines += [
            "| DDP (2 ranks, gloo, CPU) | plain DDP steps/s | guard (no_sync + 1 all-reduce) "
            "steps/s | guard / plain (median) | guard / plain (best round) |",
            "|---|---:|---:|---:|---:|",
            f"| {ddp['model']} | {sps['plain_ddp']:.1f} | {sps['guard_ddp']:.1f} "
            f"| {ddp['guard_ratio']:.3f} | {ddp['best_guard_ratio']:.3f} |",
            "",
        ]
    lines += [
        "| model | device | parameters + optimizer state | journal held (default) |",
        "|---|---|---:|---:|",
    ]
    lines += [
        f"| {r['model']} | {r['device']} | {r['parameter_and_state_bytes']:,} B "
        f"| {r['journal_bytes']:,} B |"
        for r in result["models"]
    ]
    lines.append("")
    r0 = result["models"][0]
    lines.append(
        f"{r0['rounds']} rounds of {r0['steps_per_block']} steps per mode, in a random order "
        "each round; `bare_again` is bare measured as another mode (the method's noise)."
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and steps")
    parser.add_argument("--no-ddp", action="store_true", help="skip the DDP comparison")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument(
        "--step-ms", type=float, default=5.0, help="bare step time to scale the batch to"
    )
    parser.add_argument(
        "--devices", default=None, help="comma-separated, e.g. cpu,cuda (default: all here)"
    )
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    rounds, block = (40, 5) if args.quick else (150, 5)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    if args.devices:
        devices = [d.strip() for d in args.devices.split(",") if d.strip()]
    models = [
        bench_model(name, dev, rounds, block, args.step_ms) for dev in devices for name in MODELS
    ]
    result: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, "
        f"torch {torch.__version__}, {args.threads} thread(s)"
        + (f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""),
        "command": "python bench/guard_overhead.py " + " ".join(argv or sys.argv[1:]),
        "models": models,
    }
    if not args.no_ddp:
        result["ddp"] = bench_ddp(60)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "guard_overhead.json").write_text(json.dumps(result, indent=2))
    table = _markdown(result)
    (OUT / "guard_overhead.md").write_text(table)
    sys.stdout.write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
