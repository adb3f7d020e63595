"""autoconfig(distributed=True) on ranks with cards of different sizes, and the Recorder's
rank-imbalance warning (gloo on CPU, simulated cards; issue 24)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

import memfit
from memfit.monitor._ranks import rank_imbalance
from memfit.units import parse_bytes

sys.path.insert(0, str(Path(__file__).parent))
import _memfit_autoconfig_ddp_worker as ddp_worker
from _ddp_launch import free_port, launch

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed missing")


def _launch(
    tmp_path: Path,
    budgets: tuple[str, ...],
    workload: str = "brax_humanoid_ppo",
    per_rank: tuple[str, ...] = (),
    heavy_rank: int = -1,
) -> list[dict[str, Any]]:
    args = (len(budgets), free_port(), str(tmp_path), budgets, workload, per_rank, heavy_rank)
    launch(ddp_worker.worker, args, len(budgets))
    return [
        json.loads((tmp_path / f"rank{r}.json").read_text(encoding="utf-8"))
        for r in range(len(budgets))
    ]


def _alone(budget: str, workload: str = "brax_humanoid_ppo", **kwargs: Any) -> dict[str, Any]:
    with memfit.simulate_gpu(budget):
        return dict(memfit.autoconfig(workload, **kwargs).knobs)


# Each launch spawns fresh interpreters that import torch (seconds each on a small machine).
@pytest.mark.slow
def test_three_ranks_of_different_sizes_agree_on_what_the_smallest_can_run(
    tmp_path: Path,
) -> None:
    ranks = _launch(tmp_path, ("12GiB", "6GiB", "24GiB"), per_rank=(), heavy_rank=1)
    knobs = [r["knobs"] for r in ranks]
    assert knobs[0] == knobs[1] == knobs[2]
    # the agreed knobs are the 6 GiB card's own plan, and they differ from the 24 GiB card's
    assert knobs[0] == _alone("6GiB")
    assert knobs[0] != _alone("24GiB")
    assert all(r["fits"] for r in ranks)
    assert ranks[0]["ranks"] == [parse_bytes(b) for b in ("12GiB", "6GiB", "24GiB")]
    assert "rank 1" in " ".join(ranks[2]["notes"])
    # the Recorder's check: rank 1 holds 3x more from step 4; the check every 2nd sample
    # (steps 1, 3, 5, 7) first sees it at step 5, on every rank, once
    for r in ranks:
        events = r["events"]
        assert [e["data"]["rank"] for e in events] == [1], events
        assert events[0]["data"]["started_step"] == 5
        assert events[0]["step"] == 5


@pytest.mark.slow
def test_per_rank_knobs_follow_each_card(tmp_path: Path) -> None:
    # Isaac Lab's per-GPU num_envs: each rank's simulator runs as many as its card holds
    # (in a Brax workload num_envs is tied to the batch by a rule, so it cannot differ)
    ranks = _launch(tmp_path, ("6GiB", "24GiB"), "act_dual_camera", per_rank=("num_envs",))
    small, large = (r["knobs"] for r in ranks)
    assert small == _alone("6GiB", "act_dual_camera")
    assert large == _alone("24GiB", "act_dual_camera")
    assert large["num_envs"] > small["num_envs"]
    assert all(r["fits"] for r in ranks)
    assert ranks[0]["events"] == [] and ranks[1]["events"] == []


def test_not_distributed_is_the_plain_autoconfig() -> None:
    with memfit.simulate_gpu("6GiB"):
        cfg = memfit.autoconfig("brax_humanoid_ppo", distributed=True)
    assert cfg.ranks == []
    assert cfg.knobs == _alone("6GiB")


def test_per_rank_must_name_a_knob() -> None:
    with memfit.simulate_gpu("6GiB"), pytest.raises(memfit.ConfigError, match="per_rank"):
        memfit.autoconfig("brax_humanoid_ppo", distributed=True, per_rank=("num_env",))


def test_rank_imbalance_rule() -> None:
    assert rank_imbalance([100, 104, 180, 98])[0].rank == 2
    assert rank_imbalance([100, 119, 100]) == []
    assert [i.rank for i in rank_imbalance([100, 121, 100])] == [1]
    assert rank_imbalance([None, 500, 100])[0].others_bytes == 100
    assert rank_imbalance([None, 500]) == []
    assert [i.rank for i in rank_imbalance([100, 300, 100, 200], threshold=0.5)] == [1, 3]


def test_recorder_refuses_a_bad_rank_setting() -> None:
    with pytest.raises(memfit.ConfigError, match="ranks_every"):
        memfit.Recorder(None, ranks_every=0)
    with pytest.raises(memfit.ConfigError, match="imbalance"):
        memfit.Recorder(None, ranks_every=5, imbalance=0.0)
