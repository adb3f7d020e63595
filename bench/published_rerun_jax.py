"""Issue 30 on a GPU: the published JAX programs run on this card, against memfit's prediction.

``bench/published_truth_jax.py`` rebuilds each published run's program (its jitted rollout,
advantages and update) and predicts the source's measured ``peak_bytes_in_use`` for the
source's card and jaxlib. This script runs the same programs *here*, on this machine's GPU with
the installed jaxlib, and predicts the same quantity for this card with the same jaxlib, so the
deviceless compile and the runtime terms (autotuning floor, BFC rounding) meet a real device:

* each run in a fresh process (``XLA_PYTHON_CLIENT_PREALLOCATE=false``): every phase's
  arguments as device arrays, the bytes the source's loop holds beside it as one device array,
  the phase compiled (``lower().compile()``: its ``memory_analysis()`` on the device) and run
  once; ``memory_stats()["peak_bytes_in_use"]`` after each phase;
* then, in the same process after the measurement, :func:`memfit.estimate_jax` for this GPU
  (XLA's GPU compiler, deviceless, in its own child process).

    XLA_PYTHON_CLIENT_PREALLOCATE=false python bench/published_rerun_jax.py [--jobs 6]

Writes ``bench/out/published_rerun_jax.{json,md}`` after every run. Without a GPU it runs
the programs on the CPU (no ``peak_bytes_in_use`` there) and predicts for ``--gpu``, which
checks the mechanics only.

    python bench/published_rerun_jax.py --predict [FILE]   # no GPU: memfit against a stored run

``--predict`` reads the measurements a GPU session stored (default: the H100's, in
``tests/data/gpu_truth/jax_measured/``) and predicts each run again with this memfit, for that
card and jaxlib; it writes ``bench/out/published_rerun_predict.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common
import published_truth_jax as P

MiB = 2**20
#: the allocator setting every run is measured with (each in a fresh process, see above)
RAN_WITH = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}


def measure(key: str, gpu: str | None) -> dict[str, Any]:
    """Run ``key``'s program on this machine's first device, then predict it (in this process)."""
    import jax
    import jax.numpy as jnp

    run = next(r for r in P.load_runs() if r.key == key)
    program = P.WORKLOADS[run.workload](run.settings)
    device = jax.devices()[0]

    def peak() -> int | None:
        stats = device.memory_stats() or {}
        value = stats.get("peak_bytes_in_use")
        return None if value is None else int(value)

    phases = []
    for phase in program.phases:
        args = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), phase.args)
        held = jnp.zeros((max(phase.held_bytes, 1),), jnp.uint8)
        compiled = phase.fn.lower(*args).compile()
        analysis = compiled.memory_analysis()
        out = compiled(*args)
        jax.block_until_ready(out)
        phases.append(
            {
                "phase": phase.name,
                "held_bytes": phase.held_bytes,
                "argument_bytes": int(getattr(analysis, "argument_size_in_bytes", 0) or 0),
                "output_bytes": int(getattr(analysis, "output_size_in_bytes", 0) or 0),
                "temp_bytes": int(getattr(analysis, "temp_size_in_bytes", 0) or 0),
                "peak_after": peak(),
            }
        )
        del args, held, out, compiled
    measured = peak()
    card = gpu or device.device_kind
    predicted, best_phase, compiled_for, terms = -1, "", "", ()
    for phase in program.phases:
        figure, compiled_for_phase, phase_terms = P._phase_figures(
            phase, card, "gpu", None, RAN_WITH
        )
        if figure > predicted:
            predicted, best_phase = figure, phase.name
            compiled_for, terms = compiled_for_phase, phase_terms
    return {
        "run": key,
        "device": device.device_kind,
        "jaxlib": jax.__version__,
        "measured_peak_bytes_in_use": measured,
        "phases": phases,
        "predicted_bytes": predicted,
        "predicted_phase": best_phase,
        "compiled_for": compiled_for,
        "terms": [list(t) for t in terms],
        "error": None if not measured else (predicted - measured) / measured,
    }


def _child(key: str, gpu: str | None, timeout: float) -> dict[str, Any]:
    argv = [sys.executable, __file__, "--one", key] + (["--gpu", gpu] if gpu else [])
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, env={**os.environ, **RAN_WITH}
        )
    except subprocess.TimeoutExpired:
        return {"run": key, "error_text": f"timed out after {timeout:.0f} s"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            return dict(json.loads(line))
    return {"run": key, "error_text": (done.stderr or done.stdout)[-1200:]}


def _table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| run | measured peak MiB | memfit MiB | err | peak phase (memfit) | device temp MiB "
        "per phase |",
        "|---|---:|---:|---:|---|---|",
    ]
    errors = []
    for row in rows:
        if "error_text" in row:
            lines.append(f"| {row['run']} | failed: {row['error_text'][-160:]!r} | | | | |")
            continue
        measured = row["measured_peak_bytes_in_use"]
        err = row["error"]
        if err is not None:
            errors.append(err)
        temps = ", ".join(f"{p['phase']} {p['temp_bytes'] / MiB:,.1f}" for p in row["phases"])
        lines.append(
            f"| {row['run']} | {'' if measured is None else f'{measured / MiB:,.1f}'} | "
            f"{row['predicted_bytes'] / MiB:,.1f} | {'' if err is None else f'{err:+.1%}'} | "
            f"{row['predicted_phase']} | {temps} |"
        )
    if errors:
        mean = sum(abs(e) for e in errors) / len(errors)
        lines.append(
            f"\nmean |err| {mean:.1%}, worst {max(errors, key=abs):+.1%}, most under "
            f"{min(errors):+.1%} over {len(errors)} runs"
        )
    return "\n".join(lines) + "\n"


STORED = (
    Path(__file__).resolve().parents[1]
    / "tests/data/gpu_truth/jax_measured/h100_jaxlib0.11.2_published_programs.json"
)


def predict_stored(path: Path) -> int:
    """memfit's figure for every run a GPU session measured, against the measured peak."""
    stored = json.loads(path.read_text(encoding="utf-8"))
    by_key = {r.key: r for r in P.load_runs()}
    lines = [
        f"memfit against {path.name}, {_common.utc_minute()} "
        "(`python bench/published_rerun_jax.py --predict`)\n",
        "| run | measured MiB | memfit MiB | err |",
        "|---|---:|---:|---:|",
    ]
    errors = []
    for measured in stored["runs"]:
        run = by_key[measured["run"]]
        program = P.WORKLOADS[run.workload](run.settings)
        figure = max(
            P._phase_figures(phase, measured["device"], "gpu", measured["jaxlib"], RAN_WITH)[0]
            for phase in program.phases
        )
        real = measured["measured_peak_bytes_in_use"]
        errors.append((figure - real) / real)
        lines.append(
            f"| {run.name} | {real / MiB:,.1f} | {figure / MiB:,.1f} | {errors[-1]:+.1%} |"
        )
        print(lines[-1], flush=True)
    lines.append("\n" + _common.error_summary(errors))
    print(lines[-1])
    _common.OUT.mkdir(parents=True, exist_ok=True)
    (_common.OUT / "published_rerun_predict.md").write_text(
        "\n".join(lines) + "\n", encoding="utf-8"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=6, help="runs measured at once")
    parser.add_argument("--gpu", help="the card to predict for (default: this machine's GPU)")
    parser.add_argument("--series", help="only this source file (its stem)")
    parser.add_argument("--run", help="only these runs (names, comma-separated)")
    parser.add_argument("--timeout", type=float, default=400, help="seconds per run")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument(
        "--predict", nargs="?", const=str(STORED), metavar="FILE",
        help="no GPU: memfit's figures against a stored run (default: the H100's)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.predict:
        return predict_stored(Path(args.predict))
    if args.one:
        print(json.dumps(measure(args.one, args.gpu)), flush=True)
        return 0
    runs = [
        r.key
        for r in P.load_runs()
        if args.series in (None, r.series) and (args.run is None or r.name in args.run.split(","))
    ]
    rows: list[dict[str, Any]] = []
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        for row in pool.map(lambda key: _child(key, args.gpu, args.timeout), runs):
            rows.append(row)
            print(json.dumps(row)[:300], flush=True)
            header = (
                f"Published JAX programs rerun on this GPU, {_common.utc_minute()} "
                "(`python bench/published_rerun_jax.py`)\n\n"
            )
            _common.write_results("published_rerun_jax", {"runs": rows}, header + _table(rows))
    print(_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
