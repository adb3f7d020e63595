"""Cold start of the ``memfit`` command: ``memfit --help`` and every command's ``--help``,
against importing Typer and Rich alone.

Each row is a fresh interpreter run as the console script runs it (``main(argv)``), its CPU
time (user + system, from the child's rusage) and wall time taken; the rows are run
round-robin (interleaved, so a busy moment of a shared machine spreads over all of them),
``--repeat`` times, and the table gives medians. The baselines are an empty interpreter,
``import typer, rich`` and ``import typer, rich.console`` (what printing anything with Rich
needs). Goal (issue 23): ``memfit --help`` within 1.5x of importing Typer and Rich alone.

Writes ``bench/out/cli_start.json`` and ``bench/out/cli_start.md`` and prints the table.
Run: ``python bench/cli_start.py`` (about a minute); ``--src PATH`` runs another source tree
(the code before a change) for comparison.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import utc_minute, write_results  # noqa: E402

from memfit.cli.main import COMMANDS  # noqa: E402

GOAL_RATIO = 1.5
MAIN = "import sys; from memfit.cli.main import main; sys.exit(main(sys.argv[1:]))"


def rows_to_run() -> dict[str, list[str]]:
    """Row label -> the interpreter's arguments."""
    rows: dict[str, list[str]] = {
        "python (empty)": ["-c", "pass"],
        "import typer, rich": ["-c", "import typer, rich"],
        "import typer, rich.console": ["-c", "import typer, rich.console"],
        "memfit --help": ["-c", MAIN, "--help"],
        "memfit --version": ["-c", MAIN, "--version"],
    }
    for name in COMMANDS:
        rows[f"memfit {name} --help"] = ["-c", MAIN, name, "--help"]
    return rows


def once(args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """CPU seconds (user + system) and wall seconds of one fresh interpreter."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        check=True,
    )  # fmt: skip
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall


def run(repeat: int, src: str | None) -> dict[str, Any]:
    env = {**os.environ, "COLUMNS": "100"}
    if src is not None:
        env["PYTHONPATH"] = src
    rows = rows_to_run()
    cpu: dict[str, list[float]] = {k: [] for k in rows}
    wall: dict[str, list[float]] = {k: [] for k in rows}
    labels = list(rows)
    for i in range(repeat):
        for label in labels[i % len(labels) :] + labels[: i % len(labels)]:
            c, w = once(rows[label], env)
            cpu[label].append(c)
            wall[label].append(w)
    table = [
        {
            "row": label,
            "cpu_median_s": statistics.median(cpu[label]),
            "wall_median_s": statistics.median(wall[label]),
            "cpu_min_s": min(cpu[label]),
        }
        for label in labels
    ]
    by = {r["row"]: r for r in table}
    helped = by["memfit --help"]["cpu_median_s"]
    return {
        "benchmark": "cli_start",
        "date": utc_minute(),
        "machine": f"{platform.platform()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}",
        "command": "python bench/cli_start.py " + " ".join(sys.argv[1:]),
        "code": src or "this tree",
        "repeat": repeat,
        "rows": table,
        "ratio_to_typer_rich": helped / by["import typer, rich"]["cpu_median_s"],
        "ratio_to_typer_rich_console": helped / by["import typer, rich.console"]["cpu_median_s"],
    }


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"CLI cold start, {result['date']}, {result['machine']}; `{result['command']}` "
        f"(code: {result['code']}; median of {result['repeat']} interleaved runs).",
        "",
        "| run | CPU median | CPU min | wall median |",
        "|---|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| `{r['row']}` | {r['cpu_median_s'] * 1000:.0f} ms | {r['cpu_min_s'] * 1000:.0f} ms "
            f"| {r['wall_median_s'] * 1000:.0f} ms |"
        )
    a, b = result["ratio_to_typer_rich"], result["ratio_to_typer_rich_console"]
    lines += [
        "",
        f"`memfit --help` / `import typer, rich`: {a:.2f}x; / `import typer, rich.console`: "
        f"{b:.2f}x (goal <= {GOAL_RATIO}x: {'met' if a <= GOAL_RATIO else 'missed'} against "
        f"the first, {'met' if b <= GOAL_RATIO else 'missed'} against the second).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15, help="runs per row")
    parser.add_argument("--src", default=None, help="PYTHONPATH for the runs (other code)")
    args = parser.parse_args(argv)
    result = run(args.repeat, args.src)
    text = markdown(result)
    write_results("cli_start" if args.src is None else "cli_start_baseline", result, text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
