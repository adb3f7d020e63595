"""Issue 30: XLA's GPU compiler for a named card, on this CPU-only machine, and the JAX runtime
around the compiled step."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
from xla_probe_step import mlp_step

from memfit.errors import BackendUnavailable, ConfigError, EstimateError
from memfit.estimate.xla import gpu as xla_gpu
from memfit.estimate.xla import runtime as rt
from memfit.hardware.catalog import gpu as lookup_gpu
from memfit.hardware.catalog import list_gpus
from memfit.hardware.xla_target import (
    TargetConfig,
    arch_limits,
    card_figures,
    cuda_total_bytes,
    target_config,
    xla_memory_limit,
)
from memfit.units import MiB

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

READY = not xla_gpu.gpu_target_missing()
needs_extra = pytest.mark.skipif(not READY, reason="the gpu-target extra is not installed")


def _mlp_step() -> Any:
    """The floor probe's tanh MLP step (3 x 512), jitted with its weights donated."""
    return mlp_step(1, 512, 3)[0]


def _args(batch: int) -> tuple[Any, Any]:
    return tuple(mlp_step(batch, 512, 3)[1])  # type: ignore[return-value]


# -- target configs, for every CUDA card of the catalog ----------------------------------------


def test_every_cuda_card_has_a_target_config_from_its_own_figures() -> None:
    cards = [s for s in list_gpus() if s.compute_capability is not None]
    assert len(cards) > 100
    for spec in cards:
        config = target_config(spec)
        figures = card_figures(spec.name)
        assert figures is not None and figures["source_text"], spec.name
        assert figures.get("cuda_total_source", figures["source"]) in _sources(), spec.name
        assert config.core_count == figures["sm_count"] > 0
        assert 0.5 < config.clock_rate_ghz < 3.0, spec.name
        # CUDA's total is at most nvidia-smi's, and not far below it
        assert 0.9 * spec.total_bytes < config.device_memory_size <= spec.total_bytes * 1.06
        text = config.text()
        assert f"core_count: {config.core_count}\n" in text
        assert f"major: {spec.compute_capability[0]}\n" in text
        assert config.compiled_for.startswith(f"cuda sm_{spec.compute_capability[0]}")


def test_compiled_for_names_the_card_and_its_target() -> None:
    assert target_config(lookup_gpu("4070")).compiled_for == "cuda sm_89 (NVIDIA GeForce RTX 4070)"
    assert target_config(lookup_gpu("H100 80GB")).compiled_for == (
        "cuda sm_90a (NVIDIA H100 80GB HBM3)"
    )
    # XLA's own spec file's figure, from a real H100
    assert cuda_total_bytes(lookup_gpu("H100 80GB")) == (84942979072, "published")
    assert "feature_extension" not in target_config(lookup_gpu("T4")).text(feature_extension=False)


def test_the_laptop_3070s_memory_is_the_one_xla_printed_for_it() -> None:
    """luchris429/purejaxrl#38: on an 8 GB RTX 3070 Laptop GPU XLA printed its base limit,
    JAX's allocator limit (0.75 of the memory CUDA reports), as 6,244,368,384 bytes."""
    config = target_config(lookup_gpu("RTX 3070 Laptop"))
    assert config.device_memory_source == "published"
    assert int(config.device_memory_size * 0.75) == 6_244_368_384
    figures = card_figures(config.name)
    assert figures is not None and "purejaxrl" in _sources()[figures["cuda_total_source"]]
    assert "purejaxrl" in config.source  # the config says where its memory figure is from


def _sources() -> dict[str, str]:
    from memfit.hardware.xla_target import _data

    sources: dict[str, str] = _data()["sources"]
    return sources


def test_a_gpu_known_only_by_its_size_has_no_target_config() -> None:
    with pytest.raises(ConfigError, match="no XLA target config"):
        target_config(lookup_gpu("12GiB"))
    with pytest.raises(ConfigError, match=r"compute capability 5\.2"):
        arch_limits((5, 2))


def test_xla_memory_limit_is_xlas_rule() -> None:
    # GetSchedulerMemoryLimit: (base - inputs and outputs) * 95 / 100
    assert xla_memory_limit(8 * 2**30, 2**30) == (7 * 2**30) * 95 // 100


# -- the runtime's terms ----------------------------------------------------------------------


def test_autotuning_holds_guarded_buffers_one_gemm_at_a_time() -> None:
    gemm = rt.GemmBuffers
    # a GEMM fusion: its two inputs guarded (8 MiB each side), output and reference unguarded
    fusion = gemm("fusion", (MiB,), (8 * MiB, MiB))
    assert rt.autotune_bytes([fusion], {}) == (8 + 16) * MiB + (1 + 16) * MiB + 2 * MiB
    # a fused bias (a third, small input) is not counted: the measured floors show two
    with_bias = gemm("fusion", (MiB,), (8 * MiB, MiB, 4096))
    assert rt.autotune_bytes([with_bias], {}) == rt.autotune_bytes([fusion], {})
    # a cuBLAS call: operands, result, workspace and a reference copy, every one guarded
    cublas = gemm("cublas", (MiB, 4 * MiB), (8 * MiB, MiB))
    assert rt.autotune_bytes([cublas], {}) == (8 + 1 + 1 + 4 + 1) * MiB + 5 * 16 * MiB
    # one GEMM at a time: the largest decides
    assert rt.autotune_bytes([fusion, cublas], {}) == rt.autotune_bytes([cublas], {})
    assert rt.autotune_bytes([fusion], {"XLA_FLAGS": "--xla_gpu_autotune_level=0"}) == 0
    # below level 4 no correctness check: no guard zones, no reference
    assert rt.autotune_bytes([fusion], {"XLA_FLAGS": "--xla_gpu_autotune_level=3"}) == 10 * MiB
    padded = {"XLA_FLAGS": "--xla_gpu_redzone_padding_bytes=0"}
    assert rt.autotune_bytes([fusion], padded) == 11 * MiB
    assert rt.autotune_bytes([], {}) == 0
    assert gemm.from_plain({"kind": "fusion", "results": [1], "operands": [2, 3]}) == gemm(
        "fusion", (1,), (2, 3)
    )


def test_autotuning_follows_the_targets_jaxlib() -> None:
    """Before jaxlib 0.7.2 GemmAlgorithmPicker tuned a cuBLAS call for every GEMM: operands,
    result, workspace (capped at the operands' bytes) and a reference copy, all guarded;
    0.5.0-0.7.1 could hold two GEMMs' buffers at once; 0.7.2 guards the inputs only."""
    gemm = rt.GemmBuffers
    tiny = gemm("fusion", (64 * 4,), (64 * 512 * 4, 512 * 64 * 4, 256))
    ampere, hopper = (8, 0), (9, 0)
    old = rt.autotune_rules("0.4.33", ampere)
    dot = 64 * 512 * 4 + 512 * 64 * 4
    five = 5 * 16 * MiB + dot + 2 * (64 * 4) + min(4 * MiB, dot)
    assert rt.autotune_bytes([tiny], {}, old) == five  # about 80 MiB: the 0.4.33 floor
    # on Hopper the workspace is 32 MiB, but a legacy cuBLAS call's is capped by its operands
    assert rt.autotune_bytes([tiny], {}, rt.autotune_rules("0.4.33", hopper)) == five
    big = gemm("fusion", (64 * MiB,), (64 * MiB, 64 * MiB))
    big_hopper = rt.autotune_bytes([big], {}, rt.autotune_rules("0.4.33", hopper))
    assert big_hopper - rt.autotune_bytes([big], {}, old) == 28 * MiB  # 32 MiB, not 4
    # 0.5.0-0.7.1: the next GEMM's operands and result before the last one's five are freed
    mid = rt.autotune_rules("0.5.3", ampere)
    three = 3 * 16 * MiB + dot + 64 * 4
    assert rt.autotune_bytes([tiny, tiny], {}, mid) == five + three  # about 129 MiB
    assert rt.autotune_bytes([tiny], {}, mid) == five  # one GEMM: nothing to overlap
    # 0.7.2 and later: the inputs only (the measured jaxlib 0.7.2 floors), as without rules
    new = rt.autotune_rules("0.7.2", ampere)
    assert rt.autotune_bytes([tiny, tiny], {}, new) == rt.autotune_bytes([tiny, tiny], {})
    assert not rt.autotune_rules("0.10.2", ampere).picker
    assert not rt.autotune_rules("not a version", ampere).picker  # taken for the newest
    # the flags still rule: level 0 tunes nothing, level 3 guards nothing
    assert rt.autotune_bytes([tiny], {"XLA_FLAGS": "--xla_gpu_autotune_level=0"}, old) == 0
    assert rt.autotune_bytes([tiny], {"XLA_FLAGS": "--xla_gpu_autotune_level=3"}, old) == (
        dot + 64 * 4 + min(4 * MiB, dot)
    )
    assert "jaxlib 0.5.3" in mid.describe() and "next GEMM" in mid.describe()


def test_the_installed_jaxlibs_autotuner_guards_every_input_and_runs_cublaslt() -> None:
    """When the compile fuses as the target does (the same jaxlib, or both 0.9.2 or later),
    every input of a GEMM fusion is guarded (``kAllInputs``); from jaxlib 0.9.2 cuBLASLt is
    on by default and its candidate runs with a full workspace (4 MiB; 32 MiB on Hopper),
    unguarded, and each buffer counts as the BFC chunk it takes (measured on an H100 with
    jaxlib 0.11.2)."""
    gemm = rt.GemmBuffers
    three = gemm("fusion", (MiB,), (8 * MiB, MiB, 4096))
    same = rt.autotune_rules("0.10.2", (8, 9), installed="0.10.2")
    newer = rt.autotune_rules("0.11.2", (8, 9), installed="0.10.2")
    other = rt.autotune_rules("0.10.2", (8, 9), installed="0.7.2")
    assert same.all_inputs and newer.all_inputs and not other.all_inputs and same.lt_workspace
    assert same.whole_chunks and not rt.autotune_rules("0.7.2", (8, 9)).whole_chunks
    # (8 + 16) and (1 + 16) MiB guarded take 32 MiB chunks; the 1 MiB output and reference
    # fit the first 2 MiB region; 4 MiB + 1 KiB of workspace takes an 8 MiB region
    two_inputs = 32 * MiB + 32 * MiB + MiB + MiB + 8 * MiB
    assert rt.autotune_bytes([three], {}, other) == two_inputs
    assert rt.autotune_bytes([three], {}, same) == two_inputs + 32 * MiB  # 4 KiB + 16 MiB
    hopper = rt.autotune_rules("0.10.2", (9, 0), installed="0.10.2")
    # 32 MiB + 1 KiB of workspace takes a 64 MiB region
    assert rt.autotune_bytes([three], {}, hopper) - rt.autotune_bytes([three], {}, same) == (
        56 * MiB
    )
    # before 0.9.2 cuBLASLt was off; a cuBLAS call's outputs are unguarded from 0.7.2 on
    v091 = rt.autotune_rules("0.9.1", (8, 9), installed="0.9.1")
    assert not v091.lt_workspace
    guarded = (8 + 16) * MiB + (1 + 16) * MiB
    cublas = gemm("cublas", (MiB, 4 * MiB), (8 * MiB, MiB))
    assert rt.autotune_bytes([cublas], {}, v091) == guarded + 5 * MiB + MiB
    assert "every input" in same.describe() and "cuBLASLt" in same.describe()


def test_a_jaxlib_that_is_not_a_version_is_refused() -> None:
    for bad in ("banana", ""):
        with pytest.raises(ConfigError) as err:
            jax_xla().estimate_jax(_mlp_step(), *_args(8), jaxlib=bad)
        assert err.value.key_path == "jaxlib"
    with pytest.raises(ConfigError):
        jax_xla().estimate_jax_sweep(_mlp_step(), _args, [8], jaxlib="x.y")


@needs_extra
def test_a_small_step_for_an_older_jaxlib_shows_that_jaxlibs_floor() -> None:
    """A small MLP step: about 38 MiB with 0.7.2's autotuner, 80 MiB and more with 0.4.33's,
    about 129 MiB with 0.5.0's (the floors published for 0.4.33 and 0.5 runs: about 80 MiB
    and 129 MiB however small the program)."""
    step, args = _mlp_step(), _args(64)
    now = jax_xla().estimate_jax(step, *args, gpu="RTX 4090", environ={}, jaxlib="0.7.2")
    old = jax_xla().estimate_jax(step, *args, gpu="RTX 4090", environ={}, jaxlib="0.4.33")
    mid = jax_xla().estimate_jax(step, *args, gpu="RTX 4090", environ={}, jaxlib="0.5.0")
    assert now.peak_bytes_in_use is not None and old.peak_bytes_in_use is not None
    assert mid.peak_bytes_in_use is not None
    assert now.executable_peak_bytes == old.executable_peak_bytes  # the same compile
    assert now.peak_bytes_in_use < 40 * MiB
    assert 80 * MiB <= old.peak_bytes_in_use < 90 * MiB
    assert 128 * MiB <= mid.peak_bytes_in_use < 145 * MiB  # the published 0.5 floor: ~129
    assert any("jaxlib 0.4.33's XLA" in n for n in old.notes)
    assert any("jaxlib 0.4.33" in name for name, _, _ in old.breakdown)


def test_bfc_growth_doubles_its_regions() -> None:
    assert rt.bfc_growth_bytes([]) == 0
    assert rt.bfc_growth_bytes([100]) == 2 * MiB
    # 2 MiB, then 4 MiB; a 9 MiB request doubles the next region to 16 MiB
    assert rt.bfc_growth_bytes([MiB, 2 * MiB, 9 * MiB]) == (2 + 4 + 16) * MiB
    assert rt.bfc_growth_bytes([9 * MiB], limit=10 * MiB) == 10 * MiB


def test_the_rematerialization_verdict_is_read_from_xlas_log() -> None:
    log = (
        "W1126 hlo_rematerialization.cc:3231] Can't reduce memory use below 2.28GiB "
        "(2448288638 bytes) by rematerialization; only reduced to 12.00GiB (12890144804 "
        "bytes), down from 16.00GiB (17185112100 bytes) originally\n"
    )
    verdict = xla_gpu.parse_remat(log)
    assert verdict is not None and (verdict.limit_bytes, verdict.reduced_to_bytes) == (
        2448288638,
        12890144804,
    )
    assert verdict.original_bytes == 17185112100
    assert verdict.sentence().startswith("does not fit")
    assert xla_gpu.parse_remat("I0000 nothing to see\n") is None


def test_donated_arguments_are_read_from_the_exported_main() -> None:
    text = (
        "func.func public @main(%arg0: tensor<4xf32> {tf.aliasing_output = 0 : i32} loc(x), "
        "%arg1: tensor<4xf32> loc(y), %arg2: tensor<2xf32> {jax.buffer_donor = true}) -> "
        "(tensor<4xf32>) {"
    )
    assert xla_gpu._donated(text, [0, 2, 5]) == (0, 5)


# -- without the extra ------------------------------------------------------------------------


def test_without_the_extra_the_cpu_compile_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        xla_gpu, "gpu_target_missing", lambda: ["jax-cuda12-plugin is not installed"]
    )
    step = _mlp_step()
    est = jax_xla().estimate_jax(step, *_args(256), gpu="RTX 4070", environ={})
    assert est.compiled_for == "cpu" and est.peak_bytes_in_use is None
    assert any('pip install "memfit[gpu-target]"' in n for n in est.notes)
    with pytest.raises(BackendUnavailable, match="jax-cuda12-plugin") as info:
        jax_xla().estimate_jax(step, *_args(256), gpu="RTX 4070", compiler="gpu")
    assert "memfit[gpu-target]" in (info.value.hint or "")


def test_compiler_choices_are_checked() -> None:
    with pytest.raises(ConfigError, match="compiler"):
        jax_xla().estimate_jax(_mlp_step(), *_args(8), compiler="tpu")
    with pytest.raises(ConfigError, match="needs a card"):
        jax_xla().estimate_jax(_mlp_step(), *_args(8), compiler="gpu")


def jax_xla() -> Any:
    from memfit.estimate.xla import step as module

    return module


# -- compiled by XLA's GPU compiler, deviceless (CI: two cards) -------------------------------


@needs_extra
def test_a_step_compiles_for_an_ada_card_without_it() -> None:
    before = os.environ.get("JAX_PLATFORMS")
    est = jax_xla().estimate_jax(_mlp_step(), *_args(4096), gpu="RTX 4070", environ={})
    assert est.compiled_for == "cuda sm_89 (NVIDIA GeForce RTX 4070)"
    assert est.backend == "cuda" and est.fits is True
    assert est.alias_bytes == 3 * 512 * 512 * 4  # the donated parameters
    # the first call's autotuning is above the step's own buffers for a small step
    assert est.peak_bytes_in_use is not None
    assert est.peak_bytes_in_use > est.executable_peak_bytes
    names = [term[0] for term in est.breakdown]
    assert any("autotuning" in n for n in names) and "CUDA context" in names
    assert est.to_dict()["compiled_for"] == est.compiled_for
    # the caller's JAX platform is left alone (the child sets its own)
    assert os.environ.get("JAX_PLATFORMS") == before


@needs_extra
def test_a_turing_card_that_cannot_hold_the_step_says_does_not_fit() -> None:
    sweep = jax_xla().estimate_jax_sweep(
        _mlp_step(), lambda b: _args(b), [4096, 1_048_576], gpu="GTX 1650", environ={}
    )
    small, large = sweep.points
    assert small.compiled_for == large.compiled_for == "cuda sm_75 (NVIDIA GeForce GTX 1650)"
    assert small.fits is True and small.xla_memory_limit_bytes is None
    assert large.fits is False
    assert large.xla_memory_limit_bytes is not None and large.xla_reduced_to_bytes is not None
    assert large.xla_reduced_to_bytes > large.xla_memory_limit_bytes
    assert any(n.startswith("does not fit") for n in large.notes)


@needs_extra
def test_a_config_xla_cannot_use_is_an_error_not_a_crash() -> None:
    class NoWarp(TargetConfig):
        """A config without ``threads_per_warp``: XLA divides by it (SIGFPE)."""

        def text(self, **kwargs: Any) -> str:
            return super().text(**kwargs).replace("  threads_per_warp: 32\n", "")

    broken = NoWarp(**target_config(lookup_gpu("RTX 4070")).__dict__)
    step = xla_gpu.export_step(_mlp_step(), *_args(64))
    with pytest.raises(EstimateError, match=r"failed \(signal"):
        xla_gpu.compile_exported([step], broken)


@needs_extra
def test_the_plugin_leaves_jax_working_on_a_machine_without_a_gpu() -> None:
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    code = (
        "import jax, jax.numpy as jnp; print(jax.devices()[0].platform, float(jnp.ones(3).sum()))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["cpu", "3.0"]


# -- whole-loop trainers (PureJaxRL style) ----------------------------------------------------


def _make_train(num_updates: int, num_envs: int = 64, num_steps: int = 16) -> Any:
    """A PureJaxRL-shaped trainer: the whole run one jitted function, a scan over updates, each
    update collecting a rollout, shuffling a copy of it, and stacking its metrics."""

    def update(carry: Any, _: Any) -> Any:
        params, key = carry
        key, k_obs, k_perm = jax.random.split(key, 3)
        obs = jax.random.normal(k_obs, (num_steps * num_envs, 32))
        batch = obs[jax.random.permutation(k_perm, obs.shape[0])]  # the shuffled copy
        grad = jax.grad(lambda p: jnp.mean(jnp.tanh(batch @ p) ** 2))(params)
        metric = jnp.mean(jnp.tanh(obs @ params), axis=1)[:num_envs]  # one per env, per update
        return (params - 1e-3 * grad, key), metric

    def train(params: Any, key: Any) -> Any:
        (params, _), metrics = jax.lax.scan(update, (params, key), None, length=num_updates)
        return params, metrics

    return jax.jit(train)


def test_a_whole_loop_trainer_counts_its_stacked_metrics() -> None:
    params = jax.ShapeDtypeStruct((32, 32), jnp.float32)
    key = jax.ShapeDtypeStruct((2,), jnp.uint32)
    short = jax_xla().estimate_jax(_make_train(10), params, key, compiler="cpu")
    long = jax_xla().estimate_jax(_make_train(20), params, key, compiler="cpu")
    # ten more updates stack ten more (num_envs,) float32 metrics in the run's output
    assert long.output_bytes - short.output_bytes == 10 * 64 * 4
    # the rollout and its shuffled copy are both in the temporaries
    assert short.temp_bytes >= 2 * 16 * 64 * 32 * 4


@needs_extra
def test_a_step_sharded_over_two_devices_is_compiled_per_device() -> None:
    """A data-parallel step (batch sharded over an abstract mesh of two devices, gradients
    all-reduced): the compile-only topology has two devices and every figure is per device."""
    from jax.sharding import AbstractMesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    def step(w: Any, x: Any) -> Any:
        return w - 0.1 * jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)

    mesh = AbstractMesh((2,), ("data",))
    w = jax.ShapeDtypeStruct((512, 512), jnp.float32, sharding=NamedSharding(mesh, P()))
    x = jax.ShapeDtypeStruct((4096, 512), jnp.float32, sharding=NamedSharding(mesh, P("data")))
    plain = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (w, x)]
    one = jax_xla().estimate_jax(jax.jit(step), *plain, gpu="RTX 4070")
    two = jax_xla().estimate_jax(jax.jit(step), w, x, gpu="RTX 4070")
    # half the batch per device: x's shard is 4 MiB of 8 MiB, w (1 MiB) replicated
    assert one.argument_bytes == 9 * MiB and two.argument_bytes == 5 * MiB
    assert any("compiled for 2 devices" in n for n in two.notes)
    assert any("all-reduce" in n for n in two.notes)
    assert any(name.startswith("device 1 holds less") for name, _, _ in two.breakdown)
    assert not any("compiled for 2 devices" in n for n in one.notes)


def test_the_cublas_variant_follows_the_autotuners_flags() -> None:
    may = xla_gpu.cublas_may_replace_triton
    assert may({}) and may({"XLA_FLAGS": "--xla_gpu_autotune_level=4"})
    for flags in (
        "--xla_gpu_enable_triton_gemm=false",  # every GEMM is cuBLAS already
        "--xla_gpu_cublas_fallback=false",  # cuBLAS is not a candidate
        "--xla_gpu_autotune_level=0",  # default tilings, as the deviceless compile
    ):
        assert not may({"XLA_FLAGS": f"--xla_gpu_redzone_padding_bytes=8 {flags}"}), flags


@needs_extra
def test_a_gemm_fusion_is_also_compiled_as_the_cublas_call_the_autotuner_may_pick() -> None:
    """On a device the autotuner may hand any Triton GEMM fusion to cuBLAS; its fused operands
    then become buffers and the call gets a workspace. The estimate counts the larger of the
    two compiles; the variant is the one XLA compiles when told by ``XLA_FLAGS``."""
    step = xla_gpu.export_step(_mlp_step(), *_args(4096))
    target = target_config(lookup_gpu("RTX 4070"))
    (both,) = xla_gpu.compile_exported([step], target, environ={})
    (cublas,) = xla_gpu.compile_exported(
        [step], target, environ={"XLA_FLAGS": "--xla_gpu_enable_triton_gemm=false"}
    )
    assert any(g.kind == "fusion" for g in both.gemm_buffers)
    assert cublas.cublas_temp_bytes is None  # told: no second compile
    assert both.cublas_temp_bytes == cublas.temp_bytes
    # more at its peak: the fused operands materialised and cuBLAS's workspace
    assert cublas.temp_bytes > both.temp_bytes
    assert both.device_temp_bytes == cublas.temp_bytes

    est = jax_xla().estimate_jax(_mlp_step(), *_args(4096), gpu="RTX 4070", environ={})
    terms = {name: size for name, size, _ in est.breakdown}
    extra = next(size for name, size in terms.items() if "hand to cuBLAS" in name)
    assert extra == cublas.temp_bytes - both.temp_bytes
    assert est.temp_bytes == cublas.temp_bytes
    assert any("Triton or cuBLAS" in n for n in est.notes)


def test_a_cublas_variant_that_fails_leaves_the_compile_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The second compile is optional: when XLA rejects it, the child reports why and the
    parent keeps the step's own figures, with a warning (a fault injected in the child's
    reply; nothing is compiled)."""
    reply = {
        "ok": True, "argument": 100, "output": 50, "alias": 0, "temp": 1000, "code": 0,
        "gemms": [{"kind": "fusion", "results": [64], "operands": [32, 32]}],
        "collectives": [], "seconds": 0.1, "cublas_error": "XlaRuntimeError: no cuBLAS",
    }  # fmt: skip
    seen: dict[str, Any] = {}

    def fake_run(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        import json

        with open(command[-1], encoding="utf-8") as f:
            seen.update(json.load(f))
        stdout = json.dumps(reply) + "\n"
        return subprocess.CompletedProcess(command, 0, stdout=stdout, stderr="")

    monkeypatch.setattr(xla_gpu, "gpu_target_missing", lambda: [])
    monkeypatch.setattr(xla_gpu.subprocess, "run", fake_run)
    step = xla_gpu.ExportedStep(serialized=b"not compiled here")
    (result,) = xla_gpu.compile_exported([step], target_config(lookup_gpu("RTX 4070")), environ={})
    assert seen["jobs"][0]["cublas_variant"] is True  # asked for
    assert result.temp_bytes == result.device_temp_bytes == 1000
    assert result.cublas_temp_bytes is None
    assert any("did not compile" in w and "no cuBLAS" in w for w in result.warnings)
    # told not to: the request says so
    xla_gpu.compile_exported(
        [step],
        target_config(lookup_gpu("RTX 4070")),
        environ={"XLA_FLAGS": "--xla_gpu_cublas_fallback=false"},
    )
    assert seen["jobs"][0]["cublas_variant"] is False
