"""Issue 30: the same JAX steps compiled on the GPU and deviceless (XLA's GPU compiler for the
same card, from its target config), and ``memory_stats()`` after compile and after steps.

On a machine with a GPU (JAX with CUDA, and the ``gpu-target`` extra)::

    XLA_PYTHON_CLIENT_PREALLOCATE=false python bench/xla_deviceless.py [--out bench/out]

For each step (an MLP + SGD step at three batch sizes, a matmul-heavy step, a step with a
random permutation, a small convolution), it records the device compile's memory analysis,
the deviceless compile's for the catalog card of the same name (and the real device's own
target config, ``xla_client.get_topology_for_devices``), the JAX estimate's
``peak_bytes_in_use``, and ``memory_stats()`` in a fresh process after compiling and after
five steps. The gaps it measures: autotuning, CUB sort scratch, cuDNN, the runtime floor.
Writes ``xla_deviceless.json`` and ``xla_deviceless.md`` under ``--out``. Without a GPU it
says so and exits 2.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

# the steps live with the tests' shared support code (tests/estimate/xla use them too)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "shared"))

from xla_probe_step import make_step

_STEPS = ("mlp:4096", "mlp:65536", "mlp:262144", "matmul:8192", "permute:1048576", "conv:64")

_PROBE = r"""
import json, sys
import jax, jax.numpy as jnp
kind, size = sys.argv[1].split(":"); size = int(size)
sys.path.insert(0, "bench")
from xla_deviceless import make_step
fn, args = make_step(kind, size, concrete=True)
dev = jax.devices()[0]
base = dev.memory_stats() or {}
compiled = fn.lower(*args).compile()
after_compile = dev.memory_stats() or {}
out = None
for _ in range(5):
    out = fn(*args)
    args = (out, *args[1:]) if kind == "mlp" else args
jax.block_until_ready(out)
after_steps = dev.memory_stats() or {}
m = compiled.memory_analysis()
print(json.dumps({
    "device_kind": dev.device_kind,
    "analysis": {k: int(getattr(m, k)) for k in ("argument_size_in_bytes", "output_size_in_bytes",
                  "alias_size_in_bytes", "temp_size_in_bytes")},
    "before": base.get("peak_bytes_in_use"),
    "after_compile_peak": after_compile.get("peak_bytes_in_use"),
    "after_steps_peak": after_steps.get("peak_bytes_in_use"),
    "bytes_limit": after_steps.get("bytes_limit"),
}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="bench/out")
    parsed = parser.parse_args()
    import jax

    if jax.default_backend() != "gpu":
        print("no GPU for JAX here: this benchmark compares a device compile with a deviceless one")
        return 2
    from jaxlib import xla_client

    from memfit.estimate.xla.gpu import compile_exported, export_step, local_target_config
    from memfit.estimate.xla.step import estimate_jax
    from memfit.hardware.catalog import gpu
    from memfit.hardware.xla_target import target_config

    device = jax.devices()[0]
    spec = gpu(device.device_kind)
    ours = target_config(spec)
    try:
        real = local_target_config()
    except Exception as exc:  # the comparison runs without the device's own config
        real = f"unavailable: {type(exc).__name__}: {exc}"
    rows: list[dict[str, Any]] = []
    out = Path(parsed.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in _STEPS:
        kind, size = name.split(":")
        fn, shapes = make_step(kind, int(size))
        row: dict[str, Any] = {"step": name}
        try:
            probe = subprocess.run(
                [sys.executable, "-c", _PROBE, name], capture_output=True, text=True, timeout=300
            )
            measured = json.loads(probe.stdout.splitlines()[-1]) if probe.returncode == 0 else None
            row.update(measured=measured, probe_error=None if measured else probe.stderr[-800:])
        except Exception as exc:  # one step's failure is a row, not the end of the lane
            row.update(measured=None, probe_error=f"{type(exc).__name__}: {exc}"[:800])
        try:
            deviceless = compile_exported([export_step(fn, *shapes)], ours)[0]
            est = estimate_jax(fn, *shapes, gpu=spec.name)
            row.update(
                deviceless_temp_bytes=deviceless.temp_bytes,
                # every GEMM fusion on cuBLAS: the device's autotuner picks between the two
                deviceless_cublas_temp_bytes=deviceless.cublas_temp_bytes,
                estimate_compiled_for=est.compiled_for,
                estimate_peak_bytes_in_use=est.peak_bytes_in_use,
                estimate_breakdown=[list(t) for t in est.breakdown],
                estimate_notes=list(est.notes),
            )
        except Exception as exc:
            row.update(deviceless_error=f"{type(exc).__name__}: {exc}"[:800])
        rows.append(row)
        print(json.dumps(row)[:400], flush=True)
        _write(out, device.device_kind, ours.text(), real, xla_client.__name__, rows)
    return 0


def _write(
    out: Path, device: str, ours: str, real: str, client: str, rows: list[dict[str, Any]]
) -> None:
    """The report so far (written after every step, so a lane cut short keeps its rows)."""
    report = {
        "device": device,
        "memfit_target_config": ours,
        "real_target_config": real,
        "xla_client": client,
        "rows": rows,
    }
    (out / "xla_deviceless.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    lines = [
        "| step | device temp | deviceless temp | deviceless temp, cuBLAS | peak in use "
        "(measured) | memfit |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        m = row["measured"] or {}
        temp = (m.get("analysis") or {}).get("temp_size_in_bytes")
        lines.append(
            f"| {row['step']} | {temp} | {row.get('deviceless_temp_bytes')} | "
            f"{row.get('deviceless_cublas_temp_bytes')} | "
            f"{m.get('after_steps_peak')} | {row.get('estimate_peak_bytes_in_use')} |"
        )
    (out / "xla_deviceless.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
