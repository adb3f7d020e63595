"""JAX on a real H100 (jaxlib 0.11.2), predicted deviceless (issue 30).

``tests/data/gpu_truth/jax_measured/`` holds what a lent H100 measured on 2026-11-26
(``bench/xla_floor_probe.py``: a jitted MLP SGD step in a fresh process per XLA flag variant,
``memory_stats()["peak_bytes_in_use"]`` after the compile and one step). memfit compiles the
same step with XLA's GPU compiler for the H100 here, without the card, and adds the runtime's
terms for jaxlib 0.11.2: the first call's autotuning (every GEMM fusion's inputs with guard
zones, its output and the reference, a cuBLASLt candidate's 32 MiB workspace, each buffer the
BFC chunk it takes), the 32 MiB workspace the device keeps where cuBLASLt wins, and the BFC
chunks a fresh region hands out whole.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from xla_probe_step import mlp_step

from memfit.estimate.xla import gpu as xla_gpu
from memfit.units import MiB

pytestmark = pytest.mark.skipif(
    bool(xla_gpu.gpu_target_missing()), reason="the gpu-target extra is not installed"
)

DATA = Path(__file__).resolve().parents[2] / "data" / "gpu_truth" / "jax_measured"
PROBE = json.loads((DATA / "h100_jaxlib0.11.2_floor_probe.json").read_text(encoding="utf-8"))
#: Every flag variant of the tiny step (the floor), the default of the two larger ones (the
#: autotuner's chunks, the temporaries' whole region), the large step with every GEMM through
#: cuBLAS (the reference's workspace, issue 41), and with Triton on where the autotuner handed
#: its GEMM fusions to cuBLAS and tuned them again as calls; docs/benchmarks.md has all 20 rows.
CHOSEN = {
    ("mlp:64:64:2", "default"),
    ("mlp:64:64:2", "redzone_padding=0"),
    ("mlp:64:64:2", "autotune_level=0"),
    ("mlp:64:64:2", "triton_gemm=false"),
    ("mlp:16384:512:3", "default"),
    ("mlp:4096:1024:6", "default"),
    ("mlp:65536:512:3", "triton_gemm=false"),
    ("mlp:65536:512:3", "compile_parallelism=1"),
}
#: The large step's compiles that tuned cuBLAS calls (every GEMM through cuBLAS; Triton on and
#: the fusions handed to cuBLAS): within 1% (issue 41's replay of the calls).
WITHIN_ONE_PERCENT = {
    ("mlp:65536:512:3", "triton_gemm=false"),
    ("mlp:65536:512:3", "compile_parallelism=1"),
}
CASES = [
    (row["step"], row["variant"], row["xla_flags"], row["after_step"]["peak_bytes_in_use"])
    for row in PROBE["rows"]
    if (row["step"], row["variant"]) in CHOSEN
]


def test_the_probe_holds_what_the_tests_read() -> None:
    assert PROBE["device"] == "NVIDIA H100 80GB HBM3" and PROBE["jax"] == "0.11.2"
    assert len(CASES) == len(CHOSEN)


@pytest.mark.parametrize(
    ("step", "variant", "flags", "measured"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES]
)
def test_peak_bytes_in_use_on_the_h100_within_twelve_percent_or_a_workspace_over(
    step: str, variant: str, flags: str, measured: int
) -> None:
    """Within 12%; a small cuBLAS-only step may be over by one more: the candidate workspace
    the replay of the cuBLAS calls places and the card's peak did not count
    (tests/estimate/xla/test_cublas_replay.py). Never under by more than 12%."""
    from memfit.estimate.xla.runtime import HOPPER_WORKSPACE
    from memfit.estimate.xla.step import estimate_jax

    _, batch, width, depth = step.split(":")
    fn, shapes = mlp_step(int(batch), int(width), int(depth))  # the probe's own step
    est = estimate_jax(
        fn,
        *shapes,
        gpu=PROBE["device"],
        jaxlib=PROBE["jax"],
        # as the probe ran: preallocation off (its `captured` line), the variant's flags
        environ={"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "XLA_FLAGS": flags},
    )
    assert est.peak_bytes_in_use is not None
    error = (est.peak_bytes_in_use - measured) / measured
    assert error >= -0.12, f"{step} {variant}: {error:+.1%}"
    over = est.peak_bytes_in_use - measured
    assert error <= 0.12 or over <= HOPPER_WORKSPACE + MiB, f"{step} {variant}: {error:+.1%}"
    if (step, variant) in WITHIN_ONE_PERCENT:
        assert abs(error) <= 0.01, f"{step} {variant}: {error:+.1%}"
