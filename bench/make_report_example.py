"""Make the example report shown in the README: docs/report_example.png and .html.

A small MLP regression is trained on the CPU under ``memfit.simulate_gpu`` (an 8 MiB GPU),
with a :class:`memfit.Recorder` sampling every step and a :class:`memfit.TrainGuard` whose
events the Recorder receives. Two things happen that a report should show:

* every 40th batch is 4x larger than the others; it does not fit the simulated GPU, so the
  guard splits it into micro-batches (``oom`` / ``split`` events) and grows back later;
* the loop keeps each step's predictions on the "GPU" for a metric (a classic leak: 8 KiB
  a step), which the Recorder flags with its rate and the step it would run out at.

Run: ``python bench/make_report_example.py`` (about a minute on a laptop CPU). The run's
JSON lines go to ``bench/out/report_example.jsonl``.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import torch

from memfit.monitor.recorder import Recorder
from memfit.monitor.report import load_run
from memfit.monitor.report_html import write_html
from memfit.monitor.report_plot import write_png
from memfit.runtime.guard import TrainGuard
from memfit.runtime.simulate import simulate_gpu

ROOT = Path(__file__).resolve().parent.parent
BUDGET = "8MiB"


def train(path: Path, steps: int) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)  # a small model: threads only add overhead
    gen = torch.Generator().manual_seed(0)
    predictions: list[torch.Tensor] = []  # the leak: kept "on the GPU" for a metric
    with (
        simulate_gpu(BUDGET),
        Recorder(path, log_every=50, leak_check_seconds=0.0) as rec,
    ):
        # built inside the simulated GPU, so parameters and optimizer state count against it
        model = torch.nn.Sequential(
            torch.nn.Linear(64, 256),
            torch.nn.ReLU(),
            torch.nn.Linear(256, 256),
            torch.nn.ReLU(),
            torch.nn.Linear(256, 1),
        )
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        guard = TrainGuard(
            opt,
            lambda b: torch.nn.functional.mse_loss(model(b[0]), b[1]),
            on_event=rec.on_event,
            grow_back_after=10,
        )
        for step in range(steps):
            size = 2048 if step % 40 == 39 else 512
            x = torch.randn(size, 64, generator=gen)
            y = x[:, :1].clone()
            guard((x, y))
            with torch.no_grad():  # 8 x 256 floats = 8 KiB a step, never freed
                predictions.append(model[:4](x[:8]))
            del x, y
            rec.step(step=step)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    run_path = ROOT / "bench" / "out" / "report_example.jsonl"
    run_path.parent.mkdir(parents=True, exist_ok=True)
    run_path.unlink(missing_ok=True)
    train(run_path, args.steps)
    run = load_run(run_path)
    title = f"example: MLP on a simulated {BUDGET} GPU, TrainGuard + a planted leak"
    png = write_png(run, args.out / "report_example.png", title=title)
    html = write_html(run, args.out / "report_example.html", title=title)
    print(f"wrote {png} ({png.stat().st_size // 1024} KiB) and {html}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
