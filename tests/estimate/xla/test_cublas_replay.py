"""The single-pass autotuner's cuBLAS calls, replayed through the BFC allocator (issue 41).

XLA's autotuner (``backends/autotuner/autotuner.cc``) keeps the reference candidate's whole
output while it runs the others; a cuBLAS call tuned alone in a module outputs its result and
its workspace, so the reference holds a workspace besides each candidate's. Under a growing
pool (preallocation off) where the buffers land depends on the regions the earlier ones grew:
:func:`memfit.estimate.xla.runtime.cublas_replay_bytes` places them. The H100 figures are
``tests/data/gpu_truth/jax_measured/`` (jaxlib 0.11.2, ``bench/xla_floor_probe.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memfit.estimate.xla import runtime as rt
from memfit.units import MiB

LT = rt.autotune_rules("0.11.2", (9, 0), installed="0.11.2")  # the H100 run's autotuner
DATA = Path(__file__).resolve().parents[2] / "data" / "gpu_truth" / "jax_measured"
PROBE = json.loads((DATA / "h100_jaxlib0.11.2_floor_probe.json").read_text(encoding="utf-8"))


def mlp_cublas_calls(batch: int, width: int) -> list[rt.GemmBuffers]:
    """The cuBLAS calls of the probe's MLP step with ``xla_gpu_enable_triton_gemm=false``, as
    the deviceless compile lists them (each with its 4 MiB deviceless workspace): the forward
    and input-gradient GEMMs (activations x weight -> activations) and the weight gradient
    (activations x activations -> weight)."""
    x, w = batch * width * 4, width * width * 4
    ws = 4 * MiB
    return [
        rt.GemmBuffers("cublas", (x, ws), (x, w)),
        rt.GemmBuffers("cublas", (x, ws), (x, w)),
        rt.GemmBuffers("cublas", (w, ws), (x, x)),
    ]


def arguments(batch: int, width: int, depth: int) -> list[int]:
    return [width * width * 4] * depth + [batch * width * 4]


def measured_compile_peak(step: str, variant: str) -> tuple[int, int]:
    """The probe's ``peak_bytes_in_use`` and pool after the compile (before any step)."""
    row = next(r for r in PROBE["rows"] if (r["step"], r["variant"]) == (step, variant))
    return row["after_compile"]["peak_bytes_in_use"], row["after_compile"]["pool_bytes"]


def test_the_reference_holds_a_workspace_besides_each_candidates() -> None:
    x, w = 128 * MiB, MiB
    gemm = rt.GemmBuffers("cublas", (x, 4 * MiB), (x, w))
    args = [w, w, w, x]
    checked = rt.cublas_replay_bytes([gemm], args, rt.REDZONE_BYTES, True, LT)
    unchecked = rt.cublas_replay_bytes([gemm], args, 0, False, LT)
    # checked: guarded inputs (a whole 256 MiB and 32 MiB chunk), the reference's result and
    # workspace, the candidate's result and workspace
    assert checked // MiB == 704  # and the two workspaces' 1 KiB each
    # no correctness check: no guard zones, no reference, one candidate's output at a time
    assert unchecked < checked - 128 * MiB


def test_fusions_are_not_replayed_and_freed_chunks_are_reused() -> None:
    fusion = rt.GemmBuffers("fusion", (8 * MiB,), (8 * MiB, MiB))
    assert rt.cublas_replay_bytes([fusion], [MiB], rt.REDZONE_BYTES, True, LT) == 0
    calls = mlp_cublas_calls(16384, 512)
    once = rt.cublas_replay_bytes(calls[:1], arguments(16384, 512, 3), rt.REDZONE_BYTES, True, LT)
    twice = rt.cublas_replay_bytes(
        calls[:1] * 2, arguments(16384, 512, 3), rt.REDZONE_BYTES, True, LT
    )
    assert twice == once  # the second call's buffers land in the chunks the first freed


def test_autotune_bytes_replays_cublas_calls_after_the_arguments() -> None:
    calls = mlp_cublas_calls(65536, 512)
    args = arguments(65536, 512, 3)
    replayed = rt.autotune_bytes(calls, {}, LT, args)
    assert replayed == rt.cublas_replay_bytes(calls, args, rt.REDZONE_BYTES, True, LT)
    # each buffer counted as a fresh chunk (no arguments given): the reference's workspace
    # chunk (32 MiB and 1 KiB: a whole 64 MiB) is counted besides the candidate's
    counted = rt.autotune_bytes(calls, {}, LT)
    assert counted == 256 * MiB + 32 * MiB + 2 * (128 * MiB + 64 * MiB)
    # a fusion beside them is counted as before; the larger of the two is the term
    fusion = rt.GemmBuffers("fusion", (MiB,), (MiB, MiB))
    assert rt.autotune_bytes([*calls, fusion], {}, LT, args) == replayed
    assert rt.autotune_bytes([fusion], {}, LT, args) == rt.autotune_bytes([fusion], {}, LT)
    assert rt.autotune_bytes(calls, {"XLA_FLAGS": "--xla_gpu_autotune_level=0"}, LT, args) == 0


def test_a_picker_era_jaxlib_is_not_replayed() -> None:
    old = rt.autotune_rules("0.4.33", (9, 0))
    calls = mlp_cublas_calls(4096, 512)
    args = arguments(4096, 512, 3)
    assert rt.autotune_bytes(calls, {}, old, args) == rt.autotune_bytes(calls, {}, old)


@pytest.mark.parametrize(("batch", "width"), [(65536, 512), (16384, 512)])
def test_the_h100_cublas_steps_compile_peak_and_pool_as_replayed(batch: int, width: int) -> None:
    """Every GEMM through cuBLAS (``xla_gpu_enable_triton_gemm=false``), jaxlib 0.11.2: the
    compile's peak and the regions the allocator grew, from the source's order of buffers.
    The probe's process held 1 MiB besides the arguments before the compile."""
    peak, pool = measured_compile_peak(f"mlp:{batch}:{width}:3", "triton_gemm=false")
    args = arguments(batch, width, 3)
    before = sum(args) + MiB
    predicted = before + rt.cublas_replay_bytes(
        mlp_cublas_calls(batch, width), args, rt.REDZONE_BYTES, True, LT
    )
    assert abs(predicted - peak) <= MiB
    # the replay's allocator grows the regions the card grew (1,158 MiB; 294 MiB)
    replayed = rt.replay_cublas_tuning(
        mlp_cublas_calls(batch, width), args, rt.REDZONE_BYTES, True, LT
    )
    assert replayed.pool_bytes == pool


def test_small_cublas_steps_are_over_not_under() -> None:
    """The two small cuBLAS steps peak one candidate workspace below the replay (their pools
    grew the region it takes, their peak did not count it): memfit is over there, never
    under."""
    for batch, width, depth in ((64, 64, 2), (4096, 512, 3)):
        peak, pool = measured_compile_peak(f"mlp:{batch}:{width}:{depth}", "triton_gemm=false")
        args = arguments(batch, width, depth)
        calls = mlp_cublas_calls(batch, width)
        predicted = sum(args) + rt.cublas_replay_bytes(calls, args, rt.REDZONE_BYTES, True, LT)
        assert peak <= predicted + MiB
        assert predicted - peak <= rt.HOPPER_WORKSPACE + MiB
        # the allocator grew the regions the replay grows (258 MiB, 270 MiB)
        assert rt.replay_cublas_tuning(calls, args, rt.REDZONE_BYTES, True, LT).pool_bytes == pool


def test_fusions_handed_to_cublas_are_tuned_again_as_calls() -> None:
    """Triton on (``--xla_gpu_force_compilation_parallelism=1``), jaxlib 0.11.2: the
    autotuner handed the 65536:512:3 step's GEMM fusions to cuBLAS (its program after the
    step is the cuBLAS-only one) and the compile peaked as the cuBLAS-only compile's: the
    calls the fusions became, tuned again, replayed after the arguments. With default flags
    Triton won and the fusions' own tuning (counted) is what the card shows."""
    batch, width = 65536, 512
    args = arguments(batch, width, 3)
    calls = mlp_cublas_calls(batch, width)
    peak, pool = measured_compile_peak(f"mlp:{batch}:{width}:3", "compile_parallelism=1")
    handed = rt.handed_to_cublas_bytes(calls, {}, LT, args)
    assert abs(sum(args) + MiB + handed - peak) <= MiB
    assert rt.replay_cublas_tuning(calls, args, rt.REDZONE_BYTES, True, LT).pool_bytes == pool
    # the fusions' own tuning: inputs guarded, the reference (the cuBLAS fission's result
    # alone), a candidate's result and the cuBLASLt workspace's whole chunk
    fusions = [
        rt.GemmBuffers("fusion", (128 * MiB,), (128 * MiB, MiB)),
        rt.GemmBuffers("fusion", (8 * MiB,), (128 * MiB, 128 * MiB)),
    ]
    counted = rt.autotune_bytes(fusions, {}, LT, args)
    default_peak, _ = measured_compile_peak(f"mlp:{batch}:{width}:3", "default")
    # over by at most the weight's guarded chunk (32 MiB counted whole, 17 MiB split there)
    assert 0 <= sum(args) + MiB + counted - default_peak <= 16 * MiB
    assert handed > counted  # memfit takes the larger: which candidate wins is timed


def test_only_the_single_pass_autotuner_tunes_handed_fusions_again() -> None:
    calls = mlp_cublas_calls(65536, 512)
    args = arguments(65536, 512, 3)
    assert rt.handed_to_cublas_bytes(calls, {}, rt.autotune_rules("0.4.33", (9, 0)), args) == 0
    assert rt.handed_to_cublas_bytes(calls, {}, rt.autotune_rules("0.7.2", (9, 0)), args) == 0
    assert rt.handed_to_cublas_bytes([], {}, LT, args) == 0
    off = {"XLA_FLAGS": "--xla_gpu_autotune_level=0"}
    assert rt.handed_to_cublas_bytes(calls, off, LT, args) == 0
    # calls smaller than the workspace: the fusions' own tuning is counted (the replay is
    # over there by a workspace), so nothing is added
    assert rt.handed_to_cublas_bytes(mlp_cublas_calls(64, 64), {}, LT, arguments(64, 64, 2)) == 0
    # fusions among the calls are not the handed calls
    fusion = rt.GemmBuffers("fusion", (MiB,), (MiB, MiB))
    assert rt.handed_to_cublas_bytes([fusion], {}, LT, args) == 0
