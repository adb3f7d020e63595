"""How long measuring a Brax env takes as a user meets it: ``memfit plan`` with
``--measure fresh`` for one card, a second card after it (the steps exported for CUDA are
shared; only the card's compile runs), and ``--all-gpus``, each in a fresh process.

    python bench/brax_measure_time.py --workload brax_humanoid_ppo --gpu "RTX 4070" \
        --second-gpu "RTX 3060 Ti"

Each run starts with an empty measurement cache (``MEMFIT_CACHE_DIR`` in a new temporary
folder), except the second card's, which shares the first card's folder (as one user's
cache would). Prints and writes (``bench/out/brax_measure_time.{json,md}``) the wall time of
each command, its exit status and whether JAX's start-up noise (the CUDA plugin's traceback,
absl / cudart lines, Brax's warp lines) reached the output.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out"
NOISE = ("Unable to load CUDA", "cudart_stub", "absl::InitializeLog", "Failed to import warp")


def _run(args: list[str], cache: str) -> dict[str, object]:
    env = {**os.environ, "MEMFIT_CACHE_DIR": cache}
    env.pop("JAX_PLATFORMS", None)  # as a user's shell has it
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "memfit.cli.main", *args],
        capture_output=True, text=True, env=env, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    output = done.stdout + done.stderr
    return {
        "command": "memfit " + shlex.join(args),
        "seconds": round(seconds, 1),
        "exit": done.returncode,
        "noise": [n for n in NOISE if n in output],
        "tail": output.strip().splitlines()[-3:],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="brax_humanoid_ppo")
    ap.add_argument("--gpu", default="RTX 4070")
    ap.add_argument("--second-gpu", default="RTX 3060 Ti")
    ap.add_argument("--skip-all-gpus", action="store_true")
    args = ap.parse_args(argv)
    command = "python bench/brax_measure_time.py " + shlex.join(
        sys.argv[1:] if argv is None else argv
    )
    rows = []
    with tempfile.TemporaryDirectory(prefix="memfit-bench-cache-") as shared:
        for gpu in (args.gpu, args.second_gpu):
            rows.append(_run(["plan", args.workload, "--gpu", gpu, "--measure", "fresh"], shared))
            print(json.dumps(rows[-1]), flush=True)
    if not args.skip_all_gpus:
        with tempfile.TemporaryDirectory(prefix="memfit-bench-cache-") as fresh:
            rows.append(_run(["plan", args.workload, "--all-gpus", "--measure", "fresh"], fresh))
            print(json.dumps(rows[-1]), flush=True)
    lines = [
        f"`{command}`",
        "",
        "| command | wall (s) | exit | start-up noise in the output |",
        "|---|---:|---:|---|",
        *(
            f"| `{r['command']}` | {r['seconds']} | {r['exit']} | "
            f"{', '.join(r['noise']) or 'none'} |"  # type: ignore[arg-type]
            for r in rows
        ),
    ]
    text = "\n".join(lines)
    print(text)
    OUT.mkdir(exist_ok=True)
    (OUT / "brax_measure_time.json").write_text(json.dumps({"command": command, "rows": rows}))
    (OUT / "brax_measure_time.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
