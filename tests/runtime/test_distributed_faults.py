"""TrainGuard under DDP with faults on one rank (issue 14, items 2 and 3): the ranks never
drift apart and never wait for a rank that is gone (gloo, 2 CPU ranks, float64)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
import _memfit_guard_faults_ddp_worker as worker_module
from _ddp_launch import free_port, launch

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed missing")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("ddp_faults")
    launch(worker_module.worker, (2, free_port(), str(out)), 2)
    return [torch.load(out / f"rank{r}.pt") for r in range(2)]


def _same(a: list[torch.Tensor], b: list[torch.Tensor], tol: float = 0.0) -> bool:
    return all(float((p - q).abs().max()) <= tol for p, q in zip(a, b, strict=True))


@pytest.mark.slow
def test_a_step_that_fails_halfway_on_one_rank_is_repaired_from_another(
    ranks: list[dict[str, Any]],
) -> None:
    r0, r1 = (r["one_rank_step_fails"] for r in ranks)
    assert r0["raised"] is None and r1["raised"] is None
    assert r0["steps"] == r1["steps"] == worker_module.STEPS
    assert sum("copied from rank 0" in m for m in r1["messages"]) == 2
    assert _same(r0["params"], r1["params"])  # identical, bit for bit
    assert _same(r0["params"], ranks[0]["reference"], 1e-12)  # and equal to plain DDP


@pytest.mark.slow
def test_when_every_rank_fails_they_give_up_together_unchanged(
    ranks: list[dict[str, Any]],
) -> None:
    r0, r1 = (r["every_rank_step_fails"] for r in ranks)
    assert r0["raised"].startswith("OutOfMemory") and r1["raised"].startswith("OutOfMemory")
    assert r0["steps"] == r1["steps"] == 4
    assert _same(r0["params"], r1["params"])


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["error_in_step", "interrupt_in_forward"])
def test_an_error_on_one_rank_stops_every_rank(ranks: list[dict[str, Any]], scenario: str) -> None:
    r0, r1 = (r[scenario] for r in ranks)
    expected = "RuntimeError: a bug" if scenario == "error_in_step" else "KeyboardInterrupt"
    assert r1["raised"].startswith(expected)
    assert r0["raised"].startswith("MemfitError: another rank stopped")
    assert r0["steps"] == r1["steps"]
    assert _same(r0["params"], r1["params"])  # the failed step was undone on rank 1


@pytest.mark.slow
@pytest.mark.parametrize("chunked", [False, True], ids=["whole", "chunked"])
@pytest.mark.parametrize("kind", ["oom", "error", "interrupt"])
def test_the_default_leaves_every_rank_on_the_same_whole_step(
    ranks: list[dict[str, Any]], kind: str, chunked: bool
) -> None:
    """A fault inside rank 1's optimizer.step() under the default policy (issue 21)."""
    ops = ranks[0]["default_ops"]
    for at in (1, ops // 2, ops - 1):
        name = f"default_{kind}_{'chunked' if chunked else 'whole'}_{at}"
        r0, r1 = (r[name] for r in ranks)
        # bit for bit the same parameters and optimizer state on both ranks
        assert all(torch.equal(p, q) for p, q in zip(r0["params"], r1["params"], strict=True))
        assert all(torch.equal(p, q) for p, q in zip(r0["state"], r1["state"], strict=True))
        if kind == "oom":  # retried from the journal: the run goes on, as plain DDP
            assert r0["raised"] is None and r1["raised"] is None, name
            assert r0["steps"] == r1["steps"] == worker_module.STEPS
            assert _same(r0["params"], ranks[0]["reference"], 1e-12)
            assert "oom" in r1["kinds"] and "oom" not in r0["kinds"], name
            assert not any("copied from rank" in m for m in r1["messages"])
        else:  # every rank stops after step 3, undone (one chunk) or completed (chunks)
            expected = "RuntimeError: a bug" if kind == "error" else "KeyboardInterrupt"
            assert r1["raised"].startswith(expected), name
            assert r0["raised"].startswith("MemfitError: another rank stopped"), name
            assert r0["steps"] == r1["steps"] == 3
