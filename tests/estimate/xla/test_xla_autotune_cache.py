"""cuBLAS chosen for GEMM fusions in a deviceless compile, through XLA's autotune cache.

The parsing runs everywhere; the compile needs the gpu-target extra and is checked against
what a lent H100 measured with jaxlib 0.11.2 (``tests/data/gpu_truth/jax_measured/``,
``bench/xla_floor_probe.py``): the compiled step's temporaries with autotuning off (Triton's
default tilings) and with it on (where cuBLASLt won the MLP's GEMMs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import xla_autotune_cache as cache

import memfit
from memfit.estimate.xla import gpu as xla_gpu

MiB = 1 << 20
ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "tests" / "data" / "gpu_truth" / "jax_measured"

TRITON = (
    '{"operation_queue_id":"0","fusion_backend_config":{"kind":"__triton_gemm"},'
    '"force_earliest_schedule":false}'
)
LOG = f"""\
I1127 00:56:03.656532 3191 config_assigner.cc:124] Finding configs for 3 unique instructions.
I1127 00:56:03.656618 3191 config_assigner.cc:285] Getting config for HLO: %gemm_fusion_dot.17 \
= f32[1024,1024]{{1,0}} fusion(%x.1, %p.1), kind=kCustom, calls=%gemm_fusion_dot.17_computation, \
backend_config={TRITON}
I1127 00:56:03.656730 3191 autotuner_cache.cc:173] Autotune result file not found: \
/c/L_6G2vh7Q8H61zgA9ary2Vst8m-cy3hm1DtPoAMET5Q.textproto
I1127 00:56:03.656779 3191 autotuner_cache.cc:305] Autotune cache miss
I1127 00:56:03.659360 3191 config_assigner.cc:285] Getting config for HLO: %loop_add_fusion.5 \
= f32[1024,1024]{{1,0}} fusion(%gemm_fusion_dot.22), kind=kLoop, calls=%fused_add.5
I1127 00:56:03.659400 3191 autotuner_cache.cc:173] Autotune result file not found: \
/c/loop.textproto
I1127 00:56:03.659700 3191 config_assigner.cc:285] Getting config for HLO: %gemm_fusion_dot.6 \
= f32[1024,2]{{1,0}} fusion(%a, %b), kind=kCustom, calls=%gemm_fusion_dot.6_computation, \
backend_config={TRITON}
I1127 00:56:03.659800 3191 autotuner_cache.cc:173] Autotune result file not found: \
/c/small.textproto
"""


def test_lookups_pair_each_instruction_with_the_file_xla_looked_for() -> None:
    lookups = cache.parse_lookups(LOG)
    assert [(x.name, x.file_name, x.triton_gemm) for x in lookups] == [
        ("gemm_fusion_dot.17", "L_6G2vh7Q8H61zgA9ary2Vst8m-cy3hm1DtPoAMET5Q.textproto", True),
        ("loop_add_fusion.5", "loop.textproto", False),
        ("gemm_fusion_dot.6", "small.textproto", True),
    ]
    assert [x.result_bytes for x in lookups] == [4 * MiB, 4 * MiB, 8192]


def test_cublas_entries_are_written_for_the_selected_triton_gemms_only(tmp_path: Path) -> None:
    lookups = cache.parse_lookups(LOG)
    written = cache.write_cublas_choices(
        lookups, tmp_path, workspace_bytes=32 * MiB, select=lambda x: x.result_bytes >= MiB
    )
    assert [x.name for x in written] == ["gemm_fusion_dot.17"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [lookups[0].file_name]
    text = (tmp_path / lookups[0].file_name).read_text(encoding="utf-8")
    assert "algorithm: 0" in text and "autotune_workspace_size: 33554432" in text


def test_the_cache_file_name_is_the_hash_of_xla_s_key() -> None:
    # a key and the file name XLA 5a9e73c (jaxlib 0.10.2) looked for, from its log
    hlo = (
        "{\n  tmp_0 = f32[1024,1024]{1,0} parameter(0)\n"
        "  tmp_1 = f32[1024,1024]{1,0} parameter(1)\n"
        "  tmp_2 = f32[1024,1024]{1,0} dot(f32[1024,1024]{1,0} tmp_0, f32[1024,1024]{1,0} "
        "tmp_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
        "  ROOT tmp_3 = f32[1024,1024]{1,0} tanh(f32[1024,1024]{1,0} tmp_2)\n}"
    )
    model = (
        "CUDA: 9.0, Cores: 132, GPU clock: 1.98 GHz, Memory bandwidth: 3352 GB/s, "
        "L2 cache: 50 MB, DNN version: 0.0.0"
    )
    assert cache.cache_file_name(model, hlo, 45) == (
        "L_6G2vh7Q8H61zgA9ary2Vst8m-cy3hm1DtPoAMET5Q.textproto"
    )


DUMP = r"""version: 3
results {
  device: "CUDA: 9.0, Cores: 132, GPU clock: 1.98 GHz, DNN version: 9.19.0"
  hlo: "{\n  tmp_0 = f32[8,8]{1,0} parameter(0)\n  ROOT tmp_1 = f32[8,8]{1,0} dot(tmp_0, tmp_0)\n}"
  result {
    run_time { nanos: 8192 }
    gemm { algorithm: 13 autotune_workspace_size: 33554432 }
  }
  version: 45
}
results {
  device: "CUDA: 9.0, Cores: 132, GPU clock: 1.98 GHz, DNN version: 9.19.0"
  hlo: "{\n  ROOT tmp_0 = f32[2]{0} custom-call(), custom_call_target=\"a{b}\"\n}"
  result { triton { block_m: 64 block_n: 64 block_k: 32 num_stages: 3 num_warps: 4 } }
}
"""


def test_a_device_s_dump_is_read_and_replayed_under_the_deviceless_key(tmp_path: Path) -> None:
    entries = cache.parse_results(DUMP)
    assert [(e.backend, e.version) for e in entries] == [("cublas", 45), ("triton", 0)]
    assert entries[0].hlo.startswith("{\n  tmp_0 = f32[8,8]") and entries[0].hlo.endswith("\n}")
    assert (
        entries[1].hlo == '{\n  ROOT tmp_0 = f32[2]{0} custom-call(), custom_call_target="a{b}"\n}'
    )
    assert "autotune_workspace_size: 33554432" in entries[0].result
    log = (
        "I1 autotuner_cache.cc:305] Autotune cache miss: key = "
        "<key model='M 0.0.0', hlo='{\n  x\n}', version=45>\n"
    )
    key = cache.parse_key(log)
    assert key == ("M 0.0.0", 45)
    assert cache.write_replayed(entries, tmp_path, key=key) == 2
    names = {cache.cache_file_name("M 0.0.0", e.hlo, 45) for e in entries}
    assert {p.name for p in tmp_path.iterdir()} == names
    with pytest.raises(ValueError, match="without hlo"):
        cache.parse_results('results { device: "x" }')


_CHILD = """
import json, os, sys
from pathlib import Path
import xla_autotune_cache as cache
os.environ.update(cache.KEY_LOG_ENV)
os.environ["JAX_PLATFORMS"] = "cpu"
import jax
from jax.experimental import topologies
from jax.sharding import NamedSharding, PartitionSpec
from xla_probe_step import mlp_step
request = json.loads(sys.argv[1])
for config in request["configs"]:
    try:
        topology = topologies.get_topology_desc(
            platform="cuda", target_config=config, topology="1x1x1")
        break
    except Exception:
        continue
mesh = topologies.make_mesh(topology, (1,), ("x",))
sharding = NamedSharding(mesh, PartitionSpec())
out = {}
for step in request["steps"]:
    _, batch, width, depth = step.split(":")
    fn, args = mlp_step(int(batch), int(width), int(depth))
    avals = jax.tree_util.tree_map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), args)
    lowered = fn.lower(*avals)
    if request["replay"]:  # a device's dump, written under this compile's keys
        folder = Path(request["replay"])
        with cache.captured_stderr() as log:
            lowered.compile(compiler_options=cache.cache_options(folder / "empty"))
        key = cache.parse_key("".join(log))
        entries = cache.parse_results((folder / "dump.txt").read_text())
        cache.write_replayed(entries, folder / "replayed", key=key)
        compiled = lowered.compile(compiler_options=cache.cache_options(folder / "replayed"))
        out[step] = compiled.memory_analysis().temp_size_in_bytes
        continue
    with cache.captured_stderr() as log:
        default, cublas, chosen = cache.compile_with_cublas(
            lowered, workspace_bytes=request["workspace"])
    # a dump as a device writes it: its own device string, every GEMM fusion on cuBLAS
    keys = re.findall(
        r"key = <key model='.*?', hlo='(.*?)', version=(\\d+)>", "".join(log), re.S)
    dump = "version: 3\\n" + "".join(
        'results { device: "CUDA: 9.0, DNN version: 9.19.0" hlo: %s version: %s '
        "result { gemm { algorithm: 0 autotune_workspace_size: 33554432 } } }\\n"
        % (json.dumps(hlo), version) for hlo, version in keys if " dot(" in hlo)
    out[step] = [default.memory_analysis().temp_size_in_bytes,
                 cublas.memory_analysis().temp_size_in_bytes, len(chosen), dump]
print(json.dumps(out))
""".replace("import json, os, sys", "import json, os, re, sys")


def _run_child(request: dict[str, object]) -> dict[str, object]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [
            str(Path(memfit.__file__).resolve().parents[1]),
            str(ROOT / "tests" / "shared"),  # the autotune-cache tool, the probe's step
            env.get("PYTHONPATH", ""),
        ]
    )
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(request)],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.skipif(
    bool(xla_gpu.gpu_target_missing()), reason="the gpu-target extra is not installed"
)
def test_all_cublas_compile_gives_the_h100_s_temporaries(tmp_path: Path) -> None:
    from memfit.hardware.catalog import gpu as lookup_gpu
    from memfit.hardware.xla_target import target_config

    probe = json.loads((DATA / "h100_jaxlib0.11.2_floor_probe.json").read_text(encoding="utf-8"))
    measured = {
        (row["step"], row["variant"]): row["analysis"]["temp_size_in_bytes"]
        for row in probe["rows"]
    }
    steps = ["mlp:4096:1024:6", "mlp:16384:512:3"]
    target = target_config(lookup_gpu("H100 80GB"))
    request: dict[str, object] = {
        "configs": [target.text(feature_extension=f) for f in (True, False)],
        "steps": steps,
        "workspace": 32 * MiB,  # the Hopper workspace the device keeps
        "replay": None,
    }
    result = _run_child(request)
    for step in steps:
        default, cublas, chosen, _ = result[step]  # type: ignore[misc]
        assert chosen >= 2, step  # the forward and backward GEMM fusions at least
        # autotuning off on the device: Triton's default tilings, as the deviceless default
        assert abs(default - measured[(step, "autotune_level=0")]) <= MiB, step
        # autotuning on: cuBLASLt won, the fusions were inlined, one 32 MiB workspace
        assert abs(cublas - measured[(step, "default")]) <= MiB, step
        assert cublas - default >= 32 * MiB, step
    # the same choices as a device's dump, replayed in a fresh process (XLA keeps what it
    # read from a cache file for the rest of a process)
    step = steps[0]
    for folder in ("empty", "replayed"):
        (tmp_path / folder).mkdir()
    (tmp_path / "dump.txt").write_text(result[step][3], encoding="utf-8")  # type: ignore[index]
    replayed = _run_child({**request, "steps": [step], "replay": str(tmp_path)})
    assert replayed[step] == result[step][1]  # type: ignore[index]
