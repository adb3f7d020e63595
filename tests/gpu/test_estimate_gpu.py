"""Oracle tests on a CUDA GPU: the fake-tensor trace against torch.cuda's own peak counters.

Skipped without CUDA (tests/conftest.py marks everything here ``gpu``). Each real run happens
in a fresh subprocess so cuBLAS handles and cached blocks of one run do not leak into the next.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ACCURACY = ROOT / "bench" / "accuracy.py"

# Measured on an H100 (torch 2.11, 2026-11-22, docs/benchmarks.md): the trace under-predicts
# dqn_cnn_84's allocated peak by 8% (scratch memory taken inside cuDNN/cuBLAS calls, which a
# dispatcher-level trace cannot see, is the likely cause) and the reserved peak of bn_convnet
# and resnet18_224 by 13-18% (the allocator replay holds fewer segments than torch 2.11's
# allocator does). Known gaps, not modelled yet: these cases are expected to fail until they
# are (strict, so a fix shows up as an XPASS failure).
_CUDA_GAP = pytest.mark.xfail(
    strict=True, reason="in-op scratch memory and reserved segments under-predicted on CUDA"
)
CASES = [
    ("ppo_mlp_small", 4096),
    pytest.param("dqn_cnn_84", 128, marks=_CUDA_GAP),
    pytest.param("bn_convnet", 128, marks=_CUDA_GAP),
    ("checkpointed_mlp", 1024),
    ("gpt_small", 8),
    pytest.param("resnet18_224", 32, marks=_CUDA_GAP),
]


def _real(kind: str, name: str, batch: int) -> dict[str, int]:
    proc = subprocess.run(
        [sys.executable, str(ACCURACY), "--child", kind, name, str(batch)],
        capture_output=True,
        text=True,
        check=True,
    )
    data: dict[str, int] = json.loads(proc.stdout.strip().splitlines()[-1])
    return data


def _workloads():  # type: ignore[no-untyped-def]
    import accuracy_workloads

    return accuracy_workloads


@pytest.mark.parametrize(("name", "batch"), CASES)
def test_allocated_and_reserved_peaks_match_cuda(name: str, batch: int) -> None:
    from memfit.estimate.torch.trace import estimate_torch

    factory, _ = _workloads().TORCH_WORKLOADS[name]
    step = factory()
    est = estimate_torch(step.build, step.step, step.make_batch, [batch])
    assert est.device == "cuda"
    point = est.points[0]
    real = _real("torch", name, batch)
    assert point.allocated_peak == pytest.approx(real["max_allocated"], rel=0.08)
    assert point.reserved_peak == pytest.approx(real["max_reserved"], rel=0.10)


@pytest.mark.xfail(
    strict=True,
    reason="on an H100 (jax 0.11.2) peak_bytes_in_use is the executable's peak plus about "
    "141 MiB the GPU runtime takes at the first run (autotuning and library workspace), "
    "which XLA's memory analysis does not count; not modelled yet",
)
def test_jax_compiled_peak_matches_peak_bytes_in_use() -> None:
    from memfit.estimate.xla.step import estimate_jax

    factory, sizes = _workloads().JAX_WORKLOADS["jax_ppo_update"]
    step = factory()
    est = estimate_jax(step.fn, *step.make_args(sizes[1]))
    real = _real("jax", "jax_ppo_update", sizes[1])
    assert est.executable_peak_bytes == pytest.approx(real["peak_bytes_in_use"], rel=0.10)


def test_gpu_truth_capture_on_cuda_tags_ops_and_its_trace_replays() -> None:
    """bench/gpu_truth.py's capture on a real GPU, in a fresh process: the allocator trace
    has the ops on its allocations, its segment events add up to max_memory_reserved, and
    the allocator model replays it to the same reserved peak (within 1%)."""
    import tempfile

    from truth_corpus import Trace, replay

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "child.json"
        subprocess.run(
            [
                sys.executable,
                str(ROOT / "bench" / "gpu_truth.py"),
                "--child",
                "torch",
                "ppo_mlp_small",
                "1024",
                "1",
                str(out),
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        got = json.loads(out.read_text())
    assert not got["dropped"]
    trace = Trace.from_json(got["trace"])
    ops = {e.op for e in trace.events() if e.action == "alloc"}
    assert any(op and ("mm" in op or "addmm" in op) for op in ops), ops
    result = replay(trace)
    assert result.real_reserved_peak == got["max_reserved"]
    assert result.model_reserved_peak == pytest.approx(result.real_reserved_peak, rel=0.01)
