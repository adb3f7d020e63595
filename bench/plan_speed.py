"""How long the planner takes: the whole tier table (TIER_GPUS) for each bundled workload.

For every bundled workload and variant, ``memfit.planning.plan_tiers`` plans for the GPUs
of ``TIER_GPUS`` (one shared evaluation cache, as ``memfit plan --all-gpus`` does). Each
table is timed ``--repeat`` times from a cold start (the workload is reloaded, so nothing is
cached between runs); the table reports the fastest and the median and the size of the
knob space. A single-GPU plan (``memfit plan W --gpu "RTX 4070"``) is timed the same way.

Goal (issue 3): the whole tier table for 12 GPUs in under 2 s on a 2-core CPU machine.

Writes ``bench/out/plan_speed.json`` and ``bench/out/plan_speed.md`` and prints the table.
Run: ``python bench/plan_speed.py`` (a few seconds).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from memfit.core.workload import bundled_names, load_workload
from memfit.errors import InfeasiblePlan
from memfit.planning import TIER_GPUS, plan, plan_tiers

OUT = Path(__file__).resolve().parent / "out"
GOAL_SECONDS = 2.0


def _space_size(name: str) -> int:
    w = load_workload(name)
    return math.prod(len(k.values()) for k in w.knobs.values())


def _time(fn: Any, repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def run(repeat: int) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for name in bundled_names():
        tier = _time(lambda n=name: plan_tiers(load_workload(n)), repeat)
        results = plan_tiers(load_workload(name))
        single = _time(lambda n=name: plan(load_workload(n), "RTX 4070"), repeat)
        rows.append(
            {
                "workload": name,
                "configurations": _space_size(name),
                "gpus": len(TIER_GPUS),
                "fitting_gpus": sum(1 for r in results if not isinstance(r, InfeasiblePlan)),
                "tier_min_s": min(tier),
                "tier_median_s": statistics.median(tier),
                "single_min_s": min(single),
                "single_median_s": statistics.median(single),
            }
        )
    worst = max(float(r["tier_median_s"]) for r in rows)
    return {
        "benchmark": "plan_speed",
        "date": dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat(),
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "processor": platform.processor() or platform.machine(),
        },
        "command": "python bench/plan_speed.py --repeat " + str(repeat),
        "repeat": repeat,
        "goal_s": GOAL_SECONDS,
        "worst_tier_median_s": worst,
        "meets_goal": worst < GOAL_SECONDS,
        "rows": rows,
    }


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"Planner speed, {result['date']}, {result['machine']['platform']}, "
        f"{result['machine']['cpus']} CPUs, Python {result['machine']['python']}; "
        f"`{result['command']}`.",
        "",
        f"| workload | knob space | GPUs fitting | tier table ({len(TIER_GPUS)} GPUs) min / median "
        "| one GPU min / median |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['workload']} | {r['configurations']} | "
            f"{r['fitting_gpus']}/{r['gpus']} | {r['tier_min_s'] * 1000:.0f} ms / "
            f"{r['tier_median_s'] * 1000:.0f} ms | {r['single_min_s'] * 1000:.0f} ms / "
            f"{r['single_median_s'] * 1000:.0f} ms |"
        )
    verdict = "meets" if result["meets_goal"] else "misses"
    lines += [
        "",
        f"Slowest tier table (median): {result['worst_tier_median_s']:.2f} s; "
        f"goal < {result['goal_s']:.0f} s: {verdict} it.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per workload")
    args = parser.parse_args(argv)
    result = run(args.repeat)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "plan_speed.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    text = markdown(result)
    (OUT / "plan_speed.md").write_text(text, encoding="utf-8")
    sys.stdout.write(text)
    return 0 if result["meets_goal"] else 1


if __name__ == "__main__":
    sys.exit(main())
