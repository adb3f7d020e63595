"""Issue 30 on a GPU: what the first call's compile adds to ``peak_bytes_in_use``, by XLA flag.

The first GPU run (bench/xla_deviceless.py, H100, jaxlib 0.11.2) found a small MLP step's
``peak_bytes_in_use`` 144 MiB above its arguments right after ``compile()``, before any step:
the autotuner's buffers, far above what the buffers of one GEMM with guard zones come to. This
probe compiles small and mid-sized steps in fresh processes under flag variants that switch
the autotuner's parts off one at a time, and records ``memory_stats()`` before and after the
compile and after one step, the device's ``memory_analysis()`` and XLA's own autotuning
results (``--xla_gpu_dump_autotune_results_to``: which GEMMs went to cuBLAS, which to Triton).

    XLA_PYTHON_CLIENT_PREALLOCATE=false python bench/xla_floor_probe.py [--jobs 8]
    python bench/xla_floor_probe.py --predict [FILE]   # no GPU: memfit against a stored run

Writes ``bench/out/xla_floor_probe.{json,md}``. Without a GPU it says so and exits 2.
``--predict`` reads a stored run (default: the H100's, in ``tests/data/gpu_truth/
jax_measured/``) and prints memfit's ``peak_bytes_in_use`` for each MLP row, compiled
deviceless for that card with its jaxlib and the row's ``XLA_FLAGS``, against the measured
peak; it writes ``bench/out/xla_floor_predict.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
# the probe's step lives with the tests' shared support code
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "shared"))

import _common
from xla_probe_step import mlp_step

#: name -> XLA_FLAGS added to the process's own
VARIANTS: dict[str, str] = {
    "default": "",
    "autotune_level=0": "--xla_gpu_autotune_level=0",
    "compile_parallelism=1": "--xla_gpu_force_compilation_parallelism=1",
    "triton_gemm=false": "--xla_gpu_enable_triton_gemm=false",
    "cublas_fallback=false": "--xla_gpu_cublas_fallback=false",
    "redzone_padding=0": "--xla_gpu_redzone_padding_bytes=0",
}

#: kind:batch:width:depth (an MLP SGD step as in bench/xla_deviceless.py, or one conv's grad)
STEPS = (
    "mlp:64:64:2",
    "mlp:4096:512:3",
    "mlp:16384:512:3",
    "mlp:65536:512:3",
    "mlp:4096:1024:6",
    "conv:64:32:1",
)

_CHILD = r"""
import json, os, sys
import jax, jax.numpy as jnp
kind, *sizes = sys.argv[1].split(":")
batch, width, depth = (int(x) for x in sizes)
dev = jax.devices()[0]
if kind == "mlp":
    def loss(params, x):
        h = x
        for w in params:
            h = jnp.tanh(h @ w)
        return jnp.mean(h ** 2)
    def step(params, x):
        grads = jax.grad(loss)(params, x)
        return [p - 1e-3 * g for p, g in zip(params, grads)]
    fn = jax.jit(step, donate_argnums=(0,))
    params = [jnp.ones((width, width), jnp.float32) for _ in range(depth)]
    args = (params, jnp.ones((batch, width), jnp.float32))
else:
    def conv(x, w):
        return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME").sum()
    fn = jax.jit(jax.grad(conv, argnums=1))
    args = (jnp.ones((batch, 3, 84, 84), jnp.float32), jnp.ones((width, 3, 8, 8), jnp.float32))
jax.block_until_ready(args)
before = dict(dev.memory_stats() or {})
compiled = fn.lower(*args).compile()
after_compile = dict(dev.memory_stats() or {})
out = compiled(*args)
jax.block_until_ready(out)
after_step = dict(dev.memory_stats() or {})
m = compiled.memory_analysis()
print(json.dumps({
    "analysis": {k: int(getattr(m, k)) for k in ("argument_size_in_bytes", "output_size_in_bytes",
                 "alias_size_in_bytes", "temp_size_in_bytes")},
    "before": before, "after_compile": after_compile, "after_step": after_step,
}))
"""


def _one(step: str, variant: str, timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        dump = os.path.join(tmp, "autotune.txt")
        flags = f"{VARIANTS[variant]} --xla_gpu_dump_autotune_results_to={dump}".strip()
        env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {flags}".strip()
        row: dict[str, Any] = {"step": step, "variant": variant, "xla_flags": env["XLA_FLAGS"]}
        try:
            done = subprocess.run(
                [sys.executable, "-c", _CHILD, step],
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            row["error"] = f"timed out after {timeout:.0f} s"
            return row
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode != 0 or not lines:
            row["error"] = (done.stderr or done.stdout)[-1000:]
            return row
        row.update(json.loads(lines[-1]))
        if os.path.exists(dump):
            row["autotune_results"] = Path(dump).read_text(errors="replace")[:20000]
    return row


def _mib(value: Any) -> str:
    return "" if value is None else f"{value / 2**20:,.1f}"


def _table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| step | variant | args MiB | device temp MiB | compile adds MiB | after step MiB | "
        "largest alloc MiB | num allocs |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['step']} | {row['variant']} | failed: {row['error'][-120:]!r} |")
            continue
        before = row["before"].get("peak_bytes_in_use", 0)
        compiled = row["after_compile"].get("peak_bytes_in_use")
        lines.append(
            f"| {row['step']} | {row['variant']} | "
            f"{_mib(row['analysis']['argument_size_in_bytes'])} | "
            f"{_mib(row['analysis']['temp_size_in_bytes'])} | "
            f"{_mib(None if compiled is None else compiled - before)} | "
            f"{_mib(row['after_step'].get('peak_bytes_in_use'))} | "
            f"{_mib(row['after_compile'].get('largest_alloc_size'))} | "
            f"{row['after_compile'].get('num_allocs', '')} |"
        )
    return "\n".join(lines) + "\n"


STORED = (
    Path(__file__).resolve().parents[1]
    / "tests/data/gpu_truth/jax_measured/h100_jaxlib0.11.2_floor_probe.json"
)


def predict(path: Path) -> int:
    """memfit's figure for every MLP row of a stored run, against the measured peak."""
    from memfit.estimate.xla.step import estimate_jax

    stored = json.loads(path.read_text(encoding="utf-8"))
    lines = [
        f"memfit against {stored['device']}, jax {stored['jax']} ({path.name}), "
        f"{_common.utc_minute()} (`python bench/xla_floor_probe.py --predict`)\n",
        "| step | XLA_FLAGS | measured peak MiB | memfit MiB | err |",
        "|---|---|---:|---:|---:|",
    ]
    errors = []
    for row in stored["rows"]:
        if "error" in row or not row["step"].startswith("mlp"):
            continue
        _, batch, width, depth = row["step"].split(":")
        fn, shapes = mlp_step(int(batch), int(width), int(depth))
        est = estimate_jax(
            fn, *shapes, gpu=stored["device"], jaxlib=stored["jax"],
            environ={"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "XLA_FLAGS": row["xla_flags"]},
        )  # fmt: skip
        measured = row["after_step"]["peak_bytes_in_use"]
        error = (est.peak_bytes_in_use - measured) / measured
        errors.append(error)
        lines.append(
            f"| {row['step'][4:]} | {row['variant']} | {_mib(measured)} | "
            f"{_mib(est.peak_bytes_in_use)} | {error:+.1%} |"
        )
        print(lines[-1], flush=True)
    lines.append("\n" + _common.error_summary(errors, "rows"))
    print(lines[-1])
    _common.OUT.mkdir(parents=True, exist_ok=True)
    (_common.OUT / "xla_floor_predict.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=180)
    parser.add_argument(
        "--predict", nargs="?", const=str(STORED), metavar="FILE",
        help="no GPU: memfit's figures against a stored run (default: the H100's)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.predict:
        return predict(Path(args.predict))
    import jax

    if jax.default_backend() != "gpu":
        print("no GPU for JAX here: this probe reads the GPU allocator's figures")
        return 2
    device = jax.devices()[0].device_kind
    jobs = [(s, v) for s in STEPS for v in VARIANTS]
    rows: list[dict[str, Any]] = []
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        for row in pool.map(lambda job: _one(job[0], job[1], args.timeout), jobs):
            rows.append(row)
            print(json.dumps({k: row.get(k) for k in ("step", "variant", "error")}), flush=True)
            header = (
                f"XLA first-call floor probe, {device}, jax {jax.__version__}, "
                f"{_common.utc_minute()} (`python bench/xla_floor_probe.py`)\n\n"
            )
            payload = {"device": device, "jax": jax.__version__, "rows": rows}
            _common.write_results("xla_floor_probe", payload, header + _table(rows))
    print(_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
