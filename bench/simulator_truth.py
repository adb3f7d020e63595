"""Published device-memory readings of GPU simulators, rebuilt as workloads and planned.

Each file under ``tests/data/published_truth/simulators/`` names a public source (Isaac Lab
benchmarks and issues, ManiSkill3's and MuJoCo Playground's benchmark data, Genesis issues),
what it measured (the device's used memory: ``total - free`` or nvidia-smi), the card and
versions as stated (and how the rebuild takes what is not), the workload as the source ran
it, and its runs: each run's settings (``num_envs``, cameras, scene), the figure read, and
its role: ``calibration`` (the simulator figures are fitted on these: ``simulator_fit.py``)
or ``held_out`` (planned against their reading; never fitted on).

    python bench/simulator_truth.py            # every run; writes bench/out/simulator_truth.*

Each run is planned with :func:`memfit.plan` on the source's card with every knob pinned
and no margin, so ``predicted_bytes`` (the CUDA context included) is compared with the
device's used memory. ``--model before`` plans with the simulator terms memfit had before
issue 33 (3.5 GiB at start, 1,800 B per camera pixel, nothing per env) for the table of
``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
# the readings, their plans and errors live with the tests' shared support code
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "shared"))

import _common
from simulator_readings import (
    BEFORE_BASE,
    BEFORE_PIXEL,
    DATA,
    GOAL_MEAN,
    GOAL_WORST,
    Outcome,
    Run,
    gpu_of,
    load_runs,
    plan_bytes,
    predict,
    workload_of,
)

#: What simulator_fit.py and simulator_lab3.py read here.
__all__ = [
    "BEFORE_BASE",
    "BEFORE_PIXEL",
    "DATA",
    "GOAL_MEAN",
    "GOAL_WORST",
    "Outcome",
    "Run",
    "gpu_of",
    "load_runs",
    "main",
    "plan_bytes",
    "predict",
    "workload_of",
]


def summary(errors: list[float]) -> dict[str, float]:
    """Mean and worst absolute error, and the signed extremes."""
    if not errors:
        return {"n": 0, "mean_abs": math.nan, "worst_abs": math.nan}
    return {
        "n": len(errors),
        "mean_abs": statistics.fmean(abs(e) for e in errors),
        "worst_abs": max(abs(e) for e in errors),
        "most_under": min(errors),
        "most_over": max(errors),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("after", "before", "both"), default="both")
    args = parser.parse_args(argv)
    runs = load_runs()
    models = ("before", "after") if args.model == "both" else (args.model,)
    results: list[dict[str, Any]] = []
    for run in runs:
        row: dict[str, Any] = {"run": run.key, "role": run.role, "measured": run.measured_bytes}
        for model in models:
            out = predict(run, model)
            row[f"{model}_predicted"] = out.predicted_bytes
            row[f"{model}_error"] = out.error
        results.append(row)
    lines = [f"Simulator truth, {_common.utc_minute()} (`python bench/simulator_truth.py`)\n"]
    lines.append("| readings | n | " + " | ".join(f"{m} mean, worst" for m in models) + " |")
    lines.append("|---|---|" + "---|" * len(models))
    totals: dict[str, Any] = {}
    for label, pick in (
        ("held out", lambda r: r["role"] == "held_out"),
        ("calibration", lambda r: r["role"] == "calibration"),
    ):
        chosen = [r for r in results if pick(r)]
        cells = []
        for model in models:
            s = summary([r[f"{model}_error"] for r in chosen])
            totals[f"{label}/{model}"] = s
            cells.append(f"{s['mean_abs']:.1%}, {s['worst_abs']:.1%}")
        lines.append(f"| {label} | {len(chosen)} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        "| source (held out) | n | " + " | ".join(f"{m} mean, worst" for m in models) + " |"
    )
    lines.append("|---|---|" + "---|" * len(models))
    for series in dict.fromkeys(r["run"].split("/")[0] for r in results):
        chosen = [r for r in results if r["role"] == "held_out" and r["run"].startswith(series)]
        if not chosen:
            continue
        cells = []
        for model in models:
            s = summary([r[f"{model}_error"] for r in chosen])
            cells.append(f"{s['mean_abs']:.1%}, {s['most_under']:+.1%} .. {s['most_over']:+.1%}")
        lines.append(f"| {series} | {len(chosen)} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("| reading | role | measured GB | " + " | ".join(models) + " |")
    lines.append("|---|---|---|" + "---|" * len(models))
    for r in results:
        cells = [f"{r[f'{m}_error']:+.1%}" for m in models]
        lines.append(
            f"| {r['run']} | {r['role']} | {r['measured'] / 1e9:.2f} | " + " | ".join(cells) + " |"
        )
    markdown = "\n".join(lines) + "\n"
    _common.write_results("simulator_truth", {"runs": results, "summary": totals}, markdown)
    print("\n".join(lines[:6]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
