"""TrainGuard under DDP (gloo, CPU): OOM on one rank, same decisions everywhere, no hang."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from memfit.runtime import _distributed as distributed

sys.path.insert(0, str(Path(__file__).parent))
import _memfit_guard_ddp_worker as ddp_worker
from _ddp_launch import free_port, launch

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed missing")


def _launch(tmp_path: Path, world: int, **kwargs: Any) -> list[dict[str, Any]]:
    """Run the worker on ``world`` spawned ranks; return each rank's results by optimizer."""
    args = (
        world,
        free_port(),
        str(tmp_path),
        kwargs.get("steps", 40),
        kwargs.get("rate", 0.02),
        kwargs.get("oom_rank", 0),
        kwargs.get("names", ("sgd",)),
        kwargs.get("max_splits", 64),
    )
    launch(ddp_worker.worker, args, world)
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]


def _rel(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((p - q).norm() / q.norm()) for p, q in zip(a, b, strict=True))


# Each launch spawns fresh interpreters that import torch (seconds each on a small machine).
@pytest.mark.slow
def test_two_ranks_with_oom_on_one_equal_plain_ddp(tmp_path: Path) -> None:
    ranks = _launch(tmp_path, 2, names=("sgd", "adam"), steps=40, rate=0.008, oom_rank=0)
    for name in ("sgd", "adam"):
        r0, r1 = ranks[0][name], ranks[1][name]
        assert r0["ooms"] >= 5 and r1["ooms"] == 0, name
        assert r0["gave_up"] is None and r0["steps"] == r1["steps"] == 40
        assert r0["splits"] == r1["splits"]  # the same decision on both ranks
        for p, q in zip(r0["guard"], r1["guard"], strict=True):
            assert torch.equal(p, q)  # both ranks end identical
        assert _rel(r0["guard"], r0["ref"]) <= 1e-5, name


@pytest.mark.slow
def test_four_ranks_with_oom_on_one(tmp_path: Path) -> None:
    ranks = _launch(tmp_path, 4, steps=15, rate=0.01, oom_rank=2)
    results = [r["sgd"] for r in ranks]
    assert results[2]["ooms"] >= 1 and results[2]["gave_up"] is None
    assert len({r["splits"] for r in results}) == 1
    for r in results[1:]:
        for p, q in zip(results[0]["guard"], r["guard"], strict=True):
            assert torch.equal(p, q)
    assert _rel(results[0]["guard"], results[0]["ref"]) <= 1e-5


@pytest.mark.slow
def test_giving_up_on_one_rank_stops_every_rank(tmp_path: Path) -> None:
    r0, r1 = (r["sgd"] for r in _launch(tmp_path, 2, steps=3, rate=1.0, oom_rank=1, max_splits=2))
    assert r1["gave_up"] is not None and "even after" in r1["gave_up"]
    assert r0["gave_up"] is not None and "another rank" in r0["gave_up"]
    assert r0["steps"] == r1["steps"] == 0


def test_not_distributed_is_a_no_op() -> None:
    assert not distributed.is_distributed()
    decision = distributed.agree(gave_up=False, splits=4, split=True)
    assert decision == distributed.Decision(gave_up=False, splits=4, split=True)
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.full((3,), 2.0)
    distributed.average_gradients([p])
    assert torch.equal(p.grad, torch.full((3,), 2.0))
