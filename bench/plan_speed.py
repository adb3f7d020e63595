"""How long the planner takes: the whole tier table (TIER_GPUS) for each bundled workload.

For every bundled workload and variant, ``memfit.planning.plan_tiers`` plans for the GPUs
of ``TIER_GPUS`` (one shared evaluation cache, as ``memfit plan --all-gpus`` does). Each
table is timed ``--repeat`` times from a cold start (the workload is reloaded, so nothing is
cached between runs); the table reports the fastest and the median and the size of the
knob space. A single-GPU plan (``memfit plan W --gpu "RTX 4070"``) is timed the same way.

Goal (issue 3): the whole tier table for 12 GPUs in under 2 s on a 2-core CPU machine.

**Scale (issue 23).** The bundled Brax PPO workload (2,016 configurations) and the same
workload widened: ``num_envs`` 256..65536 in steps of 1280 (116,480 configurations) and in
steps of 128, ``unroll_length`` 1..40 (1,144,640 configurations), each planned for one GPU
(``--gpu``, default RTX 4070) and for the whole tier table (``--all-gpus``). Every run is a
fresh process (so its peak RSS is its own), the cases interleaved, ``--scale-repeat`` times;
the table gives the median CPU time of the planning call and the largest peak RSS of the
process. ``--src`` runs the children on another source tree (the code before a change).
Goals (issue 23): the 1.15-million plan within 3x of the 2,016 one, under 250 MiB.

Writes ``bench/out/plan_speed.json`` and ``bench/out/plan_speed.md`` and prints the table.
Run: ``python bench/plan_speed.py`` (under a minute); ``--no-bundled`` for the scale table
alone; ``--src /path/to/old/src --scale-repeat 1`` for the figures before a change.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from memfit.core.workload import Workload, bundled_names, load_workload
from memfit.errors import InfeasiblePlan
from memfit.planning import TIER_GPUS, plan, plan_tiers

OUT = Path(__file__).resolve().parent / "out"
GOAL_SECONDS = 2.0

#: Scale cases: name -> (num_envs step, unroll_length (min, max) or None for the bundled).
SCALE_CASES: dict[str, tuple[int, tuple[int, int]] | None] = {
    "bundled": None,
    "widened_1e5": (1280, (1, 40)),
    "widened_1.15M": (128, (1, 40)),
}
GOAL_RATIO = 3.0
GOAL_RSS_MIB = 250.0


def scale_workload(case: str) -> Workload:
    """The Brax PPO workload of a scale case (bundled, or widened)."""
    w = load_workload("brax_humanoid_ppo")
    widen = SCALE_CASES[case]
    if widen is None:
        return w
    step, (low, high) = widen
    data = w.model_dump(exclude_none=True)
    data["knobs"]["num_envs"] = {
        "min": 256, "max": 65536, "step": step, "default": 2048, "priority": 3,
    }  # fmt: skip
    data["knobs"]["unroll_length"] = {"min": low, "max": high, "default": 20, "priority": 2}
    return Workload.model_validate(data)


def child(case: str, mode: str, gpu: str) -> dict[str, Any]:
    """One planning call in this (fresh) process: CPU time, peak RSS, the answer."""
    w = scale_workload(case)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    cpu, wall = time.process_time(), time.perf_counter()
    if mode == "one":
        results: list[Any] = [plan(w, gpu)]
    else:
        results = plan_tiers(w)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    answers = [
        None if isinstance(r, InfeasiblePlan) else {
            "knobs": r.knobs, "alternatives": [a["knobs"] for a in r.alternatives],
            "binding": r.binding,
        }
        for r in results
    ]  # fmt: skip
    return {
        "case": case,
        "mode": mode,
        "configurations": math.prod(len(k.values()) for k in w.knobs.values()),
        "cpu_s": cpu,
        "wall_s": wall,
        "rss_before_mib": rss_before,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "answers": answers,
    }


def run_scale(repeat: int, gpu: str, src: str | None) -> dict[str, Any]:
    """Every scale case in fresh processes, interleaved, ``repeat`` times."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = src
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    keys = [(c, m) for c in SCALE_CASES for m in ("one", "all")]
    for i in range(repeat):
        for case, mode in keys[i % len(keys) :] + keys[: i % len(keys)]:
            proc = subprocess.run(
                [sys.executable, __file__, "--child", case, mode, "--gpu", gpu],
                capture_output=True, text=True, env=env, check=True,
            )  # fmt: skip
            runs.setdefault((case, mode), []).append(json.loads(proc.stdout))
    rows = []
    for (case, mode), found in runs.items():
        rows.append(
            {
                "case": case,
                "mode": mode,
                "configurations": found[0]["configurations"],
                "cpu_median_s": statistics.median(r["cpu_s"] for r in found),
                "cpu_min_s": min(r["cpu_s"] for r in found),
                "peak_rss_mib": max(r["peak_rss_mib"] for r in found),
                "rss_before_mib": max(r["rss_before_mib"] for r in found),
                "runs": len(found),
                "answers": found[0]["answers"],
            }
        )
    by = {(r["case"], r["mode"]): r for r in rows}
    big, small = by[("widened_1.15M", "one")], by[("bundled", "one")]
    ratio = big["cpu_median_s"] / small["cpu_median_s"]
    return {
        "gpu": gpu,
        "src": src or "this tree",
        "repeat": repeat,
        "rows": rows,
        "ratio_1.15M_to_bundled_one_gpu": ratio,
        "meets_ratio_goal": ratio <= GOAL_RATIO,
        "meets_rss_goal": big["peak_rss_mib"] < GOAL_RSS_MIB,
    }


def scale_markdown(scale: dict[str, Any]) -> str:
    lines = [
        f"Scale (Brax PPO, one GPU = {scale['gpu']}, tier table = {len(TIER_GPUS)} GPUs; "
        f"code: {scale['src']}; median of {scale['repeat']} fresh processes):",
        "",
        "| case | configurations | GPUs | CPU median | CPU min | peak RSS (after imports) |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for r in scale["rows"]:
        gpus = "one" if r["mode"] == "one" else "all"
        lines.append(
            f"| {r['case']} | {r['configurations']:,} | {gpus} | "
            f"{r['cpu_median_s'] * 1000:.0f} ms | {r['cpu_min_s'] * 1000:.0f} ms | "
            f"{r['peak_rss_mib']:.0f} MiB ({r['rss_before_mib']:.0f}) |"
        )
    lines += [
        "",
        f"1.15M / 2,016 configurations, one GPU: {scale['ratio_1.15M_to_bundled_one_gpu']:.2f}x "
        f"(goal <= {GOAL_RATIO:.0f}x: {'met' if scale['meets_ratio_goal'] else 'missed'}); "
        f"peak RSS goal < {GOAL_RSS_MIB:.0f} MiB: "
        f"{'met' if scale['meets_rss_goal'] else 'missed'}.",
    ]
    return "\n".join(lines) + "\n"


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
    parser.add_argument("--scale-repeat", type=int, default=3, help="fresh runs per scale case")
    parser.add_argument("--gpu", default="RTX 4070", help="the one GPU of the scale cases")
    parser.add_argument("--src", default=None, help="PYTHONPATH for the scale children")
    parser.add_argument("--no-bundled", action="store_true", help="the scale table only")
    parser.add_argument("--no-scale", action="store_true", help="the bundled table only")
    parser.add_argument("--child", nargs=2, metavar=("CASE", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        sys.stdout.write(json.dumps(child(args.child[0], args.child[1], args.gpu)) + "\n")
        return 0
    result: dict[str, Any] = (
        {"benchmark": "plan_speed", "meets_goal": True} if args.no_bundled else run(args.repeat)
    )
    text = "" if args.no_bundled else markdown(result)
    if not args.no_scale:
        result["scale"] = run_scale(args.scale_repeat, args.gpu, args.src)
        result["scale_command"] = "python bench/plan_speed.py " + " ".join(
            sys.argv[1:] if argv is None else argv
        )
        text += "\n" + scale_markdown(result["scale"])
    OUT.mkdir(parents=True, exist_ok=True)
    stem = "plan_speed" if args.src is None else "plan_speed_baseline"
    (OUT / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    (OUT / f"{stem}.md").write_text(text, encoding="utf-8")
    sys.stdout.write(text)
    return 0 if result["meets_goal"] else 1


if __name__ == "__main__":
    sys.exit(main())
