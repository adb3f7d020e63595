"""Held-out study of ``memfit.integrations.optuna.suggest``: no suggestion breaks a rule or the
budget, and the search does not collapse (issue 24).

For every bundled workload and variant and each GPU of ``--gpus``, an Optuna study (random
and multivariate TPE samplers) runs ``--trials`` trials whose objective is only
``suggest``. Every configuration a trial got is then checked by the paths the suggestion did
not use: ``memfit.check`` (the workload's rules and ranges) and ``memfit.plan`` with every
knob pinned (the planner's single-configuration path), which must say it fits with the
predicted peak within the budget. The table also says how many distinct configurations the
trials reached, out of the feasible ones, and what share of the declared knob space fits
(the trials a sampler over the declared ranges would waste).

Writes ``bench/out/sweep_heldout.json`` and ``.md``. Run: ``python bench/sweep_heldout.py``
(about two minutes on a 2-core machine; needs ``memfit[optuna]``).
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
import time
from pathlib import Path
from typing import Any

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common

import memfit
from memfit.core.workload import bundled_names, load_workload
from memfit.integrations import optuna as mo
from memfit.planning import feasible

DEFAULT_GPUS = ("GTX 1650", "RTX 3060", "RTX 4070", "RTX 4090", "A100 80GB")
#: Host RAM for the host-placed replay buffers, fixed: this machine's *available* RAM moves
#: with the other processes, and a buffer at the edge would fit at one moment and not the next
HOST_RAM = 16 * 2**30


def _study(name: str, gpu: str, sampler: str, trials: int, seed: int) -> list[dict[str, Any]]:
    samplers = {
        "random": optuna.samplers.RandomSampler(seed=seed),
        "tpe": optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=8),
    }
    study = optuna.create_study(direction="maximize", sampler=samplers[sampler])

    def objective(trial: optuna.Trial) -> float:
        mo.suggest(trial, name, gpu=gpu, host_memory_bytes=HOST_RAM)
        # maximise the predicted peak: the sampler is pushed to the edge of the budget
        return float(trial.user_attrs[mo.ATTR]["predicted_bytes"])

    study.optimize(objective, n_trials=trials)
    return [mo.knobs(t) or {} for t in study.trials]


def _violations(name: str, gpu: str, knobs: dict[str, Any]) -> list[str]:
    pins = {k: v for k, v in knobs.items() if isinstance(v, int)}
    out = [f"rule: {v.message}" for v in memfit.check(name, overrides=pins)]
    pinned = memfit.plan(name, gpu=gpu, overrides=pins, host_memory_bytes=HOST_RAM)
    if not pinned.fits or pinned.predicted_bytes > pinned.budget_bytes:
        out.append(f"budget: predicted {pinned.predicted_bytes} > budget {pinned.budget_bytes}")
    return out


def run(gpus: tuple[str, ...], trials: int, seed: int) -> dict[str, Any]:
    rows = []
    for name in bundled_names():
        declared = math.prod(len(k.values()) for k in load_workload(name).knobs.values())
        for gpu in gpus:
            try:
                space = feasible(name, gpu=gpu, host_memory_bytes=HOST_RAM)
            except memfit.InfeasiblePlan:
                rows.append({"workload": name, "gpu": gpu, "feasible": 0, "declared": declared})
                continue
            for sampler in ("random", "tpe"):
                start = time.perf_counter()
                chosen = _study(name, gpu, sampler, trials, seed)
                seconds = time.perf_counter() - start
                distinct = {tuple(sorted(c.items())) for c in chosen}
                problems = [p for c in distinct for p in _violations(name, gpu, dict(c))]
                rows.append(
                    {
                        "workload": name,
                        "gpu": gpu,
                        "sampler": sampler,
                        "trials": len(chosen),
                        "distinct": len(distinct),
                        "feasible": len(space),
                        "declared": declared,
                        "violations": problems,
                        "seconds": round(seconds, 2),
                    }
                )
    return {
        "when": _common.utc_minute(),
        "machine": f"{platform.node()} ({platform.processor() or platform.machine()})",
        "optuna": optuna.__version__,
        "memfit": memfit.__version__,
        "trials_per_study": trials,
        "seed": seed,
        "rows": rows,
    }


def markdown(data: dict[str, Any]) -> str:
    rows = data["rows"]
    studies = [r for r in rows if "sampler" in r]
    total = sum(r["trials"] for r in studies)
    bad = sum(len(r["violations"]) for r in studies)
    lines = [
        f"Held-out study, {data['when']}, optuna {data['optuna']}: {len(studies)} studies, "
        f"{total} trials, {bad} suggestions that break a rule or the budget "
        f"(host RAM for host-placed buffers: {HOST_RAM // 2**30} GiB).",
        "",
        "| workload | GPU | sampler | distinct / feasible | feasible / declared | violations |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "sampler" not in r:
            lines.append(
                f"| {r['workload']} | {r['gpu']} | - | nothing fits | 0 / {r['declared']} | - |"
            )
            continue
        share = f"{r['feasible']} / {r['declared']} ({100 * r['feasible'] / r['declared']:.0f}%)"
        lines.append(
            f"| {r['workload']} | {r['gpu']} | {r['sampler']} | {r['distinct']} / "
            f"{r['feasible']} | {share} | {len(r['violations'])} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", default=",".join(DEFAULT_GPUS), help="comma-separated GPUs")
    ap.add_argument("--trials", type=int, default=30, help="trials per study")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    data = run(tuple(g.strip() for g in args.gpus.split(",") if g.strip()), args.trials, args.seed)
    text = markdown(data)
    _common.write_results("sweep_heldout", data, text)
    print(text)
    bad = sum(len(r.get("violations", [])) for r in data["rows"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
