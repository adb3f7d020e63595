"""Issue 43: the planner's Brax figure replays Brax's training loop through the BFC allocator
model (:meth:`memfit.core.measured.BraxMeasurements.replay_loop`)."""

from __future__ import annotations

import memfit
from memfit.allocator.bfc import round_up
from memfit.core.measured import AffineLine, BraxMeasurements, Provenance, StepFit

VALUES = {"num_envs": 2048, "batch_size": 256, "num_minibatches": 8, "unroll_length": 10}


def _measured(env_state: int = 38_724) -> BraxMeasurements:
    return BraxMeasurements(
        env="brax:x",
        provenance=Provenance(versions={}, platform="cpu", date="2026-11-29", command="test"),
        env_state_bytes=env_state,
        transition_bytes=2_152,
        training_state_bytes=4_062_248,
        env_step=AffineLine(fixed_bytes=1 << 20, per_item_bytes=11_988),
        step=StepFit(fixed_bytes=8 << 20, per_transition_bytes=3_000, per_minibatch_item_bytes=900),
    )


def test_the_loop_terms_sum_to_the_replayed_peak() -> None:
    m = _measured()
    terms = dict(m.loop_terms(VALUES))
    replay = m.replay_loop(VALUES)
    assert sum(terms.values()) == replay.peak_bytes_in_use
    assert terms["eval_env_state"] == 128 * 38_724
    # a preallocated pool split in order: the loop adds the metrics and the rounding only
    assert 0 < terms["allocator_loop"] < 4 * 4096
    assert replay.peak_at.endswith("training epoch")
    assert set(terms) <= set(BraxMeasurements.BASIS)
    assert BraxMeasurements.BASIS["allocator_loop"] == "replayed"


def test_a_pool_grown_on_demand_hands_out_whole_chunks() -> None:
    m = _measured()
    grown = m.replay_loop(VALUES, preallocate=False)
    pooled = m.replay_loop(VALUES, preallocate=True)
    # regions of doubling sizes: the temporaries land in a region they do not split
    assert grown.peak_bytes_in_use > pooled.peak_bytes_in_use
    assert grown.peak_bytes_in_use >= grown.live_peak_bytes
    total = dict(m.loop_terms(VALUES, preallocate=False))
    assert total["allocator_loop"] > dict(m.loop_terms(VALUES))["allocator_loop"]
    assert grown.live_peak_bytes >= round_up(4_062_248) + 2048 * 38_724


def test_the_bundled_humanoid_plan_carries_the_loop_terms_and_says_so() -> None:
    p = memfit.plan("brax_humanoid_ppo", gpu="RTX 4070", measure="recorded")
    assert "eval_env_state" in p.breakdown and "allocator_loop" in p.breakdown
    assert any("replayed through JAX's BFC allocator" in n for n in p.notes)


def test_the_replayed_peak_settles_within_the_replayed_epochs() -> None:
    from memfit.core.measured import LOOP_ITERATIONS

    m = _measured()
    for preallocate in (True, False):
        for envs in (256, 2048, 16384):
            values = dict(VALUES, num_envs=envs)
            short = m.replay_loop(values, preallocate=preallocate)
            long = m.replay_loop(values, preallocate=preallocate, iterations=30)
            assert short.iterations == LOOP_ITERATIONS
            assert short.peak_bytes_in_use == long.peak_bytes_in_use
