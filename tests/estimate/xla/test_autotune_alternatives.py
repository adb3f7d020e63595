"""A compiled figure's two alternatives and its band (issue 41).

XLA's autotuner picks Triton or cuBLAS for each GEMM fusion by timing on the card; where the
choice moves the peak, memfit computes both figures: every tunable fusion kept Triton (the
Triton compile's temporaries, the fusions' own tuning) and cuBLAS winning them (the cuBLAS
variant's temporaries, the calls it becomes tuned again). The figure stays the cuBLAS-wins
one (never under); :meth:`JaxEstimate.band` spans both, widened by the residual band
``compiled/alternatives/<family>``. These tests build the compile's result by hand (no
child compile): the H100's 65536:512:3 MLP step as ``tests/estimate/xla/
test_cublas_replay.py`` describes its GEMMs.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from memfit.core import bands
from memfit.core.bands import Band, BandTable
from memfit.estimate.xla import runtime as rt
from memfit.estimate.xla.gpu import GpuCompile
from memfit.estimate.xla.step import JaxEstimate, _from_gpu_compile
from memfit.hardware.catalog import gpu
from memfit.hardware.xla_target import target_config
from memfit.units import MiB

H100 = gpu("NVIDIA H100 80GB HBM3")
TARGET = target_config(H100)
ENV = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}


def mlp_compile(batch: int, width: int, *, cublas_variant: bool) -> tuple[GpuCompile, list[int]]:
    """The probe's 3-layer MLP step as XLA's GPU compile gives it: three GEMM fusions per
    layer pass (Triton's default tilings), and, where cuBLAS may replace Triton, the cuBLAS
    variant's calls and its larger temporaries (the fused operands as buffers)."""
    x, w = batch * width * 4, width * width * 4
    fusions = tuple(
        g
        for _ in range(3)
        for g in (
            rt.GemmBuffers("fusion", (x,), (x, w)),
            rt.GemmBuffers("fusion", (w,), (x, x)),
        )
    )
    calls = tuple(
        g
        for _ in range(3)
        for g in (
            rt.GemmBuffers("cublas", (x, 4 * MiB), (x, w)),
            rt.GemmBuffers("cublas", (w, 4 * MiB), (x, x)),
        )
    )
    temp = 4 * x
    result = GpuCompile(
        argument_bytes=3 * w + x, output_bytes=3 * w, alias_bytes=3 * w, temp_bytes=temp,
        generated_code_bytes=0, compiled_for=TARGET.compiled_for,
        memory_base_bytes=TARGET.device_memory_size, gemm_buffers=fusions,
        cublas_temp_bytes=temp + 32 * MiB if cublas_variant else None,
        cublas_gemm_buffers=calls if cublas_variant else (),
    )  # fmt: skip
    return result, [w, w, w, x]


def estimate(batch: int, width: int, *, cublas_variant: bool) -> JaxEstimate:
    result, leaves = mlp_compile(batch, width, cublas_variant=cublas_variant)
    return _from_gpu_compile(result, H100, TARGET, leaves, ENV, None, "0.11.2")


def test_a_program_whose_fusions_cublas_may_win_has_two_figures() -> None:
    est = estimate(65536, 512, cublas_variant=True)
    ends = {name: (low, high) for name, low, high in est.alternatives}
    low, high = ends["peak_bytes_in_use"]
    assert high == est.peak_bytes_in_use  # the figure is the cuBLAS-wins one: never under
    assert low < high
    assert ends["temp_bytes"] == (est.temp_bytes - 32 * MiB, est.temp_bytes)
    assert est.alternatives_family == "other"  # its GEMMs' operands reach the workspace
    assert any("if Triton wins every one" in n for n in est.notes)


def test_a_program_without_the_choice_has_one() -> None:
    """Triton's GEMMs off (``xla_gpu_enable_triton_gemm=false``: no cuBLAS variant is
    compiled), or no GEMM fusion: nothing for the autotuner to choose."""
    est = estimate(65536, 512, cublas_variant=False)
    assert est.alternatives == ()
    both = estimate(65536, 512, cublas_variant=True)
    assert est.peak_bytes_in_use is not None and both.peak_bytes_in_use is not None
    # the Triton-wins figure of the ambiguous program is the one-choice program's figure
    ends = {name: (low, high) for name, low, high in both.alternatives}
    assert ends["peak_bytes_in_use"][0] == est.peak_bytes_in_use


def test_a_small_program_whose_tuning_sets_the_peak_is_its_own_family() -> None:
    assert estimate(64, 64, cublas_variant=False).alternatives_family == "small_tuning"
    # autotuning off: the step's buffers set the peak
    result, leaves = mlp_compile(64, 64, cublas_variant=False)
    off = {**ENV, "XLA_FLAGS": "--xla_gpu_autotune_level=0"}
    tuned_off = _from_gpu_compile(result, H100, TARGET, leaves, off, None, "0.11.2")
    assert tuned_off.alternatives_family == "other"


def test_the_band_spans_both_alternatives(monkeypatch: pytest.MonkeyPatch) -> None:
    table = BandTable(
        {
            "compiled": Band(-0.2, 0.05, 10),
            "compiled/alternatives": Band(-0.1, 0.02, 10),
            "compiled/alternatives/other": Band(-0.02, 0.01, 5),
            "compiled/alternatives/small_tuning": Band(-0.15, 0.01, 5),
            "compiled/conv": Band(-0.3, 0.3, 0),
        }
    )
    monkeypatch.setattr(bands, "load_bands", lambda: table)
    est = estimate(65536, 512, cublas_variant=True)
    ends = {name: (low, high) for name, low, high in est.alternatives}
    low, high = ends["peak_bytes_in_use"]
    assert est.band("peak_bytes_in_use") == (int(low * 0.98), -(-high * 101 // 100))
    # a figure the choice does not move: the residual band around it alone
    residual = table.interval(est.argument_bytes, "compiled", "alternatives/other")
    assert est.band("argument_bytes") == residual
    # without a choice the band is the residual band's width only: narrower
    one = estimate(65536, 512, cublas_variant=False)
    lo1, hi1 = one.band("peak_bytes_in_use")
    lo2, hi2 = est.band("peak_bytes_in_use")
    assert hi1 - lo1 < hi2 - lo2
    # a program class keeps its own band (cuDNN's, CUB's scratch): not the alternatives'
    conv = replace(est, program="conv")
    own = table.interval(est.peak_bytes_in_use or 0, "compiled", "conv")
    assert conv.band("peak_bytes_in_use") == own
    # an estimate that does not know its alternatives (a CPU compile) takes the compiled band
    plain = replace(est, alternatives=(), alternatives_family=None)
    assert plain.band("argument_bytes") == table.interval(est.argument_bytes, "compiled")
    for name in ("temp_bytes", "executable_peak_bytes", "peak_bytes_in_use", "device_used_bytes"):
        lo, hi = est.band(name)
        assert lo <= getattr(est, name) <= hi


def test_several_cards_shift_both_device_figures() -> None:
    """``gpu="8xH100"``: the collective terms every card holds are added to
    ``device_used_bytes`` whichever alternative wins."""
    from memfit.estimate._devices import collectives
    from memfit.estimate.xla.step import _with_collectives

    est = estimate(65536, 512, cublas_variant=True)
    used = est.device_used_bytes or 0
    est = replace(est, alternatives=(*est.alternatives, ("device_used_bytes", used - MiB, used)))
    several = collectives("8xH100", framework="jax", jaxlib="0.11.2")
    assert several is not None and several.every_device_bytes > 0
    more = several.every_device_bytes
    shifted = _with_collectives(est, several)
    ends = {name: (low, high) for name, low, high in shifted.alternatives}
    assert ends["device_used_bytes"] == (used - MiB + more, used + more)
    assert shifted.device_used_bytes == used + more
