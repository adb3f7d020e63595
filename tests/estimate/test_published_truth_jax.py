"""Published JAX GPU peaks, rebuilt from their text and predicted deviceless (issue 30).

Each run of ``tests/data/published_truth/*.yaml`` with ``framework: jax`` is rebuilt by
``bench/published_truth_jax.py`` as its source ran it and predicted with
:func:`memfit.estimate_jax` for the source's card: XLA's GPU compiler without the card and the
runtime's terms (``peak_bytes_in_use``). The bench runs every run and every jitted function of
each program; here a few runs are checked, each by the function the bench finds the peak in
(a deviceless compile each). Goal: within 10%, and never more than 5% under, except the runs
listed in ``KNOWN_MISSES`` with what is not modelled (strict: they fail once they pass).
"""

from __future__ import annotations

import pytest
from _bench_scripts import load_bench

from memfit.hardware.catalog import gpu as lookup_gpu

pytest.importorskip("flax", reason="the published PPO programs are rebuilt with Flax Linen")
pytest.importorskip("optax", reason="the published PPO programs use optax's Adam")

from memfit.estimate import xla_gpu

published = load_bench("published_truth_jax", "published_truth_jax.py")
RUNS = published.load_runs()
BY_KEY = {run.key: run for run in RUNS}

#: The runs CI predicts (the bench predicts them all): the smallest program (the autotuner's
#: floor decides it), the largest (its buffers decide it), and one with image observations.
CHECKED = [
    "benchback_rl_gymnax_ppo/CartPole-v1 64x64",
    "benchback_rl_gymnax_ppo/CartPole-v1 1024x6",
    "benchback_rl_gymnax_ppo/Freeway-MinAtar 64x64",
]

#: Runs memfit still misses by more than the goal, and why (docs/benchmarks.md, issue 30).
KNOWN_MISSES: dict[str, str] = {
    "benchback_rl_gymnax_ppo/Freeway-MinAtar 64x64": (
        "the source's update held one more copy of the rollout's observations than "
        "jaxlib 0.10.2's compile (that copy brings every MinAtar run within -4.2%..+0.6%), "
        "not from XLA's passes both backends share (jaxlib 0.7.2's CPU compile matches "
        "0.10.2's to 1 MiB); 0.7.2's GPU pipeline cannot be compiled here: not modelled"
    ),
}


def test_every_jax_source_states_what_a_rebuild_needs() -> None:
    assert len(RUNS) >= 20
    for run in RUNS:
        assert run.quantity == "peak_bytes_in_use", run.key
        assert run.source.startswith("https://"), run.key
        assert run.workload in published.WORKLOADS, run.key
        assert run.runtime.get("jaxlib"), run.key  # the version it was measured with
        assert lookup_gpu(run.gpu).compute_capability is not None, run.key
        assert run.measured_bytes > 0
    assert set(CHECKED) <= set(BY_KEY)


def test_the_rebuild_keeps_the_sources_shapes() -> None:
    """The stand-in environments carry gymnax 0.0.9's observation and action shapes."""
    env = published.ShapeEnv("Freeway-MinAtar")
    assert env.obs_shape == (10, 10, 7) and env.num_actions == 3
    program = published.benchback_linen_ppo({"env": "CartPole-v1", "hidden_sizes": [64, 64]})
    assert [phase.name for phase in program.phases] == ["rollout", "advantages", "update"]


@pytest.mark.slow
@pytest.mark.skipif(bool(xla_gpu.gpu_target_missing()), reason="needs the gpu-target extra")
@pytest.mark.parametrize("key", CHECKED)
def test_published_jax_peak(key: str) -> None:
    run = BY_KEY[key]
    outcome = published.predict(run, before=False, phases=("update",))
    error = outcome.error
    if key in KNOWN_MISSES:
        assert not (-0.05 <= error <= 0.10), f"{key} now meets the goal: take it off KNOWN_MISSES"
        pytest.xfail(f"{error:+.1%}: {KNOWN_MISSES[key]}")
    assert -0.05 <= error <= 0.10, (
        f"{key}: predicted {outcome.predicted_bytes / 2**20:,.1f} MiB, measured "
        f"{run.measured_bytes / 2**20:,.1f} MiB ({error:+.1%})"
    )
    assert outcome.compiled_for.startswith("cuda sm_89")
