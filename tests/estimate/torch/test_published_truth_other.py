"""The published runs of the other series (the ViT runs through Lightning Fabric, ...): each
within 8% of its source's figure, and together within issue 29's goal: 3% mean, 8% worst,
none more than 3% low (see ``test_published_truth.py``)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="the published runs are rebuilt with transformers")

from _published_truth_runs import check_run, outcome, run_id, runs_of


def test_there_are_other_series() -> None:
    assert runs_of(None)


@pytest.mark.slow
@pytest.mark.parametrize("run", runs_of(None), ids=run_id)
def test_published_run(run: object) -> None:
    check_run(run)


@pytest.mark.slow
def test_the_other_series_meet_the_goal() -> None:
    errors = [outcome(r).error for r in runs_of(None)]
    assert len(errors) >= 7
    assert sum(abs(e) for e in errors) / len(errors) <= 0.03, errors
    assert max(abs(e) for e in errors) <= 0.08, errors
    assert min(errors) >= -0.03, errors  # under-prediction is the dangerous error
