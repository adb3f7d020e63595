"""Deviceless XLA:GPU temporaries when the autotuner's GEMM choice is cuBLAS, against an H100.

Without a device, XLA gives every Triton GEMM fusion its default tiling; on a device the
autotuner may pick cuBLASLt and inline the fusion. memfit's child compiles a variant with
``xla_gpu_enable_triton_gemm=false``; this script compiles the step as the device would after
choosing cuBLAS for every GEMM fusion (:mod:`xla_autotune_cache`: the choice
written into XLA's per-fusion autotune cache, 32 MiB workspace as the device keeps on
Hopper), and for the large GEMM fusions only (result of 4 MiB or more), each step in a fresh
process for the H100's target config, and prints them against the temporaries the H100
measured with jaxlib 0.11.2 (``tests/data/gpu_truth/jax_measured/``).

    python bench/xla_cublas_choice.py           # needs the gpu-target extra, no GPU
    python bench/xla_cublas_choice.py --device  # on a GPU: also the device's own choices

``--device`` (on a machine with the GPU) also compiles each step on the device with
``--xla_gpu_dump_autotune_results_to`` (its temporaries, and which GEMM went where), then
deviceless again, with the device's target config, replaying the device's dump through the
cache: when the replay gives the device's temporaries, the autotuner's choice is all that the
deviceless compile missed. Writes ``bench/out/xla_cublas_choice.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
# the autotune-cache helpers live with the tests' shared support code
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "shared"))

import _common

MiB = 1 << 20
ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "gpu_truth" / "jax_measured"

#: step -> how to build it: a floor-probe MLP, or a published program's phase
STEPS: dict[str, dict[str, Any]] = {
    "mlp:4096:512:3": {"mlp": [4096, 512, 3]},
    "mlp:16384:512:3": {"mlp": [16384, 512, 3]},
    "mlp:65536:512:3": {"mlp": [65536, 512, 3]},
    "mlp:4096:1024:6": {"mlp": [4096, 1024, 6]},
    "benchback CartPole-v1 1024x6 update": {
        "workload": "benchback_linen_ppo",
        "settings": {"env": "CartPole-v1", "hidden_sizes": [1024] * 6},
        "phase": "update",
        "measured_run": "benchback_rl_gymnax_ppo/CartPole-v1 1024x6",
    },
    "benchback CartPole-v1 256x3 update": {
        "workload": "benchback_linen_ppo",
        "settings": {"env": "CartPole-v1", "hidden_sizes": [256] * 3},
        "phase": "update",
        "measured_run": "benchback_rl_gymnax_ppo/CartPole-v1 256x3",
    },
}

_BUILD = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, os.path.join(os.path.dirname(sys.argv[1]), "tests", "shared"))
request = json.loads(sys.argv[2])
spec = request["step"]
def build():
    if "mlp" in spec:
        from xla_floor_probe import mlp_step
        return mlp_step(*spec["mlp"])
    import published_truth_jax as truth
    program = truth.WORKLOADS[spec["workload"]](spec["settings"])
    phase = next(p for p in program.phases if p.name == spec["phase"])
    return phase.fn, phase.args
"""

#: deviceless: Triton defaults, triton_gemm=false, cuBLAS for all (or the large) GEMM fusions,
#: or a device's dump replayed
_CHILD = (
    _BUILD
    + r"""
import xla_autotune_cache as cache
os.environ.update(cache.KEY_LOG_ENV)
os.environ["JAX_PLATFORMS"] = "cpu"
import jax
from jax.experimental import topologies
from jax.sharding import NamedSharding, PartitionSpec
fn, args = build()
for config in request["configs"]:
    try:
        topology = topologies.get_topology_desc(
            platform="cuda", target_config=config, topology="1x1x1")
        break
    except Exception:
        continue
sharding = NamedSharding(topologies.make_mesh(topology, (1,), ("x",)), PartitionSpec())
avals = jax.tree_util.tree_map(
    lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), args)
lowered = (fn if hasattr(fn, "lower") else jax.jit(fn)).lower(*avals)
temp = lambda c: c.memory_analysis().temp_size_in_bytes
out = {}
if request.get("replay"):
    folder = request["replay"]
    os.makedirs(folder + "/empty"); os.makedirs(folder + "/replayed")
    with cache.captured_stderr() as log:
        out["triton_default"] = temp(
            lowered.compile(compiler_options=cache.cache_options(folder + "/empty")))
    entries = cache.parse_results(open(request["dump"]).read())
    out["device_choices"] = sorted(e.backend for e in entries)
    cache.write_replayed(entries, folder + "/replayed", key=cache.parse_key("".join(log)))
    out["replayed"] = temp(
        lowered.compile(compiler_options=cache.cache_options(folder + "/replayed")))
    print(json.dumps(out))
    sys.exit(0)
out["triton_gemm_false"] = temp(
    lowered.compile(compiler_options={"xla_gpu_enable_triton_gemm": False}))
large = request["large"]
default, cublas, chosen = cache.compile_with_cublas(
    lowered, workspace_bytes=request["workspace"],
    select=(lambda x: x.result_bytes >= large) if large else None)
name = "large" if large else "all"
out["cublas_" + name] = temp(cublas) if cublas is not None else temp(default)
out["fusions_" + name] = len(chosen)
out["triton_default"] = temp(default)
print(json.dumps(out))
"""
)

#: on the device: its compile's temporaries, its autotune dump, its target config
_DEVICE = (
    _BUILD
    + r"""
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_gpu_dump_autotune_results_to=" + request["dump"])
import jax
from jaxlib import xla_client
fn, args = build()
lowered = (fn if hasattr(fn, "lower") else jax.jit(fn)).lower(*args)
compiled = lowered.compile()
config = xla_client.get_topology_for_devices(jax.devices()).target_config
print(json.dumps({"device_temp": compiled.memory_analysis().temp_size_in_bytes,
                  "config": config if isinstance(config, str) else str(config)}))
"""
)


def _measured() -> dict[str, int]:
    probe = json.loads((DATA / "h100_jaxlib0.11.2_floor_probe.json").read_text(encoding="utf-8"))
    found = {
        row["step"]: row["analysis"]["temp_size_in_bytes"]
        for row in probe["rows"]
        if row["variant"] == "default"
    }
    programs = json.loads(
        (DATA / "h100_jaxlib0.11.2_published_programs.json").read_text(encoding="utf-8")
    )
    for name, spec in STEPS.items():
        for run in programs["runs"]:
            if run["run"] == spec.get("measured_run"):
                phase = next(p for p in run["phases"] if p["phase"] == spec["phase"])
                found[name] = phase["temp_bytes"]
    return found


def _child(script: str, request: dict[str, Any]) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", script, str(Path(__file__).resolve().parent), json.dumps(request)],
        capture_output=True, text=True, env=env, timeout=1800, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1][:300]}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _on_device(spec: dict[str, Any]) -> dict[str, Any]:
    """The device's own compile, then its dump replayed deviceless with its target config."""
    with tempfile.TemporaryDirectory(prefix="memfit-cublas-choice-") as folder:
        dump = str(Path(folder) / "autotune.txt")
        device = _child(_DEVICE, {"step": spec, "dump": dump})
        if "error" in device or not Path(dump).exists():
            return {"device_error": device.get("error", "no autotune dump written")}
        replay = _child(
            _CHILD,
            {"step": spec, "configs": [device["config"]], "dump": dump,
             "replay": str(Path(folder) / "cache")},
        )  # fmt: skip
        return {
            "device_temp": device["device_temp"],
            "device_config_triton_default": replay.get("triton_default"),
            "device_choices": replay.get("device_choices"),
            "replayed": replay.get("replayed"),
            "replay_error": replay.get("error"),
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", action="store_true", help="also on this machine's GPU")
    options = parser.parse_args(argv)
    from memfit.estimate.xla.gpu import gpu_target_missing
    from memfit.hardware.catalog import gpu as lookup_gpu
    from memfit.hardware.xla_target import target_config

    missing = gpu_target_missing()
    if missing:
        print("needs the gpu-target extra: " + "; ".join(missing), file=sys.stderr)
        return 2
    target = target_config(lookup_gpu("H100 80GB"))
    configs = [target.text(feature_extension=f) for f in (True, False)]
    measured = _measured()
    rows = []
    for name, spec in STEPS.items():
        row: dict[str, Any] = {"step": name, "measured_temp": measured.get(name)}
        # a fresh process for each: XLA keeps what it read from a cache file for the process
        for large in (0, 4 * MiB):
            request = {"step": spec, "configs": configs, "workspace": 32 * MiB, "large": large}
            row.update(_child(_CHILD, request))
        if options.device:
            row.update(_on_device(spec))
        rows.append(row)
        print(json.dumps(row), flush=True)

    def mib(value: Any) -> str:
        return f"{value / MiB:.2f}" if isinstance(value, int) else "-"

    lines = [
        f"Deviceless XLA:GPU temporaries (MiB) for the H100, {_common.utc_minute()} "
        "(`python bench/xla_cublas_choice.py`), against the H100's compiled temp "
        "(jaxlib 0.11.2)\n",
        "| step | Triton defaults | triton_gemm=false | all GEMM fusions cuBLAS (32 MiB ws) "
        "| large ones cuBLAS | H100 measured | this device | device's choices replayed |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['step']} | {mib(row.get('triton_default'))} "
            f"| {mib(row.get('triton_gemm_false'))} "
            f"| {mib(row.get('cublas_all'))} ({row.get('fusions_all', '-')}) "
            f"| {mib(row.get('cublas_large'))} ({row.get('fusions_large', '-')}) "
            f"| {mib(row.get('measured_temp'))} | {mib(row.get('device_temp'))} "
            f"| {mib(row.get('replayed'))} |"
        )
    _common.write_results(
        "xla_cublas_choice", {"captured": _common.utc_minute(), "rows": rows}, "\n".join(lines)
    )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
