"""Isaac Lab 3's physics figures from published readings, and the held-out readings planned.

``tests/data/published_truth/simulators/isaaclab3/`` holds readings of Isaac Lab 3.0 (Isaac
Sim 6.0) with each physics backend, in the format of ``simulator_truth.py``. The figures of
``memfit.core.simulator_figures.LAB3_PHYSICS`` are fitted on the ``calibration`` runs only:
per backend, the residual (the reading less everything memfit models besides the simulator)
at the smallest and largest number of environments gives the per-env slope and the base.
The ``held_out`` runs are then planned with those figures against their reading.

    python bench/simulator_lab3.py     # prints the figures and the held-out table;
                                       # writes bench/out/simulator_lab3.{json,md}
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
# the fit lives with the tests' shared support code
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "shared"))

import _common
import simulator_truth as truth
from simulator_lab3_fit import fit, load_runs


def main(argv: list[str] | None = None) -> int:
    del argv
    figures = fit()
    for physics, f in figures.items():
        print(f"{physics}: base {f['base_bytes']:,.0f} B, per env {f['per_env_bytes']:,.0f} B")
    rows: list[dict[str, Any]] = []
    for run in load_runs():
        out = truth.predict(run)
        rows.append(
            {
                "run": run.key,
                "role": run.role,
                "measured": run.measured_bytes,
                "predicted": out.predicted_bytes,
                "error": out.error,
            }
        )
    lines = [
        f"Isaac Lab 3 simulator readings, {_common.utc_minute()} "
        "(`python bench/simulator_lab3.py`)\n",
        "| reading | role | measured MiB | predicted MiB | error |",
        "|---|---|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['run']} | {r['role']} | {r['measured'] / 2**20:,.0f} | "
            f"{r['predicted'] / 2**20:,.0f} | {r['error']:+.1%} |"
        )
    held = [r for r in rows if r["role"] == "held_out"]
    summary = truth.summary([r["error"] for r in held])
    lines.append("")
    lines.append(
        f"Held out ({summary['n']} readings, nothing fitted on them): mean |error| "
        f"{summary['mean_abs']:.1%}, most under {summary['most_under']:+.1%}, most over "
        f"{summary['most_over']:+.1%}."
    )
    markdown = "\n".join(lines) + "\n"
    _common.write_results(
        "simulator_lab3", {"figures": figures, "runs": rows, "summary": summary}, markdown
    )
    print(markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
