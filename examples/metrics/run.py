"""Memory metrics where people already look: Prometheus and TensorBoard, on the CPU.

A small PyTorch training loop runs on a simulated 256 MiB GPU (``memfit.simulate_gpu``)
under a guard, with a Recorder whose sinks are

* a Prometheus endpoint (``memfit.integrations.prometheus.PrometheusSink``, bound to
  127.0.0.1 on a free port here; ``:9400`` in a real job), scraped once by this script over
  loopback, and
* a TensorBoard ``SummaryWriter``, whose event file is read back at the end.

Out-of-memory is injected into a few steps so the guard's events show in both. Point
Prometheus at the endpoint, or ``tensorboard --logdir <logdir>``, to see them live;
``memfit watch --prometheus :9400`` serves every GPU's and process's memory the same way.

    python examples/metrics/run.py [--logdir runs/memfit] [--steps 20]
"""

from __future__ import annotations

import argparse
import tempfile
import urllib.request

import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.tensorboard import SummaryWriter

import memfit
from memfit.integrations.prometheus import PrometheusSink
from memfit.testing import inject_oom


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--logdir", default=None, help="TensorBoard folder (default: a temp)")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    logdir = args.logdir or tempfile.mkdtemp(prefix="memfit-tb-")

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def loss_fn(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(model(x), y)

    writer = SummaryWriter(log_dir=logdir)
    with PrometheusSink("127.0.0.1:0") as prom:
        rec = memfit.Recorder(None, log=False, sinks=[prom, writer])
        guard = memfit.TrainGuard(optimizer, loss_fn, model=model, on_event=rec.on_event)
        with memfit.simulate_gpu("256MiB"):
            for step in range(args.steps):
                batch = (torch.randn(512, 64), torch.randn(512, 1))
                with inject_oom(0.02, seed=step, limit=1, where=("backward",)):
                    guard(batch)
                rec.step(step)
            url = f"http://127.0.0.1:{prom.port}/metrics"
            with urllib.request.urlopen(url, timeout=5) as answer:
                scraped = answer.read().decode("utf-8")
        rec.close()
    writer.close()
    wanted = ("memfit_allocated_bytes", "memfit_step ", "memfit_events_total")
    print(f"scraped {url}:")
    for line in scraped.splitlines():
        if line.startswith(wanted):
            print(f"  {line}")
    acc = EventAccumulator(logdir)
    acc.Reload()
    tags = sorted(acc.Tags()["scalars"])
    points = len(acc.Scalars("memory/allocated_mib"))
    print(f"TensorBoard {logdir}: {points} points of memory/allocated_mib; tags: {', '.join(tags)}")


if __name__ == "__main__":
    main()
