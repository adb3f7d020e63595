"""What TrainGuard adds to a step, counted in instructions (deterministic, unlike time).

Runs the 5 ms CPU MLP step of ``guard_overhead.py`` (batch 243, Adam) under
``valgrind --tool=callgrind``, bare, under ``memfit.TrainGuard`` and under ``TrainGuard.step``,
for 5 and for 105 steps; the difference between the two counts divided by 100 is one step's
instructions, with the import, the model's construction and the warm-up cancelled out (and
one-time events between the two lengths, a garbage collection say, spread over 100 steps).
OpenBLAS threads (numpy's) are pinned to one so their spin does not enter the count.
Instructions are not time (cache behaviour is left out), but they are repeatable on a shared
machine where a 1% timing is not.

    python bench/guard_instructions.py     # needs valgrind; about 15 minutes on 2 cores

Writes ``bench/out/guard_instructions.json`` and ``.md`` and prints the markdown table.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import utc_minute, write_results  # noqa: E402

SHORT, LONG = 5, 105  # steps of the two runs of each mode

CHILD = """
import sys, torch
from torch import nn
import memfit
torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                      nn.Linear(256, 10))
x = torch.randn(243, 256)
y = torch.randint(0, 10, (243,))
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
def loss_fn(b):
    return nn.functional.cross_entropy(model(b[0]), b[1])
def bare():
    opt.zero_grad(set_to_none=True)
    loss_fn((x, y)).backward()
    opt.step()
guard = memfit.TrainGuard(opt, loss_fn)
modes = {"bare": bare, "guard": lambda: guard((x, y)), "guard_step": lambda: guard.step((x, y))}
step = modes[sys.argv[1]]
for _ in range(3 + int(sys.argv[2])):
    step()
"""


def _count(mode: str, steps: int, script: str) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        proc = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={tmp}/out",
                sys.executable,
                script,
                mode,
                str(steps),
            ],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
    match = re.search(r"Collected : (\d+)", proc.stderr)
    if match is None:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{proc.stderr[-2000:]}")
    return int(match.group(1))


def main() -> int:
    argparse.ArgumentParser(
        description="TrainGuard's instructions per step under callgrind (about 15-20 minutes "
        "on 2 cores); writes bench/out/guard_instructions.json and .md."
    ).parse_args()
    if shutil.which("valgrind") is None:
        print("bench/guard_instructions.py needs valgrind", file=sys.stderr)
        return 2
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "step.py")
        Path(script).write_text(CHILD)
        jobs = [(m, n) for m in ("bare", "guard", "guard_step") for n in (SHORT, LONG)]
        with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            counts = dict(zip(jobs, pool.map(lambda j: _count(*j, script), jobs), strict=True))
    per_step = {
        m: (counts[(m, LONG)] - counts[(m, SHORT)]) / (LONG - SHORT)
        for m in ("bare", "guard", "guard_step")
    }
    result = {
        "date": utc_minute(),
        "machine": f"{platform.node()} {platform.machine()}, torch {torch.__version__}",
        "command": "python bench/guard_instructions.py",
        "instructions_per_step": per_step,
    }
    base = per_step["bare"]
    lines = [
        f"# TrainGuard: instructions per step ({result['date']}, {result['machine']})",
        "",
        "| mode | instructions per step | more than bare |",
        "|---|---:|---:|",
    ]
    for mode, value in per_step.items():
        lines.append(
            f"| {mode} | {value:,.0f} | {value - base:+,.0f} ({(value - base) / base:+.2%}) |"
        )
    text = "\n".join(lines) + "\n"
    write_results("guard_instructions", result, text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
