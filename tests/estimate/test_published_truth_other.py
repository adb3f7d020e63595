"""The published runs of the other series (the ViT runs through Lightning Fabric, ...): each
within 8% of its source's figure (see ``test_published_truth.py``)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="the published runs are rebuilt with transformers")

from _published_truth_runs import check_run, run_id, runs_of


def test_there_are_other_series() -> None:
    assert runs_of(None)


@pytest.mark.slow
@pytest.mark.parametrize("run", runs_of(None), ids=run_id)
def test_published_run(run: object) -> None:
    check_run(run)
