"""How pytest-xdist's processes share CI's test files: each file's seconds from JUnit XML
reports, and the time the two test processes of the 2-core VM take under each order.

``--dist loadfile`` sends each file, whole, to one process; a process takes the next file when
two or fewer of its tests are left to run (xdist 3.8, ``LoadScopeScheduling._reschedule``).
By default xdist hands files out most tests first (``--loadscope-reorder``), which puts the
files of a few long tests (the BERT-large runs, the examples) last; with
``--no-loadscope-reorder`` it follows the collection's order, which tests/conftest.py starts
with ``LONGEST_FIRST``. This script replays that rule on the reports' test times.

    pytest -q --junitxml quick.xml; pytest -q -m "slow or examples" --junitxml slow.xml
    python bench/ci_schedule.py quick.xml slow.xml [--scale 1.0] [--workers 2]

``--scale`` divides the reports' times (a report taken beside other jobs runs slower).
"""

from __future__ import annotations

import argparse
import ast
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

__all__ = ["file_times", "longest_first", "main", "makespan"]


def file_times(report: Path, scale: float = 1.0) -> dict[str, list[float]]:
    """Each test file's test times (seconds), in the report's order."""
    files: dict[str, list[float]] = {}
    for case in ET.parse(report).iter("testcase"):
        path = (case.get("classname") or "").replace(".", "/") + ".py"
        files.setdefault(path, []).append(float(case.get("time") or 0.0) / scale)
    return files


def longest_first() -> tuple[str, ...]:
    """``LONGEST_FIRST`` as tests/conftest.py has it (read, not imported)."""
    tree = ast.parse((ROOT / "tests" / "conftest.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "LONGEST_FIRST" for t in node.targets
        ):
            return tuple(ast.literal_eval(node.value))
    raise SystemExit("tests/conftest.py has no LONGEST_FIRST")


def makespan(order: list[str], files: dict[str, list[float]], workers: int) -> list[float]:
    """Each process's busy seconds when the files are handed out in ``order``."""
    queue = list(order)
    clock = [0.0] * workers
    pending: list[list[float]] = [[] for _ in range(workers)]

    def give(n: int) -> None:
        if queue:
            pending[n].extend(files[queue.pop(0)])

    for n in range(workers):
        give(n)
    for n in range(workers):
        if len(pending[n]) <= 2:
            give(n)
    while any(pending):
        n = min((i for i in range(workers) if pending[i]), key=lambda i: clock[i])
        clock[n] += pending[n].pop(0)
        if len(pending[n]) <= 2:
            give(n)
    return clock


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", type=Path, help="JUnit XML, one per command")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    first = longest_first()
    rank = {path: i for i, path in enumerate(first)}
    for report in args.reports:
        files = file_times(report, args.scale)
        collected = sorted(files)
        by_count = sorted(collected, key=lambda f: -len(files[f]))
        listed = sorted(collected, key=lambda f: rank.get(f, len(rank)))
        total = sum(sum(t) for t in files.values())
        print(f"{report}: {total:,.0f} s of tests in {len(files)} files, {args.workers} processes")
        print(f"  all busy to the end: {total / args.workers:,.0f} s")
        orders = (("xdist's order (most tests first)", by_count), ("LONGEST_FIRST", listed))
        for name, order in orders:
            busy = makespan(order, files, args.workers)
            each = ", ".join(f"{b:,.0f}" for b in busy)
            print(f"  {name}: {max(busy):,.0f} s (processes {each})")
        heavy = sorted(files, key=lambda f: -sum(files[f]))[:12]
        print("  longest files: " + ", ".join(f"{f} {sum(files[f]):,.0f} s" for f in heavy))
    return 0


if __name__ == "__main__":
    sys.exit(main())
