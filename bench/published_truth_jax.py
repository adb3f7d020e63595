"""Published JAX GPU memory measurements, rebuilt from their text and predicted by memfit.

Each file under ``tests/data/published_truth/`` with ``framework: jax`` names a public source,
the quantity it measured (``memory_stats()["peak_bytes_in_use"]``), its GPU and versions as
stated, and its runs. This script rebuilds each run's program as the source
ran it (its networks, optimizer, rollout and update, each jitted function as the source jitted
it) and predicts the measured quantity with :func:`memfit.estimate_jax` for the source's card:

* **after** (issue 30): XLA's GPU compiler for the card, deviceless, and the runtime's terms
  (``JaxEstimate.peak_bytes_in_use``: the buffers, the first call's autotuning, the BFC
  allocator's rounding);
* **before**: what memfit predicted before issue 30, XLA's CPU compile of the same functions
  (``executable_peak_bytes``; the runtime's terms did not exist).

A program of several jitted functions (a PPO iteration: rollout, advantages, update) called
in a Python loop is replayed through JAX's BFC allocator for the source's iterations
(:mod:`memfit.estimate.xla.program`): its initial arrays, then each iteration's calls (their
outputs, then their temporaries), the arrays the source drops, and the eager key splits, as
the source's code does them. ``one_step_bytes`` is what the largest function alone gives,
plus the arrays the loop holds beside it.

    python bench/published_truth_jax.py                 # every run; bench/out/published_truth_jax.*
    python bench/published_truth_jax.py --series benchback_rl_gymnax_ppo --run "CartPole-v1 64x64"
    python bench/published_truth_jax.py --no-before --store  # and writes jax_phase_buffers.json
    python bench/published_truth_jax.py --sensitivity  # no compile: assumptions changed

``tests/estimate/xla/test_published_truth_jax.py`` runs a few of the same comparisons in CI.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
# the runs, their programs and the comparison live with the tests' shared support code
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "shared"))

import _common
from published_runs_jax import (
    BUFFERS,
    WORKLOADS,
    MiB,
    Outcome,
    Program,
    _phase_figures,
    load_buffers,
    load_runs,
    outcomes,
    predict,
    replay,
)

#: What the other bench scripts (published_rerun_jax.py, xla_cublas_choice.py) read here.
__all__ = ["WORKLOADS", "_phase_figures", "load_runs", "main", "predict"]


def store_buffers(results: Sequence[Outcome], path: Path = BUFFERS) -> None:
    """Add the runs' phase buffers to :data:`BUFFERS` (runs not in ``results`` are kept)."""
    import jaxlib

    stored = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {"runs": {}}
    for outcome in results:
        if outcome.phase_buffers:
            stored["runs"][outcome.run.key] = outcome.phase_buffers
    stored["written"] = (
        f"{_common.utc_minute()}, jaxlib {jaxlib.__version__}: "
        "`python bench/published_truth_jax.py --no-before --store`"
    )
    stored["runs"] = dict(sorted(stored["runs"].items()))
    path.write_text(json.dumps(stored, indent=1) + "\n", encoding="utf-8")


def _loop_variants(
    program: Program,
) -> Iterator[tuple[str, dict[str, list[int]], list[Any], bool]]:
    """The source's loop, and the same loop with one assumption changed each: (name, the
    initial arrays, the loop, whether each call allocates its outputs in reverse order)."""
    from memfit.estimate.xla.program import Allocate, Rebind, Release

    loop = list(program.loop)
    yield "as rebuilt", program.initial, loop, False
    yield "outputs in reverse order", program.initial, loop, True
    eager = {"split", "key_new", "rollout_key", "update_key"}
    yield "no eager key arrays", program.initial, [
        e for e in loop
        if not isinstance(e, Allocate)
        and not (isinstance(e, Release) and e.name in eager)
        and not (isinstance(e, Rebind) and e.old == "key")
    ], False  # fmt: skip
    releases = [e for e in loop if isinstance(e, Release)]
    kept = [e for e in loop if not isinstance(e, Release)]
    yield "locals freed in reverse order", program.initial, kept + releases[::-1], False
    rebinds = [e for e in loop if isinstance(e, Rebind) and e.old != "key"]
    yield "locals freed before the rebinding", program.initial, [
        e for e in loop if e not in rebinds
    ] + rebinds, False  # fmt: skip


def _reversed_outputs(phases: dict[str, Any], loop: list[Any]) -> tuple[dict[str, Any], list[Any]]:
    """The phases allocating their outputs last leaf first, and the loop naming them so."""
    import dataclasses

    from memfit.estimate.xla.program import Call

    flipped = {
        name: dataclasses.replace(
            b, outputs=tuple(tuple(reversed(leaves)) for leaves in reversed(b.outputs))
        )
        for name, b in phases.items()
    }
    return flipped, [
        dataclasses.replace(e, outputs=tuple(reversed(e.outputs))) if isinstance(e, Call) else e
        for e in loop
    ]


def sensitivity() -> int:
    """Replay each stored run's loop (:data:`BUFFERS`, no compile) with each assumption
    changed, and print the error of each against the measured peak."""
    stored = load_buffers()
    lines = [
        f"Replay sensitivity, {_common.utc_minute()} "
        "(`python bench/published_truth_jax.py --sensitivity`)\n"
    ]
    header = None
    for run in load_runs():
        if run.key not in stored:
            continue
        program = WORKLOADS[run.workload](run.settings)
        cells = []
        names = []
        drift = ""
        for name, initial, loop, reverse in _loop_variants(program):
            phases = stored[run.key]
            if reverse:
                phases, loop = _reversed_outputs(phases, loop)
            replayed = replay(run, program, phases, initial, loop)
            if not drift:  # the loop as rebuilt: its peak after 2, 8 and 32 iterations
                drift = ", ".join(
                    f"{replayed.iteration_peaks[n - 1] / MiB:,.1f}"
                    for n in (2, 8, 32)
                    if n <= len(replayed.iteration_peaks)
                )
            names.append(name)
            cells.append(
                f"{(replayed.peak_bytes_in_use - run.measured_bytes) / run.measured_bytes:+.1%}"
            )
        if header is None:
            header = names
            lines.append("| run | " + " | ".join(names) + " | MiB after 2, 8, 32 iterations |")
            lines.append("|---|" + "---:|" * len(names) + "---|")
        lines.append(f"| {run.name} | " + " | ".join(cells) + f" | {drift} |")
        print(lines[-1], flush=True)
    _common.OUT.mkdir(parents=True, exist_ok=True)
    (_common.OUT / "published_truth_jax_sensitivity.md").write_text(
        "\n".join(lines) + "\n", encoding="utf-8"
    )
    return 0


def summary(results: Sequence[Outcome], *, before: bool = False) -> str:
    errors = [o.before_error if before else o.error for o in results]
    return _common.error_summary([e for e in errors if e is not None])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--series", help="only this source file (its stem)")
    parser.add_argument("--run", help="only this run (its name)")
    parser.add_argument("--no-before", action="store_true", help="skip the CPU compile")
    parser.add_argument(
        "--sensitivity",
        action="store_true",
        help="no compile: replay the stored runs' loops with each assumption changed",
    )
    parser.add_argument(
        "--store", action="store_true", help=f"write the phases' buffers to {BUFFERS.name}"
    )
    args = parser.parse_args(argv)
    if args.sensitivity:
        return sensitivity()
    runs = [
        r for r in load_runs() if args.series in (None, r.series) and args.run in (None, r.name)
    ]
    results = []
    for outcome in outcomes(runs, before=not args.no_before):
        results.append(outcome)
        print(outcome.row(), f"({outcome.seconds:.0f} s)", flush=True)
    header = (
        f"Published JAX truth, {_common.utc_minute()} (`python bench/published_truth_jax.py`)\n\n"
        "| source | run | measured MiB | before MiB | before err | after MiB | after err | "
        "peak in |\n|---|---|---:|---:|---:|---:|---:|---|\n"
    )
    after = summary(results)
    before = summary(results, before=True)
    markdown = header + "\n".join(o.row() for o in results)
    markdown += f"\n\nafter: {after}\n\nbefore: {before}\n"
    payload = {
        "runs": [
            {
                "series": o.run.series,
                "run": o.run.name,
                "quantity": o.run.quantity,
                "gpu": o.run.gpu,
                "compiled_for": o.compiled_for,
                "measured_bytes": o.run.measured_bytes,
                "predicted_bytes": o.predicted_bytes,
                "before_bytes": o.before_bytes,
                "error": o.error,
                "before_error": o.before_error,
                "peak_phase": o.peak_phase,
                "one_step_bytes": o.one_step_bytes,
                "phase_buffers": o.phase_buffers,
                "terms": [list(t) for t in o.terms],
                "seconds": round(o.seconds, 1),
            }
            for o in results
        ],
        "after": after,
        "before": before,
    }
    _common.write_results("published_truth_jax", payload, markdown)
    if args.store:
        store_buffers(results)
    print("after:", after)
    print("before:", before)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
