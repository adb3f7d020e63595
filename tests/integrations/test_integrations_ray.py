"""memfit.integrations.ray: configurations that fit some card, trial requests sized by
memory, autoconfig inside a trial, metrics (issue 24). The sizing needs no running Ray; one
slow test runs a tiny Tuner on logical GPUs."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

import pytest

import memfit
from memfit.allocator.xla_fraction import FRACTION_VARIABLES, xla_fraction_variable
from memfit.integrations import ray as mr
from memfit.planning import feasible
from memfit.runtime.events import MemoryEvent

W = "brax_humanoid_ppo"
CARDS = [mr.Card("8GiB", label="small"), mr.Card("24GiB", label="large")]


def test_feasible_configs_are_the_union_of_the_cards_spaces() -> None:
    configs = mr.feasible_configs(W, CARDS)
    small, large = feasible(W, gpu="8GiB"), feasible(W, gpu="24GiB")
    keys = {tuple(c[n] for n in small.order) for c in configs}
    assert keys == {tuple(c[n] for n in small.order) for c in (*small.configs, *large.configs)}
    assert len(large) > len(small)
    fits = mr.fits_some(W, CARDS)
    assert all(fits(c) for c in configs)
    too_big = {"num_envs": 65536, "unroll_length": 30, "batch_size": 8192, "num_minibatches": 32}
    assert not fits(too_big)
    with pytest.raises(memfit.InfeasiblePlan):
        mr.feasible_configs(W, ["64MiB"])


def test_requests_are_sized_by_memory_and_labelled_when_only_some_cards_fit() -> None:
    small = feasible(W, gpu="8GiB")
    large = feasible(W, gpu="24GiB")
    both = small.configs[small.used_bytes.index(min(small.used_bytes))]
    req = mr.request_for(both, W, CARDS)
    assert req.labels == ()  # fits either card: no label, sized against the smaller one
    # the job's own peak, with the 5% margin as headroom, over the 8 GiB card, rounded up
    index = small.index(both)
    assert index is not None and req.peak_bytes == small.used_bytes[index]
    expected = -(-req.peak_bytes * 105 // memfit.parse_bytes("8GiB")) / 100
    assert req.gpu == pytest.approx(expected, abs=0.011)
    assert 0 < req.gpu < 1
    only_large = next(c for c in large.configs if small.index(c) is None)
    req = mr.request_for(only_large, W, CARDS)
    assert req.labels == ("large",)
    assert req.bundle()["accelerator_type:large"] == pytest.approx(0.001)
    assert req.peak_bytes <= memfit.parse_bytes("24GiB")
    # a larger configuration never asks for less
    ordered = sorted(zip(small.used_bytes, small.configs, strict=True), key=lambda p: p[0])
    ordered = ordered[:: max(1, len(ordered) // 25)]
    fractions = [mr.request_for(c, W, CARDS).gpu for _, c in ordered]
    assert fractions == sorted(fractions)


def test_trial_autoconfig_follows_the_card_and_sets_the_jax_share(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in FRACTION_VARIABLES:  # monkeypatch puts back what the trial sets
        monkeypatch.delenv(name, raising=False)
    chosen = {}
    for size in ("8GiB", "24GiB"):  # the per-card knob follows the card the trial landed on
        with memfit.simulate_gpu(size):
            cfg = mr.trial_autoconfig("act_dual_camera", {"num_envs": 4}, follow=("num_envs",))
        chosen[size] = cfg.knobs["num_envs"]
    assert chosen["24GiB"] > chosen["8GiB"] > 4
    # a quarter of a 24 GiB card is planned as a 6 GiB card (torch: the share is the room)
    with memfit.simulate_gpu("24GiB"):
        quarter = mr.trial_autoconfig("act_dual_camera", {}, follow=("num_envs",), share=0.25)
    with memfit.simulate_gpu("6GiB"):
        alone = memfit.autoconfig("act_dual_camera")
    assert quarter.knobs == alone.knobs
    assert quarter.plan.budget_bytes == alone.plan.budget_bytes
    # JAX: XLA's pool is the share, in the plan and in this process's environment
    pinned = {"unroll_length": 10, "batch_size": 512, "num_minibatches": 8, "num_envs": 256}
    with memfit.simulate_gpu("8GiB"):
        cfg = mr.trial_autoconfig(W, pinned, share=0.3)
    assert cfg.knobs == pinned
    assert cfg.plan.fits
    assert cfg.plan.pool_bytes == pytest.approx(0.3 * memfit.parse_bytes("8GiB"), rel=0.01)
    assert os.environ[xla_fraction_variable()[0]] == "0.30"  # the one name (issue 32)
    with pytest.raises(memfit.ConfigError, match="share"):
        mr.trial_autoconfig(W, share=1.5)


def test_metrics_count_events_and_carry_the_card() -> None:
    log = mr.EventLog()
    log(MemoryEvent("oom", 3, "TrainGuard", "out of memory"))
    log(MemoryEvent("retry", 3, "TrainGuard", "retrying"))
    log(MemoryEvent("oom", 9, "TrainGuard", "out of memory again"))
    with memfit.simulate_gpu("8GiB"):
        cfg = memfit.autoconfig(W)
    out = mr.metrics(log.events, peak_bytes=123, cfg=cfg)
    assert out["memfit/oom"] == 2 and out["memfit/retry"] == 1
    assert out["memfit/peak_bytes"] == 123
    assert out["memfit/last_event"].startswith("oom: out of memory again")
    assert out["memfit/knob/num_envs"] == cfg.knobs["num_envs"]


@pytest.fixture(scope="module")
def ray_two_gpus() -> Any:
    """Ray on this machine with two logical GPUs, started once for the module (a short
    temporary folder: Ray's socket paths must stay under 108 bytes)."""
    ray = pytest.importorskip("ray", reason="memfit[ray] is not installed")
    folder = tempfile.mkdtemp(prefix="mfray", dir="/tmp")
    ray.init(
        num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False,
        configure_logging=False, _temp_dir=folder,
    )  # fmt: skip
    try:
        yield ray
    finally:
        ray.shutdown()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
def test_a_tiny_tuner_on_two_logical_gpus(ray_two_gpus: Any, tmp_path: Any) -> None:
    from ray import tune

    cards = {0: "8GiB", 1: "24GiB"}

    def trainable(config: dict[str, Any]) -> None:
        gpu_id = int(float(ray_two_gpus.get_gpu_ids()[0]))
        with memfit.simulate_gpu(cards[gpu_id]):
            cfg = mr.trial_autoconfig("act_dual_camera", config["memfit"], follow=("num_envs",))
        tune.report({**mr.metrics(cfg=cfg), "gpu_id": gpu_id})

    configs = mr.feasible_configs("act_dual_camera", list(cards.values()))[:3]
    tuner = tune.Tuner(
        tune.with_resources(
            trainable, mr.resources("act_dual_camera", list(cards.values()), cpu=0.5)
        ),
        param_space={"memfit": tune.grid_search(configs)},
        run_config=tune.RunConfig(storage_path=str(tmp_path / "results"), verbose=0),
    )
    results = tuner.fit()
    assert len(results) == 3
    assert not results.errors
    by_card: dict[str, set[Any]] = {}
    for result in results:
        card = cards[int(result.metrics["gpu_id"])]
        assert result.metrics["memfit/planned_bytes"] <= memfit.parse_bytes(card)
        by_card.setdefault(card, set()).add(result.metrics["memfit/knob/num_envs"])
    # the knob followed the card each trial landed on
    for card, values in by_card.items():
        with memfit.simulate_gpu(card):
            assert values == {memfit.autoconfig("act_dual_camera").knobs["num_envs"]}
