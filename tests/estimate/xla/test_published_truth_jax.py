"""Published JAX GPU peaks, rebuilt from their text and predicted deviceless (issue 30).

Each run of ``tests/data/published_truth/*.yaml`` with ``framework: jax`` is rebuilt by
``bench/published_truth_jax.py`` as its source ran it and predicted with
:func:`memfit.estimate_jax` for the source's card: XLA's GPU compiler without the card and the
runtime's terms (``peak_bytes_in_use``), and the source's training loop replayed through the
BFC allocator for its 100 iterations (:mod:`memfit.estimate.xla.program`). The bench runs
every run; here a few runs are checked (a deviceless compile of each jitted function). Goal:
within 10%, and never more than 5% under, except the runs listed in ``KNOWN_MISSES`` with
what is not modelled (strict: they fail once they pass).
"""

from __future__ import annotations

import functools

import pytest

from memfit.hardware.catalog import gpu as lookup_gpu

pytest.importorskip("flax", reason="the published PPO programs are rebuilt with Flax Linen")
pytest.importorskip("optax", reason="the published PPO programs use optax's Adam")

import published_runs_jax as published

from memfit.estimate.xla import gpu as xla_gpu

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
#: Freeway-MinAtar 64x64 was one (-11.7%) until the loop was replayed through the allocator.
KNOWN_MISSES: dict[str, str] = {}


@functools.cache
def _replayed_peak(key: str) -> int:
    run = BY_KEY[key]
    program = published.WORKLOADS[run.workload](run.settings)
    replayed = published.replay(run, program, STORED[key])
    assert replayed.out_of_memory is None
    assert replayed.peak_bytes_in_use >= replayed.live_peak_bytes
    return int(replayed.peak_bytes_in_use)


def test_every_jax_source_states_what_a_rebuild_needs() -> None:
    assert len(RUNS) >= 20
    for run in RUNS:
        assert run.quantity == "peak_bytes_in_use", run.key
        assert run.source.startswith("https://"), run.key
        assert run.workload in published.WORKLOADS, run.key
        assert run.runtime.get("jaxlib"), run.key  # the version it was measured with
        assert lookup_gpu(run.gpu).compute_capability is not None, run.key
        assert run.measured_bytes > 0
    assert set(CHECKED) <= set(BY_KEY) and REPLAYED in CHECKED


def test_the_rebuild_keeps_the_sources_shapes() -> None:
    """The stand-in environments carry gymnax 0.0.9's observation and action shapes."""
    env = published.ShapeEnv("Freeway-MinAtar")
    assert env.obs_shape == (10, 10, 7) and env.num_actions == 3
    program = published.benchback_linen_ppo({"env": "CartPole-v1", "hidden_sizes": [64, 64]})
    assert [phase.name for phase in program.phases] == ["rollout", "advantages", "update"]


STORED = published.load_buffers()


def _within_goal(key: str, predicted: int) -> None:
    run = BY_KEY[key]
    error = (predicted - run.measured_bytes) / run.measured_bytes
    if key in KNOWN_MISSES:
        assert not (-0.05 <= error <= 0.10), f"{key} now meets the goal: take it off KNOWN_MISSES"
        pytest.xfail(f"{error:+.1%}: {KNOWN_MISSES[key]}")
    assert -0.05 <= error <= 0.10, (
        f"{key}: predicted {predicted / 2**20:,.1f} MiB, measured "
        f"{run.measured_bytes / 2**20:,.1f} MiB ({error:+.1%})"
    )


def test_every_run_has_its_phases_stored() -> None:
    """``bench/published_truth_jax.py --no-before --store`` wrote every run's phases."""
    assert set(STORED) == set(BY_KEY)
    for key, phases in STORED.items():
        assert set(phases) == {"rollout", "advantages", "update"}, key


@pytest.mark.parametrize("key", sorted(BY_KEY))
def test_the_replayed_loop_meets_the_goal(key: str) -> None:
    """Every published run: its loop replayed through the BFC allocator for the source's 100
    iterations, from the phases' stored buffers (no compile; the slow test below checks a
    fresh compile still gives them)."""
    _within_goal(key, _replayed_peak(key))


def test_the_published_set_meets_the_goal_as_a_whole() -> None:
    """The issue's goal on the set: mean |err| <= 5%, worst <= 10%, none under by over 5%."""
    errors = []
    for key, run in BY_KEY.items():
        errors.append((_replayed_peak(key) - run.measured_bytes) / run.measured_bytes)
    assert sum(abs(e) for e in errors) / len(errors) <= 0.05
    assert max(abs(e) for e in errors) <= 0.10
    assert min(errors) >= -0.05


#: The run whose three phases CI compiles afresh and replays (the others: their update only).
REPLAYED = "benchback_rl_gymnax_ppo/Freeway-MinAtar 64x64"


@pytest.mark.slow
@pytest.mark.skipif(bool(xla_gpu.gpu_target_missing()), reason="needs the gpu-target extra")
@pytest.mark.parametrize("key", CHECKED)
def test_published_jax_peak(key: str) -> None:
    """A fresh deviceless compile gives the stored buffers (every phase of one run, the update
    of the others), and that run's loop replayed from the fresh compile meets the goal."""
    phases = None if key == REPLAYED else ("update",)
    outcome = published.predict(BY_KEY[key], before=False, phases=phases)
    assert outcome.compiled_for.startswith("cuda sm_89")
    stored = {
        name: {"outputs": [list(o) for o in b.outputs], "temp_bytes": b.temp_bytes,
               "first_call_bytes": b.first_call_bytes}
        for name, b in STORED[key].items()
        if phases is None or name in phases
    }  # fmt: skip
    assert outcome.phase_buffers == stored, (
        "the compile changed these phases' buffers: rerun "
        "`python bench/published_truth_jax.py --no-before --store`"
    )
    if phases is None:
        _within_goal(key, outcome.predicted_bytes)
