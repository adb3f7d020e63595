"""Published real-GPU measurements, rebuilt from their text and traced (issues 26 and 29): the
nvidia-smi series here, the kernel series in ``test_published_truth_kernels.py``, the others in
``test_published_truth_other.py`` (one file each, so that parallel test processes share the
work; the runs and the checks are ``_published_truth_runs.py``).

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

pytest.importorskip("transformers", reason="the published BERT runs are rebuilt with transformers")

from _published_truth_runs import (
    KERNEL_SERIES,
    RUNS,
    SMI_SERIES,
    check_run,
    outcome,
    published,
    run_id,
    runs_of,
)


def test_every_source_states_what_a_rebuild_needs() -> None:
    assert {r.series for r in RUNS} >= {"hf_bert_large_v100", "rasbt_vit_l16", *KERNEL_SERIES}
    for run in RUNS:
        assert run.quantity in ("device_used", "reserved_peak", "allocated_peak")
        assert run.source.startswith("https://")
        assert run.workload in published.WORKLOADS
        if run.quantity == "device_used":  # nvidia-smi includes the context: runtime needed
            assert run.gpu is not None and run.runtime, run.name
    # every nvidia-smi figure is in the series this file checks
    assert {r.series for r in RUNS if r.quantity == "device_used"} <= set(SMI_SERIES)


@pytest.mark.slow
@pytest.mark.parametrize("run", runs_of(SMI_SERIES), ids=run_id)
def test_published_run(run: object) -> None:
    check_run(run)


@pytest.mark.slow
def test_nvidia_smi_used_meets_the_goal() -> None:
    used = [r for r in RUNS if r.quantity == "device_used"]
    errors = [abs(outcome(r).error) for r in used]
    assert len(errors) >= 8
    assert sum(errors) / len(errors) <= 0.03, errors
    assert max(errors) <= 0.08, errors
