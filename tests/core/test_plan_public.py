"""``memfit.plan``: workload and GPU resolution, ``gpu="local"`` and traced estimators."""

from __future__ import annotations

from typing import Any

import pytest

import memfit
from memfit.backends.base import DeviceSnapshot, SystemSnapshot
from memfit.core.budget import compose_budget
from memfit.core.measured import MeasuredTerms
from memfit.core.workload import Workload, parse_workload
from memfit.errors import BackendUnavailable, InfeasiblePlan
from memfit.hardware.catalog import gpu
from memfit.planning import TIER_GPUS, plan, plan_tiers
from memfit.units import GiB


def test_public_names() -> None:
    assert memfit.plan is plan
    w = memfit.load_workload("dqn_fire_raster")
    assert isinstance(w, memfit.Workload)
    assert memfit.check(w) == []
    p = memfit.plan("dqn_fire_raster", gpu="T4", margin="10%")
    assert isinstance(p, memfit.Plan)
    assert p.budget_bytes == compose_budget(gpu("T4"), margin=0.1).budget_bytes


def test_local_gpu_takes_off_what_others_use(monkeypatch: pytest.MonkeyPatch) -> None:
    total = gpu("RTX 4070").total_bytes
    snap = SystemSnapshot(
        source="nvml",
        devices=(
            DeviceSnapshot(
                index=0,
                name="NVIDIA GeForce RTX 4070",
                total_bytes=total,
                device_used_bytes=2 * GiB,
                free_bytes=total - 2 * GiB,
            ),
        ),
    )
    monkeypatch.setattr("memfit.backends.probe_all", lambda **_: snap)
    p = plan("dqn_fire_raster@device_replay", gpu="local", margin=0.05)
    assert p.gpu == "NVIDIA GeForce RTX 4070"
    expected = compose_budget(gpu("RTX 4070"), margin=0.05, other_processes_bytes=2 * GiB)
    assert p.budget_bytes == expected.budget_bytes
    named = plan("dqn_fire_raster@device_replay", gpu="RTX 4070", margin=0.05)
    assert int(p.knobs["buffer_size"]) < int(named.knobs["buffer_size"])


def test_local_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    empty = SystemSnapshot(source="none", devices=(), notes=("no NVIDIA GPU or driver found",))
    monkeypatch.setattr("memfit.backends.probe_all", lambda **_: empty)
    with pytest.raises(BackendUnavailable, match="no local GPU") as info:
        plan("dqn_fire_raster", gpu="local")
    assert info.value.hint is not None and "--gpu" in info.value.hint


def test_traced_estimator_replaces_the_model_terms(monkeypatch: pytest.MonkeyPatch) -> None:
    w = parse_workload(
        """\
family: offpolicy
estimator: torch
factory: my_model:make_step
observations: {vector: 16}
networks: {q: {layers: [64, 4]}}
knobs:
  buffer_size: {choices: [1000]}
  batch_size: {min: 32, max: 65536, powers_of_two: true}
"""
    )
    calls: list[Workload] = []

    def fake_measure(workload: Workload, **_: Any) -> MeasuredTerms:
        calls.append(workload)
        return MeasuredTerms(
            knob="batch_size",
            fixed_bytes={"parameters": 10 * 2**20, "optimizer_state": 20 * 2**20},
            per_item_bytes=64 * 1024,
            source="torch fake-tensor trace",
        )

    monkeypatch.setattr("memfit.estimate.bridge.measure", fake_measure)
    p = plan(w, gpu="8GiB")
    assert calls == [w]
    assert p.breakdown["parameters"] == 10 * 2**20
    assert p.breakdown["activations"] == 64 * 1024 * int(p.knobs["batch_size"])
    assert "gradients" not in p.breakdown


def test_tier_table_is_sorted_by_memory_and_covers_the_consumer_tiers() -> None:
    specs = [gpu(name) for name in TIER_GPUS]
    totals = [s.total_bytes for s in specs]
    assert totals == sorted(totals)
    # the 8, 12, 16 and 24 GB tiers each have several consumer cards
    for tier in (8, 12, 16, 24):
        near = [s for s in specs if abs(s.total_bytes / GiB - tier) < 0.6]
        assert len(near) >= 2, tier
    for name in ("RTX 4060 Ti 16GB", "RTX 4070 SUPER", "RTX 4070 Ti", "RTX 4080", "RTX 4080 SUPER",
                 "RTX 3080", "RTX 3080 Ti", "RTX 5070", "RTX 5080", "RTX 5090"):  # fmt: skip
        assert gpu(name).name in TIER_GPUS, name
    results = plan_tiers("act_dual_camera@no_sim")
    assert len(results) == len(TIER_GPUS)
    assert all(not isinstance(r, InfeasiblePlan) for r in results)
    envs = [int(r.knobs["num_envs"]) for r in results if not isinstance(r, InfeasiblePlan)]
    assert min(envs) >= 1
    # with Isaac Sim on the card (3.5 GiB at start) the 4 GB cards hold no rollout
    with_sim = plan_tiers("act_dual_camera")
    small = [s.total_bytes <= 4 * GiB for s in specs]
    assert small[:2] == [True, True]
    assert [isinstance(r, InfeasiblePlan) for r in with_sim] == small
