"""Issue 41: memfit's figure for XLA:GPU programs with a cuDNN convolution or a CUB sort,
against the H100's measurements (no GPU needed).

Reads the stored H100 runs of ``tests/data/gpu_truth/jax_measured/`` (jaxlib 0.11.2): the
floor probe's convolution (``conv:64:32:1``, the weight gradient of a 64x3x84x84 input
with 32 8x8 filters, under six ``XLA_FLAGS`` variants) and the device-compile steps
``conv:64`` and ``permute:1048576`` of ``bench/xla_deviceless.py``. For each it compiles the
step deviceless for the H100 with the same flags (``estimate_jax(..., jaxlib="0.11.2")``,
preallocation off, as the card ran) and prints memfit's ``peak_bytes_in_use`` against the
card's. The permutation's figure is one step's: the bench's loop held the last step's output
while the next ran (its peak is the arguments, two outputs and the temporaries to the byte),
so one output is taken off the measured peak. For the convolution it also replays the
compile's tuning (:func:`memfit.estimate.xla.runtime.replay_cublas_tuning`) against the
compile's own peak and pool.

    python bench/xla_conv_sort.py        # writes bench/out/xla_conv_sort.md

Run it with ``PYTHONPATH`` at another tree for that tree's figures (the "before" column of
docs/benchmarks.md was main at 98b556c).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import _common

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "gpu_truth" / "jax_measured"


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f}"


def rows() -> list[dict[str, Any]]:
    """memfit against the card for every convolution and sort row of the stored runs."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from xla_deviceless import make_step

    from memfit.estimate.xla.step import estimate_jax

    probe = json.loads((DATA / "h100_jaxlib0.11.2_floor_probe.json").read_text("utf-8"))
    deviceless = json.loads((DATA / "h100_jaxlib0.11.2_xla_deviceless.json").read_text("utf-8"))
    out: list[dict[str, Any]] = []
    for row in probe["rows"]:
        if not row["step"].startswith("conv") or "error" in row:
            continue
        _, batch, filters, _ = row["step"].split(":")
        assert filters == "32"  # the floor probe's convolution is xla_deviceless's conv step
        fn, shapes = make_step("conv", int(batch))
        est = estimate_jax(
            fn, *shapes, gpu=probe["device"], jaxlib=probe["jax"],
            environ={"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "XLA_FLAGS": row["xla_flags"]},
        )  # fmt: skip
        out.append({"case": f"floor/{row['step']}", "variant": row["variant"],
                    "measured": row["after_step"]["peak_bytes_in_use"],
                    "memfit": est.peak_bytes_in_use})  # fmt: skip
        print(out[-1], flush=True)
    for row in deviceless["rows"]:
        if row["step"] not in ("conv:64", "permute:1048576"):
            continue
        kind, size = row["step"].split(":")
        fn, shapes = make_step(kind, int(size))
        est = estimate_jax(
            fn, *shapes, gpu=deviceless["device"], jaxlib="0.11.2",
            environ={"XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
        )  # fmt: skip
        measured = row["measured"]["after_steps_peak"]
        if kind == "permute":  # one step: the loop's held output taken off
            measured -= row["measured"]["analysis"]["output_size_in_bytes"]
        out.append({"case": f"deviceless/{row['step']}", "variant": "default",
                    "measured": measured, "memfit": est.peak_bytes_in_use})  # fmt: skip
        print(out[-1], flush=True)
    return out


def main() -> int:
    found = rows()
    lines = [
        f"memfit against the H100 (jaxlib 0.11.2), {_common.utc_minute()} "
        "(`python bench/xla_conv_sort.py`)\n",
        "| case | XLA_FLAGS | measured MiB | memfit MiB | truth / memfit - 1 |",
        "|---|---|---:|---:|---:|",
    ]
    for r in found:
        lines.append(
            f"| {r['case']} | {r['variant']} | {_mib(r['measured'])} | {_mib(r['memfit'])} | "
            f"{r['measured'] / r['memfit'] - 1:+.1%} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    _common.write_results("xla_conv_sort", found, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
