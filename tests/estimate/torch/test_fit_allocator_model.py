"""``memfit.fit`` on CUDA, rehearsed on the CPU with the allocator model as the GPU.

On a real GPU a probe's reserved memory is a step function of the batch (20 MiB segments,
cached blocks given back at the cap), and the H100 run showed the affine line through
reserved peaks stopping at 64% of the maximum. Here the "GPU" is the caching allocator model
replaying a step's allocations under the same cap ``set_per_process_memory_fraction`` puts
on the real allocator, with what a fake-tensor trace does not see on a real GPU added on
purpose (``bench/fit_search.py --replayed`` runs every case and writes the table).
``memfit.fit`` runs unchanged against it (its CUDA meter replaced by one that replays), with
a prior traced on the CPU. Goal (issue 12, section 3): at least 97% of the true maximum in
at most 3 probes, never above it; the real figure waits for a GPU (``--cuda``).
"""

from __future__ import annotations

import itertools
from types import ModuleType

import pytest

MiB = 2**20


def _fit_bench() -> ModuleType:
    import fit_replay

    return fit_replay


# Since the trace counts cuBLASLt's own 1 MiB workspace, kept from the first ``addmm``
# (torch 2.9 on; CublasHandlePool.cpp, seen in the H100 corpus), the replayed reserved peak
# is not monotone in the batch: a block crossing the 1 MiB line leaves the small pool's 2 MiB
# segments (mlp-adam at an 88 MiB cap: 2803-3928 do not fit, 3978-4678 do). Real caching
# allocators are so; the fit copes (``island_probe``, failures below a fitting probe left
# out, ``SequenceModel.largest_fitting`` looking above its first failure). The budget is the
# one at which ``at`` just keeps the margin, rounded up (``bench/fit_search.py``).


def _marks(name: str, at: int, margin: float) -> list[pytest.MarkDecorator]:
    # the transformer's traces take most of the time: run by the slow suite
    marks = [pytest.mark.slow] if name == "transformer-adamw" else []
    return marks


CASES = [
    pytest.param(name, at, margin, marks=_marks(name, at, margin))
    for name in ("mlp-adam", "cnn-bn-sgd", "transformer-adamw")
    for at in (2304, 6144)
    for margin in (0.0, 0.05)
]


@pytest.mark.parametrize(
    ("name", "at", "margin"),
    CASES,
    ids=[f"{c.values[0]}@{c.values[1]}-{c.values[2]}" for c in CASES],
)
def test_fit_on_a_replayed_cuda_allocator_gets_close_and_never_above(
    name: str, at: int, margin: float
) -> None:
    bench = _fit_bench()
    workload = next(w for w in bench.WORKLOADS if w.name == name)
    row = bench.replayed_case(workload, "mild", at, margin)
    assert row["true_max"] > 0
    assert row["value"] <= row["true_max"], row
    assert row["fraction"] >= 0.97, row
    assert row["probes"] <= 6, row


def test_the_allocator_model_leads_fit_closer_than_a_line_through_reserved_peaks() -> None:
    """The H100 failure, reproduced on the replayed allocator: the reserved-peak line stops
    short where the allocated line with the model's aim gets there."""
    bench = _fit_bench()
    workload = next(w for w in bench.WORKLOADS if w.name == "mlp-adam")
    rows = [bench.replayed_case(workload, "mild", at, 0.0) for at in (768, 2304)]
    for row in rows:
        assert row["fraction"] >= 0.97, row
        assert row["probes"] <= 3, row
    assert min(r["reserved_line_fraction"] for r in rows) < 0.9, rows


def test_reserved_memory_is_a_step_function_and_allocated_a_line() -> None:
    from memfit.estimate.torch.trace import estimate_torch

    bench = _fit_bench()
    step = next(w for w in bench.WORKLOADS if w.name == "mlp-adam").step
    base = estimate_torch(
        step.build, step.step, step.make_batch, [1024, 4096], kernel_scratch=False
    )
    gpu = bench.perturbed(base.sequence, "mild")
    values = range(2000, 8001, 250)
    reserved = [gpu.replay(v).reserved_peak for v in values]
    allocated = [gpu.replay(v).allocated_peak for v in values]
    jumps = {b - a for a, b in itertools.pairwise(reserved)}
    assert 0 in jumps and max(jumps) >= 2 * MiB  # flat, then a whole segment at once
    rises = [b - a for a, b in itertools.pairwise(allocated)]
    assert min(rises) > 0  # the allocated peak rises at every step of the batch
