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

    python bench/xla_conv_sort.py          # writes bench/out/xla_conv_sort.md
    python bench/xla_conv_sort.py --device # on a GPU: bench/out/xla_conv_sort_device.json

``--device`` (a machine with a CUDA GPU and JAX for it; ``bench/gpu_session.sh`` runs it)
measures what the stored runs cannot tell: for convolutions of several shapes, kinds and
dtypes and for sorts of several sizes and types, each in a fresh process with preallocation
off, ``memory_stats()`` before and after the compile and after one step, the device compile's
memory analysis, XLA's autotuning log (``--xla_gpu_dump_autotune_logs_to``: each cuDNN
candidate's ``scratch_bytes``, against memfit's workspace bound) and the BFC allocator's log
of every allocation (``TF_CPP_VMODULE=bfc_allocator=2``, its last 400 lines), beside memfit's
deviceless figure for the same card.

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


#: The device grid: ``conv:KIND:N:C:HW:K:F:DTYPE`` (KIND ``fwd`` / ``wgrad`` / ``dgrad``: the
#: forward convolution, its weight or its input gradient; N images of C x HW x HW, F filters
#: of K x K) and ``sort:OP:N:DTYPE`` (OP ``sort`` / ``argsort`` / ``perm`` / ``topk``).
DEVICE_CASES = (
    "conv:wgrad:64:3:84:8:32:float32",  # the stored run's convolution, again
    "conv:fwd:64:3:84:8:32:float32",
    "conv:dgrad:64:32:84:3:32:float32",
    "conv:wgrad:256:4:84:8:32:float32",  # Nature-DQN's first layer at batch 256
    "conv:wgrad:256:32:20:4:64:float32",  # its second layer
    "conv:wgrad:256:4:84:8:32:bfloat16",
    "conv:fwd:1024:16:10:3:16:float32",  # MinAtar-sized
    "sort:perm:1048576:float32",
    "sort:sort:1048576:float32",
    "sort:argsort:1048576:float32",
    "sort:sort:4194304:int32",
    "sort:topk:1048576:float32",
    "sort:perm:65536:float32",
)

_DEVICE_CHILD = r"""
import json, sys
import jax, jax.numpy as jnp
sys.path.insert(0, "bench")
from xla_conv_sort import device_step
fn, shapes = device_step(sys.argv[1])
args = [jnp.ones(s.shape, s.dtype) if s.dtype != jnp.uint32 else jax.random.PRNGKey(0)
        for s in shapes]
jax.block_until_ready(args)
dev = jax.devices()[0]
before = dict(dev.memory_stats() or {})
compiled = fn.lower(*args).compile()
after_compile = dict(dev.memory_stats() or {})
jax.block_until_ready(compiled(*args))
after_step = dict(dev.memory_stats() or {})
m = compiled.memory_analysis()
print(json.dumps({
    "analysis": {k: int(getattr(m, k)) for k in ("argument_size_in_bytes", "output_size_in_bytes",
                 "alias_size_in_bytes", "temp_size_in_bytes")},
    "before": before, "after_compile": after_compile, "after_step": after_step,
    "hlo_custom_calls": [l.strip()[:400] for l in compiled.as_text().splitlines()
                         if "custom-call" in l and ("cudnn" in l or "cub" in l)],
}))
"""


def device_step(case: str) -> tuple[Any, tuple[Any, ...]]:
    """One case of :data:`DEVICE_CASES`: a jitted step and its argument shapes."""
    import jax
    import jax.numpy as jnp

    kind, *rest = case.split(":")
    if kind == "conv":
        op, n, c, hw, k, f, dtype = rest
        dt = jnp.dtype(dtype)
        x = jax.ShapeDtypeStruct((int(n), int(c), int(hw), int(hw)), dt)
        w = jax.ShapeDtypeStruct((int(f), int(c), int(k), int(k)), dt)

        def conv(x: Any, w: Any) -> Any:
            return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME")

        if op == "fwd":
            return jax.jit(conv), (x, w)
        argnum = 1 if op == "wgrad" else 0
        return jax.jit(jax.grad(lambda x, w: conv(x, w).astype(jnp.float32).sum(), argnum)), (
            x, w,
        )  # fmt: skip
    op, size, dtype = rest
    v = jax.ShapeDtypeStruct((int(size),), jnp.dtype(dtype))
    key = jax.ShapeDtypeStruct((2,), jnp.uint32)
    if op == "perm":
        return jax.jit(lambda v, k: v[jax.random.permutation(k, v.shape[0])]), (v, key)
    if op == "sort":
        return jax.jit(jnp.sort), (v,)
    if op == "argsort":
        return jax.jit(jnp.argsort), (v,)
    return jax.jit(lambda v: jax.lax.top_k(v, 64)), (v,)


def device(timeout: float = 240) -> int:
    """On a GPU: :data:`DEVICE_CASES` measured, each in a fresh process, beside memfit."""
    import os
    import subprocess
    import tempfile

    import jax

    if jax.default_backend() != "gpu":
        print("no GPU for JAX here: --device measures convolutions and sorts on the card")
        return 2
    from memfit.estimate.xla.step import estimate_jax

    card = jax.devices()[0].device_kind
    found: list[dict[str, Any]] = []
    for case in DEVICE_CASES:
        row: dict[str, Any] = {"case": case, "device": card, "jax": jax.__version__}
        with tempfile.TemporaryDirectory() as tmp:
            log = os.path.join(tmp, "autotune_logs.txt")
            env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false",
                       TF_CPP_VMODULE="bfc_allocator=2", TF_CPP_MIN_LOG_LEVEL="0")  # fmt: skip
            env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_gpu_dump_autotune_logs_to={log}"
            try:
                done = subprocess.run(
                    [sys.executable, "-c", _DEVICE_CHILD, case], env=env,
                    capture_output=True, text=True, timeout=timeout,
                )  # fmt: skip
                lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
                if done.returncode == 0 and lines:
                    row.update(json.loads(lines[-1]))
                else:
                    row["error"] = (done.stderr or done.stdout)[-1500:]
                row["bfc_log_tail"] = [x for x in done.stderr.splitlines() if "bfc_allocator" in x][
                    -400:
                ]
            except subprocess.TimeoutExpired:
                row["error"] = f"timed out after {timeout:.0f} s"
            if os.path.exists(log):
                row["autotune_logs"] = Path(log).read_text(errors="replace")[:60000]
        try:
            fn, shapes = device_step(case)
            est = estimate_jax(fn, *shapes, gpu=card,
                               environ={"XLA_PYTHON_CLIENT_PREALLOCATE": "false"})  # fmt: skip
            row["memfit_peak_bytes_in_use"] = est.peak_bytes_in_use
            row["memfit_breakdown"] = [list(t) for t in est.breakdown]
        except Exception as exc:  # the measurement stands without memfit's figure
            row["memfit_error"] = f"{type(exc).__name__}: {exc}"[:800]
        found.append(row)
        print(json.dumps({k: row.get(k) for k in ("case", "error", "memfit_error")}), flush=True)
        _common.OUT.mkdir(parents=True, exist_ok=True)
        (_common.OUT / "xla_conv_sort_device.json").write_text(json.dumps(found, indent=1))
    return 0


def main() -> int:
    if "--device" in sys.argv[1:]:
        return device()
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
