"""Every figure the torch tracer gives for the published runs, as a fingerprint: for checking
that a change meant to make the tracer faster leaves each traced figure byte-identical.

Each run of ``tests/data/published_truth/*.yaml`` (the torch sources: the BERT-large and ViT-L
runs, the kernel and Liger series, the validation part) is rebuilt as
``tests/shared/published_runs.py`` rebuilds it and traced with
:func:`memfit.estimate_torch` as ``published_runs.predict`` traces it. Every field of the
estimate (its points, fits, deviations, kernels, context, the sequence model) is written out
with the SHA-256 of the whole, and the CPU seconds (user + system, this process) the trace
took.

    python bench/trace_fingerprint.py --out before.json     # at the old commit
    python bench/trace_fingerprint.py --out after.json      # at the new one
    python bench/trace_fingerprint.py --compare before.json after.json

``--only TEXT`` traces the runs whose ``series/name`` contains TEXT. Run each side with its own
``PYTHONPATH=<checkout>/src`` (the script traces whichever memfit it imports).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import resource
import sys
from pathlib import Path
from typing import Any

# the runs and their workloads live with the tests' shared support code
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "shared"))

import published_runs as published

__all__ = ["compare", "fingerprint", "main"]


def _plain(value: Any) -> Any:
    """``value`` as JSON: dataclasses and objects field by field, anything else by ``repr``."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if hasattr(value, "__dict__") and not isinstance(value, type):
        return {k: _plain(v) for k, v in vars(value).items()}
    return repr(value)


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def fingerprint(only: str | None = None) -> dict[str, dict[str, Any]]:
    """``series/name`` -> ``{"sha256", "cpu_s", "estimate"}`` for each published torch run,
    traced as the published truth's comparison traces it (``published_runs.trace``)."""
    out: dict[str, dict[str, Any]] = {}
    for run in published.load_runs():
        key = f"{run.series}/{run.name}"
        if only and only not in key:
            continue
        started = _cpu()
        est = published.trace(run)
        seconds = _cpu() - started
        plain = _plain(est)
        blob = json.dumps(plain, sort_keys=True)
        out[key] = {
            "sha256": hashlib.sha256(blob.encode()).hexdigest(),
            "cpu_s": round(seconds, 2),
            "estimate": plain,
        }
        print(f"{key}: {out[key]['sha256'][:16]} {seconds:.1f} s CPU", flush=True)
    return out


def compare(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """The runs whose figures differ (or that one side lacks); empty when all are identical."""
    differ = [k for k in sorted(set(before) | set(after)) if k not in before or k not in after]
    differ += [
        k for k in sorted(set(before) & set(after)) if before[k]["sha256"] != after[k]["sha256"]
    ]
    return differ


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the fingerprint here (JSON)")
    parser.add_argument("--only", help="only the runs whose series/name contains this")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args(argv)
    if args.compare:
        before, after = (json.loads(p.read_text()) for p in args.compare)
        differ = compare(before, after)
        cpu = [sum(v["cpu_s"] for k, v in side.items() if k in after) for side in (before, after)]
        print(
            f"{len(set(before) & set(after))} runs in both; "
            f"{'all identical' if not differ else f'{len(differ)} differ: {differ}'}; "
            f"trace CPU {cpu[0]:.1f} s before, {cpu[1]:.1f} s after"
        )
        return 1 if differ else 0
    found = fingerprint(args.only)
    if args.out:
        args.out.write_text(json.dumps(found, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
