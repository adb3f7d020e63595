"""Published real-GPU measurements, rebuilt from their text and traced (issues 26 and 29).

Each run of ``tests/data/published_truth/*.yaml`` is rebuilt by ``bench/published_truth.py`` as
its source ran it and traced for the source's GPU and runtime; the figure the source measured
(nvidia-smi ``used``, ``max_memory_reserved`` / ``memory_reserved`` or
``max_memory_allocated``) is compared with memfit's. Goals: nvidia-smi used within 3% mean and
8% worst; every run within 8%, except the runs listed in ``KNOWN_MISSES`` with what is not yet
modelled (strict: they fail once they pass, so the list stays true); the series whose figures
turn on CUDA's kernels (issue 29: dropout, attention backends, cuDNN convolutions) within 3%
mean, 8% worst and none more than 3% low.
"""

from __future__ import annotations

import pytest
from _bench_scripts import load_bench

pytest.importorskip("transformers", reason="the published BERT runs are rebuilt with transformers")

#: One test process traces every run once (the goals' tests read the same outcomes).
pytestmark = pytest.mark.xdist_group("published_truth")

published = load_bench("published_truth", "published_truth.py")
RUNS = published.load_runs()

#: Reserved-peak runs memfit still misses by more than 8%, and why.
KNOWN_MISSES: dict[str, str] = {}


#: The series whose figures depend on the kernel CUDA runs rather than the CPU's (issue 29).
KERNEL_SERIES = ("rasbt_gpt2_124m_a100", "pytorch_50990_conv_v100")


def test_every_source_states_what_a_rebuild_needs() -> None:
    assert {r.series for r in RUNS} >= {"hf_bert_large_v100", "rasbt_vit_l16", *KERNEL_SERIES}
    for run in RUNS:
        assert run.quantity in ("device_used", "reserved_peak", "allocated_peak")
        assert run.source.startswith("https://")
        assert run.workload in published.WORKLOADS
        if run.quantity == "device_used":  # nvidia-smi includes the context: runtime needed
            assert run.gpu is not None and run.runtime, run.name


_OUTCOMES: dict[str, object] = {}


def _outcome(run: object) -> object:
    key = f"{run.series}/{run.name}"  # type: ignore[attr-defined]
    if key not in _OUTCOMES:
        _OUTCOMES[key] = published.predict(run)
    return _OUTCOMES[key]


@pytest.mark.slow
@pytest.mark.parametrize("run", RUNS, ids=[f"{r.series}/{r.name}" for r in RUNS])
def test_published_run(run: object) -> None:
    name = f"{run.series}/{run.name}"  # type: ignore[attr-defined]
    outcome = _outcome(run)
    if name in KNOWN_MISSES:
        assert abs(outcome.error) > 0.08, f"{name} now meets the goal: take it off KNOWN_MISSES"  # type: ignore[attr-defined]
        pytest.xfail(f"{outcome.error:+.1%}: {KNOWN_MISSES[name]}")  # type: ignore[attr-defined]
    assert abs(outcome.error) <= 0.08, (  # type: ignore[attr-defined]
        f"{name}: predicted {outcome.predicted_bytes / 2**20:,.0f} MiB, measured "  # type: ignore[attr-defined]
        f"{run.measured_bytes / 2**20:,.0f} MiB ({outcome.error:+.1%})"  # type: ignore[attr-defined]
    )


@pytest.mark.slow
def test_nvidia_smi_used_meets_the_goal() -> None:
    used = [r for r in RUNS if r.quantity == "device_used"]
    errors = [abs(_outcome(r).error) for r in used]  # type: ignore[attr-defined]
    assert len(errors) >= 8
    assert sum(errors) / len(errors) <= 0.03, errors
    assert max(errors) <= 0.08, errors


@pytest.mark.slow
def test_runs_that_turn_on_cudas_kernels_meet_the_goal() -> None:
    runs = [r for r in RUNS if r.series in KERNEL_SERIES]
    errors = [_outcome(r).error for r in runs]  # type: ignore[attr-defined]
    assert len(errors) >= 8
    assert sum(abs(e) for e in errors) / len(errors) <= 0.03, errors
    assert max(abs(e) for e in errors) <= 0.08, errors
    assert min(errors) >= -0.03, errors  # under-prediction is the dangerous error
