"""A PureJaxRL-style whole-loop DQN trainer with flashbax's replay buffer (issue 30).

The trainer is ``luchris429/purejaxrl``'s ``purejaxrl/dqn.py`` (``make_train``: the whole run
is one ``jax.lax.scan`` of update steps, jitted once), with its flashbax flat buffer, Flax
Q-network, optax Adam and per-update metrics stacked over the run. The gymnax environment is
replaced by a stand-in with CartPole-v1's shapes (4 float32 observations, 2 actions), since
gymnax is not a dependency. memfit estimates it as one XLA program: the replay buffer is
carried through the loop and returned, so its arrays are among the outputs, exactly as
flashbax lays them out, and the metrics grow with the number of updates.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
fbx = pytest.importorskip("flashbax", reason="the replay buffer under test is flashbax's")
nn = pytest.importorskip("flax.linen")
optax = pytest.importorskip("optax")
chex = pytest.importorskip("chex")

from flax.training.train_state import TrainState  # noqa: E402

from memfit.estimate.xla.step import estimate_jax  # noqa: E402

OBS, ACTIONS = 4, 2  # CartPole-v1


class QNetwork(nn.Module):  # type: ignore[misc]
    action_dim: int

    @nn.compact
    def __call__(self, x: Any) -> Any:
        x = nn.relu(nn.Dense(120)(x))
        x = nn.relu(nn.Dense(84)(x))
        return nn.Dense(self.action_dim)(x)


@chex.dataclass(frozen=True)
class TimeStep:
    obs: Any
    action: Any
    reward: Any
    done: Any


class CustomTrainState(TrainState):  # type: ignore[misc]
    target_network_params: Any
    timesteps: int
    n_updates: int


def _env_reset(key: Any) -> Any:
    state = jax.random.uniform(key, (OBS,), minval=-0.05, maxval=0.05)
    return state, state


def _env_step(key: Any, state: Any, action: Any) -> Any:
    state = state + 0.02 * (action.astype(jnp.float32) * 2 - 1)
    done = (jnp.abs(state[0]) > 2.4) | (jax.random.uniform(key) < 0.01)
    _, new_state = _env_reset(key)
    state = jnp.where(done, new_state, state)
    return state, state, jnp.float32(1.0), done, {"returned_episode_returns": jnp.float32(1)}


def make_train(config: dict[str, Any]) -> Any:
    """purejaxrl/dqn.py's ``make_train``, its gymnax env replaced by the stand-in above."""
    num_updates = config["TOTAL_TIMESTEPS"] // config["NUM_ENVS"]
    n_envs = config["NUM_ENVS"]

    def vmap_reset(rng: Any) -> Any:
        return jax.vmap(_env_reset)(jax.random.split(rng, n_envs))

    def vmap_step(rng: Any, env_state: Any, action: Any) -> Any:
        return jax.vmap(_env_step)(jax.random.split(rng, n_envs), env_state, action)

    def train(rng: Any) -> Any:
        rng, _rng = jax.random.split(rng)
        init_obs, env_state = vmap_reset(_rng)
        buffer = fbx.make_flat_buffer(
            max_length=config["BUFFER_SIZE"],
            min_length=config["BUFFER_BATCH_SIZE"],
            sample_batch_size=config["BUFFER_BATCH_SIZE"],
            add_sequences=False,
            add_batch_size=n_envs,
        )
        _timestep = TimeStep(
            obs=jnp.zeros(OBS), action=jnp.int32(0), reward=jnp.float32(0), done=jnp.bool_(False)
        )
        buffer_state = buffer.init(_timestep)
        network = QNetwork(action_dim=ACTIONS)
        rng, _rng = jax.random.split(rng)
        network_params = network.init(_rng, jnp.zeros(OBS))
        train_state = CustomTrainState.create(
            apply_fn=network.apply,
            params=network_params,
            target_network_params=jax.tree_util.tree_map(jnp.copy, network_params),
            tx=optax.adam(learning_rate=config["LR"]),
            timesteps=0,
            n_updates=0,
        )

        def _update_step(runner_state: Any, unused: Any) -> Any:
            train_state, buffer_state, env_state, last_obs, rng = runner_state
            rng, rng_a, rng_s = jax.random.split(rng, 3)
            q_vals = network.apply(train_state.params, last_obs)
            greedy = jnp.argmax(q_vals, axis=-1)
            explore = jax.random.randint(rng_a, greedy.shape, 0, ACTIONS)
            action = jnp.where(jax.random.uniform(rng_a, greedy.shape) < 0.1, explore, greedy)
            obs, env_state, reward, done, info = vmap_step(rng_s, env_state, action)
            train_state = train_state.replace(timesteps=train_state.timesteps + n_envs)
            timestep = TimeStep(obs=last_obs, action=action, reward=reward, done=done)
            buffer_state = buffer.add(buffer_state, timestep)

            def _learn_phase(train_state: Any, rng: Any) -> Any:
                learn_batch = buffer.sample(buffer_state, rng).experience
                q_next = network.apply(
                    train_state.target_network_params, learn_batch.second.obs
                ).max(axis=-1)
                target = learn_batch.first.reward + (1 - learn_batch.first.done) * 0.99 * q_next

                def _loss_fn(params: Any) -> Any:
                    q = network.apply(params, learn_batch.first.obs)
                    chosen = jnp.take_along_axis(
                        q, jnp.expand_dims(learn_batch.first.action, axis=-1), axis=-1
                    ).squeeze(axis=-1)
                    return jnp.mean((chosen - target) ** 2)

                loss, grads = jax.value_and_grad(_loss_fn)(train_state.params)
                train_state = train_state.apply_gradients(grads=grads)
                return train_state.replace(n_updates=train_state.n_updates + 1), loss

            rng, _rng = jax.random.split(rng)
            is_learn_time = buffer.can_sample(buffer_state) & (
                train_state.timesteps > config["LEARNING_STARTS"]
            )
            train_state, loss = jax.lax.cond(
                is_learn_time,
                _learn_phase,
                lambda train_state, rng: (train_state, jnp.array(0.0)),
                train_state,
                _rng,
            )
            metrics = {
                "timesteps": train_state.timesteps,
                "updates": train_state.n_updates,
                "loss": loss.mean(),
                "returns": info["returned_episode_returns"].mean(),
            }
            return (train_state, buffer_state, env_state, obs, rng), metrics

        rng, _rng = jax.random.split(rng)
        runner_state = (train_state, buffer_state, env_state, init_obs, _rng)
        runner_state, metrics = jax.lax.scan(_update_step, runner_state, None, num_updates)
        return {"runner_state": runner_state, "metrics": metrics}

    return train


CONFIG = {
    "NUM_ENVS": 10,
    "BUFFER_SIZE": 10_000,
    "BUFFER_BATCH_SIZE": 128,
    "TOTAL_TIMESTEPS": 5_000,
    "LEARNING_STARTS": 1_000,
    "LR": 2.5e-4,
}
KEY = jax.ShapeDtypeStruct((2,), jnp.uint32)
#: One stored transition: 4 float32 observations, an int32 action, a float32 reward, a bool.
TRANSITION_BYTES = OBS * 4 + 4 + 4 + 1


@functools.cache
def _estimate(**changes: int) -> Any:
    return estimate_jax(jax.jit(make_train({**CONFIG, **changes})), KEY, compiler="cpu")


def test_the_replay_buffer_is_in_the_estimate_as_flashbax_lays_it_out() -> None:
    base = _estimate()
    larger = _estimate(BUFFER_SIZE=20_000)
    # the buffer (add_batch_size x max_length / add_batch_size transitions) is carried through
    # the scan and returned: 10,000 more transitions, exactly their bytes more
    assert larger.output_bytes - base.output_bytes == 10_000 * TRANSITION_BYTES
    assert base.output_bytes >= CONFIG["BUFFER_SIZE"] * TRANSITION_BYTES


def test_per_update_metrics_stack_over_the_run() -> None:
    base = _estimate()
    longer = _estimate(TOTAL_TIMESTEPS=10_000)
    # 500 more updates, each stacking four scalar metrics (two int32, two float32)
    assert longer.output_bytes - base.output_bytes == 500 * 4 * 4
