"""Published real-GPU measurements, rebuilt from their text and traced by memfit.

Each file under ``tests/data/published_truth/`` names a public source, the quantity it measured
(NVML ``used``, ``max_memory_reserved``), its GPU and runtime as stated, and its runs; this
script rebuilds each run's workload as the source ran it (the model from its config, the
optimizer and precision, the training loop's habits of that era) and traces it with
:func:`memfit.estimate_torch` for the source's GPU and runtime. ``tests/estimate/
test_published_truth*.py`` run the same comparison in CI.

    python bench/published_truth.py            # every run; writes bench/out/published_truth.*

No weights are loaded: memory does not depend on their values, and the models are built from
their configurations (``from_pretrained`` only adds the download).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
# the runs, their workloads and the comparison live with the tests' shared support code
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "shared"))

import _common
from published_runs import WORKLOADS, load_runs, outcomes, predict

__all__ = ["WORKLOADS", "load_runs", "main", "outcomes", "predict"]


def _summary(results: list[dict[str, Any]]) -> str:
    errors = [r["error"] for r in results]
    if not errors:
        return "no runs"
    return (
        f"mean |err| {sum(abs(e) for e in errors) / len(errors):.1%}, worst "
        f"{max(abs(e) for e in errors):.1%}, most under {min(errors):+.1%} over "
        f"{len(errors)} runs"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--series", help="only this source file (its stem)")
    args = parser.parse_args(argv)
    runs = [r for r in load_runs() if args.series in (None, r.series)]
    rows = []
    results = []
    for outcome in outcomes(runs):
        rows.append(outcome.row())
        results.append(
            {
                "series": outcome.run.series,
                "run": outcome.run.name,
                "quantity": outcome.run.quantity,
                "measured_bytes": outcome.run.measured_bytes,
                "predicted_bytes": outcome.predicted_bytes,
                "error": outcome.error,
                "trace_seconds": round(outcome.seconds, 2),
            }
        )
        print(rows[-1], f"({outcome.seconds:.1f} s)", flush=True)
    summary = _summary(results)
    for part in ("calibration", "validation"):
        mine = [r for r, o in zip(results, runs, strict=True) if o.part == part]
        if mine and len(mine) < len(results):
            summary += f"; {part}: {_summary(mine)}"
    header = (
        f"Published truth, {_common.utc_minute()} (`python bench/published_truth.py`)\n\n"
        "| source | run | quantity | measured MiB | predicted MiB | err |\n"
        "|---|---|---|---:|---:|---:|\n"
    )
    markdown = header + "\n".join(rows) + f"\n\n{summary}\n"
    _common.write_results("published_truth", {"runs": results, "summary": summary}, markdown)
    print(summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
