"""Issue 43: the corpus of real JAX RL programs (``bench/jax_corpus.py``) compiles deviceless
for two cards at its small sizes, host callbacks and all.

Every program is exported once and compiled for both cards in one child process per card
(module fixture); the slow mark is for the exports (Brax's capture) and the two compiles.
"""

from __future__ import annotations

from typing import Any

import pytest

from memfit.estimate.xla import gpu as xla_gpu

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
pytest.importorskip("flax")
pytest.importorskip("optax")
pytest.importorskip("flashbax")
pytest.importorskip("brax")

CARDS = ("RTX 4070", "A100 40GB")


def _corpus() -> Any:
    import jax_rl_corpus

    return jax_rl_corpus


def _names() -> list[str]:
    """The corpus's programs whose packages are here (jumanji is in the integrations extra)."""
    import importlib.util

    found = importlib.util.find_spec("jumanji") is not None
    return [n for n in _corpus().CORPUS if found or not n.startswith("jumanji")]


@pytest.mark.slow  # eager JAX ops, each compiled on first use (26 s on the loaded VM)
def test_the_cartpole_steps_and_resets_as_gymnax_does() -> None:
    env = _corpus().CartPole()
    obs, state = env.reset(jax.random.PRNGKey(0))
    assert obs.shape == (4,) and obs.dtype == jnp.float32
    # pushed right (action 1), the cart speeds up to the right
    _, state2, reward, done, _ = env.step(jax.random.PRNGKey(1), state, 1)
    assert float(state2.x_dot) > float(state.x_dot) and float(reward) == 1.0
    assert not bool(done) and int(state2.time) == 1
    # an episode past its 500 steps is reset
    old = state2._replace(time=jnp.int32(499))
    _, state3, _, done, _ = env.step(jax.random.PRNGKey(2), old, 0)
    assert bool(done) and int(state3.time) == 0


@pytest.fixture(scope="module")
def compiled() -> list[dict[str, Any]]:
    if xla_gpu.gpu_target_missing():
        pytest.skip("the gpu-target extra is not installed")
    corpus = _corpus()
    # without the cuBLAS variant of each GEMM fusion (a second compile per program: the
    # fallback flag is read by the device's autotuner only, so the compile is the same)
    environ = {"XLA_FLAGS": "--xla_gpu_cublas_fallback=false"}
    return list(corpus.compile_corpus(_names(), list(CARDS), "small", environ))


@pytest.mark.slow
def test_every_corpus_program_gives_an_estimate_for_two_cards(
    compiled: list[dict[str, Any]],
) -> None:
    got = {(r["program"], r["compiled_for"].split(" (")[0]) for r in compiled}
    assert got == {(p, cc) for p in _names() for cc in ("cuda sm_89", "cuda sm_80")}
    for row in compiled:
        assert row["peak_bytes_in_use"] >= row["executable_peak_bytes"] > 0, row
        assert row["fits"] is True, row
    by = {(r["program"], r["gpu"]): r for r in compiled}
    # the PureJaxRL and purejaxql programs log through jax.debug.callback: compiled without
    # it, what it holds added
    for name in ("purejaxrl_ppo_brax", "purejaxrl_dqn", "purejaxql_pqn"):
        assert by[(name, "NVIDIA GeForce RTX 4070")]["route"] == "callbacks"
        assert "debug_callback" in by[(name, "NVIDIA GeForce RTX 4070")]["callbacks"]
    assert by[("brax_ppo_train", "NVIDIA GeForce RTX 4070")]["route"] == "export"


@pytest.mark.slow
def test_the_stacked_metrics_and_replay_buffer_are_in_the_outputs(
    compiled: list[dict[str, Any]],
) -> None:
    corpus = _corpus()
    rows = {r["program"]: r for r in compiled if r["gpu"] == "NVIDIA GeForce RTX 4070"}
    # PPO's per-step info stacked over the run: updates x steps x envs x 4 fields of 4 bytes
    c = corpus.PPO_SMALL
    updates = int(c["TOTAL_TIMESTEPS"] // c["NUM_STEPS"] // c["NUM_ENVS"])
    info = updates * c["NUM_STEPS"] * c["NUM_ENVS"] * 4 * 4
    assert rows["purejaxrl_ppo_brax"]["output_bytes"] >= info
    # DQN's flashbax buffer is carried through the run and returned, per seed: 500
    # transitions of 4 observations, an action, a reward and a done flag, twice over seeds
    d = corpus.DQN_SMALL
    buffer = d["NUM_SEEDS"] * d["BUFFER_SIZE"] * (4 * 4 + 4 + 4 + 1)
    assert rows["purejaxrl_dqn"]["output_bytes"] >= buffer


@pytest.mark.slow
def test_brax_sac_holds_its_replay_buffer_on_the_card(compiled: list[dict[str, Any]]) -> None:
    from brax import envs

    corpus = _corpus()
    rows = {r["program"]: r for r in compiled if r["gpu"] == "NVIDIA GeForce RTX 4070"}
    assert rows["brax_sac_train"]["route"] == "export"
    # Brax's UniformSamplingQueue: max_replay_size flattened transitions (observation and
    # next observation, action, reward, discount, truncation), float32, donated and returned
    c = corpus.BRAX_SAC_SMALL
    env = envs.get_environment(c["env"])
    row = 2 * int(env.observation_size) + int(env.action_size) + 3
    held = corpus.holds("brax_sac_train", "small")  # training, env, buffer states; metrics
    assert held["2"] >= c["max_replay_size"] * row * 4
    assert rows["brax_sac_train"]["output_bytes"] >= held["total"]
