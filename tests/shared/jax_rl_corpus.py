"""A corpus of real JAX RL programs, compiled deviceless for named cards (issue 43).

    python bench/jax_corpus.py --gpu "RTX 4070" --gpu "A100 40GB" [--size small|default]

Every program is a whole training run jitted as its authors jit it (PureJaxRL and purejaxql
put the run in one ``jax.lax.scan``; Brax jits one training epoch), written here from the
published source (named in each builder's docstring; the algorithms and their default
hyperparameters, not the code), with the host callbacks those programs log through. Each
builder returns ``(jitted, args)``; ``args`` are ``jax.ShapeDtypeStruct``, so nothing runs.

- ``purejaxrl_ppo_brax``: PureJaxRL's continuous PPO (``purejaxrl/ppo_continuous_action.py``,
  luchris429/purejaxrl, Apache-2.0) on a Brax env through PureJaxRL's wrappers (episode and
  auto-reset, logging, action clipping, vmapped envs, observation and reward normalization),
  logging with ``jax.debug.callback`` (``DEBUG: True``). Default: hopper (positional
  backend), 2048 envs x 10 steps, 2441 updates, 4 epochs of 32 minibatches.
- ``purejaxrl_dqn``: PureJaxRL's DQN (``purejaxrl/dqn.py``, Apache-2.0) with flashbax's flat
  replay buffer (InstaDeep, Apache-2.0) on a gymnax-style CartPole-v1 (gymnax's dynamics,
  RobertTLange/gymnax, Apache-2.0), seeds vmapped, logging with ``jax.debug.callback``.
  Default: 10 envs, a 10,000-transition buffer, batches of 128, 50,000 updates.
- ``purejaxql_pqn``: PQN (``purejaxql/pqn_gymnax.py``, mttga/purejaxql, Apache-2.0; config
  ``pqn_cartpole.yaml``) on the same CartPole: a LayerNorm Q-network, Q(lambda) targets, no
  replay buffer. Default: 32 envs x 64 steps, 244 updates, 4 epochs of 16 minibatches.
- ``brax_ppo_train``: Brax's own ``ppo.train`` training epoch (google/brax, Apache-2.0),
  captured as :mod:`memfit.estimate.brax_measure` captures it. Default: ant (positional),
  Brax's published ant settings (4096 envs, batch 2048, 32 minibatches, unroll 5, 4 updates
  per batch).
- ``brax_sac_train``: Brax's own ``sac.train`` training epoch (google/brax, Apache-2.0),
  captured the same way (the env's reset and the replay buffer's init evaluated abstractly).
  Default: hopper (positional), Brax's published hopper SAC settings (128 envs, batch 512,
  64 gradient updates per step, a replay buffer of 1,048,576 transitions).
- ``jumanji_a2c_snake``: jumanji's A2C on its Snake (instadeepai/jumanji 1.1.2, Apache-2.0):
  the installed env, the training rebuilt in flax from jumanji's ``training/`` (its haiku
  and rlax are not installed). Default: jumanji's Snake config (128 envs x 20 steps, 500
  learner steps per epoch, 32-channel convolutions).

``--size small`` shrinks every count (and uses Brax's ``fast`` env) so that CI compiles the
whole corpus for two cards; ``default`` is each source's own configuration. Writes JSON and a
markdown table to ``bench/out/jax_corpus*``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, NamedTuple

Program = tuple[Callable[..., Any], tuple[Any, ...]]


# -- a gymnax-style CartPole-v1 (gymnax's classic_control/cartpole.py dynamics) ---------------


class CartPoleState(NamedTuple):
    x: Any
    x_dot: Any
    theta: Any
    theta_dot: Any
    time: Any


class CartPole:
    """CartPole-v1 as gymnax writes it: functional ``reset(key)`` / ``step(key, state,
    action)``, 4 float32 observations, 2 actions, automatic reset on ``done``, 500 steps."""

    num_actions = 2
    obs_size = 4

    def _obs(self, s: CartPoleState) -> Any:
        import jax.numpy as jnp

        return jnp.stack([s.x, s.x_dot, s.theta, s.theta_dot])

    def reset(self, key: Any) -> tuple[Any, CartPoleState]:
        import jax
        import jax.numpy as jnp

        x = jax.random.uniform(key, (4,), minval=-0.05, maxval=0.05)
        state = CartPoleState(x[0], x[1], x[2], x[3], jnp.int32(0))
        return self._obs(state), state

    def step(self, key: Any, state: CartPoleState, action: Any) -> tuple[Any, ...]:
        import jax
        import jax.numpy as jnp

        gravity, masscart, masspole, length, force_mag, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
        total_mass, polemass_length = masscart + masspole, masspole * length
        force = force_mag * action - force_mag * (1 - action)
        cos, sin = jnp.cos(state.theta), jnp.sin(state.theta)
        temp = (force + polemass_length * state.theta_dot**2 * sin) / total_mass
        theta_acc = (gravity * sin - cos * temp) / (
            length * (4.0 / 3.0 - masspole * cos**2 / total_mass)
        )
        x_acc = temp - polemass_length * theta_acc * cos / total_mass
        new = CartPoleState(
            state.x + tau * state.x_dot,
            state.x_dot + tau * x_acc,
            state.theta + tau * state.theta_dot,
            state.theta_dot + tau * theta_acc,
            state.time + 1,
        )
        done = (
            (jnp.abs(new.x) > 2.4)
            | (jnp.abs(new.theta) > 12 * 2 * math.pi / 360)
            | (new.time >= 500)
        )
        reward = jnp.float32(1.0)
        obs_reset, state_reset = self.reset(key)
        state = jax.tree_util.tree_map(lambda r, n: jnp.where(done, r, n), state_reset, new)
        obs = jnp.where(done, obs_reset, self._obs(new))
        return obs, state, reward, done, {}


# -- PureJaxRL's wrappers (purejaxrl/wrappers.py), written for these programs -----------------


class LogState(NamedTuple):
    env_state: Any
    episode_returns: Any
    episode_lengths: Any
    returned_episode_returns: Any
    returned_episode_lengths: Any
    timestep: Any


class LogWrapper:
    """Episode returns and lengths kept in the state and reported in ``info``."""

    def __init__(self, env: Any) -> None:
        self.env = env

    def reset(self, key: Any) -> tuple[Any, LogState]:
        import jax.numpy as jnp

        obs, state = self.env.reset(key)
        zero = jnp.float32(0.0)
        return obs, LogState(state, zero, jnp.int32(0), zero, jnp.int32(0), jnp.int32(0))

    def step(self, key: Any, state: LogState, action: Any) -> tuple[Any, ...]:
        obs, env_state, reward, done, info = self.env.step(key, state.env_state, action)
        returns = state.episode_returns + reward
        lengths = state.episode_lengths + 1
        new = LogState(
            env_state,
            returns * (1 - done),
            lengths * (1 - done),
            state.returned_episode_returns * (1 - done) + returns * done,
            state.returned_episode_lengths * (1 - done) + lengths * done,
            state.timestep + 1,
        )
        info = {
            **info,
            "returned_episode_returns": new.returned_episode_returns,
            "returned_episode_lengths": new.returned_episode_lengths,
            "timestep": new.timestep,
            "returned_episode": done,
        }
        return obs, new, reward, done, info


class BraxEnv:
    """A Brax env as PureJaxRL's ``BraxGymnaxWrapper`` presents it: ``EpisodeWrapper`` (1000
    steps) and ``AutoResetWrapper``, ``reset(key)`` / ``step(key, state, action)``."""

    def __init__(self, name: str, backend: str = "positional") -> None:
        from brax import envs
        from brax.envs.wrappers.training import AutoResetWrapper, EpisodeWrapper

        kwargs = {} if name == "fast" else {"backend": backend}
        env = envs.get_environment(name, **kwargs)
        self.env = AutoResetWrapper(EpisodeWrapper(env, episode_length=1000, action_repeat=1))
        self.action_size = int(env.action_size)
        self.obs_size = int(env.observation_size)

    def reset(self, key: Any) -> tuple[Any, Any]:
        state = self.env.reset(key)
        return state.obs, state

    def step(self, key: Any, state: Any, action: Any) -> tuple[Any, ...]:
        del key
        state = self.env.step(state, action)
        return state.obs, state, state.reward, state.done > 0.5, {}


class NormState(NamedTuple):
    mean: Any
    var: Any
    count: Any
    env_state: Any


class VecNormalize:
    """Vmapped envs with running observation normalization and, like PureJaxRL's
    ``NormalizeVecReward``, running return normalization (both kept in the state)."""

    def __init__(self, env: Any, num_envs: int, gamma: float) -> None:
        self.env, self.num_envs, self.gamma = env, num_envs, gamma

    def _update(self, mean: Any, var: Any, count: Any, batch: Any) -> tuple[Any, Any, Any]:
        import jax.numpy as jnp

        b_mean, b_var, b_count = jnp.mean(batch, axis=0), jnp.var(batch, axis=0), batch.shape[0]
        delta, total = b_mean - mean, count + b_count
        new_mean = mean + delta * b_count / total
        m2 = var * count + b_var * b_count + jnp.square(delta) * count * b_count / total
        return new_mean, m2 / total, total

    def reset(self, key: Any) -> tuple[Any, Any]:
        import jax
        import jax.numpy as jnp

        obs, state = jax.vmap(self.env.reset)(jax.random.split(key, self.num_envs))
        mean, var, count = self._update(
            jnp.zeros(obs.shape[1:]), jnp.ones(obs.shape[1:]), 1e-4, obs
        )
        ret = (jnp.zeros(()), jnp.ones(()), jnp.float32(1e-4), jnp.zeros((self.num_envs,)))
        state = NormState(mean, var, count, (state, ret))
        return (obs - mean) / jnp.sqrt(var + 1e-8), state

    def step(self, key: Any, state: NormState, action: Any) -> tuple[Any, ...]:
        import jax
        import jax.numpy as jnp

        env_state, (r_mean, r_var, r_count, returns) = state.env_state
        keys = jax.random.split(key, self.num_envs)
        obs, env_state, reward, done, info = jax.vmap(self.env.step)(keys, env_state, action)
        mean, var, count = self._update(state.mean, state.var, state.count, obs)
        returns = returns * self.gamma * (1 - done) + reward
        r_mean, r_var, r_count = self._update(r_mean, r_var, r_count, returns[:, None])
        r_mean, r_var = r_mean.reshape(()), r_var.reshape(())
        new = NormState(mean, var, count, (env_state, (r_mean, r_var, r_count, returns)))
        obs = (obs - mean) / jnp.sqrt(var + 1e-8)
        return obs, new, reward / jnp.sqrt(r_var + 1e-8), done, info


def _ortho(scale: float) -> Any:
    from flax import linen as nn

    return nn.initializers.orthogonal(scale)


def _train_state(apply: Any, params: Any, tx: Any) -> Any:
    from flax.training.train_state import TrainState

    return TrainState.create(apply_fn=apply, params=params, tx=tx)


def _log_callback(metric: Any) -> None:
    """What the published programs do with their metrics on the host (print or log)."""
    del metric


# -- PureJaxRL PPO, continuous actions, on a Brax env -----------------------------------------


PPO_DEFAULT: dict[str, Any] = {
    "LR": 3e-4, "NUM_ENVS": 2048, "NUM_STEPS": 10, "TOTAL_TIMESTEPS": 5e7, "UPDATE_EPOCHS": 4,
    "NUM_MINIBATCHES": 32, "GAMMA": 0.99, "GAE_LAMBDA": 0.95, "CLIP_EPS": 0.2, "ENT_COEF": 0.0,
    "VF_COEF": 0.5, "MAX_GRAD_NORM": 0.5, "ENV_NAME": "hopper", "DEBUG": True,
}  # fmt: skip
PPO_SMALL: dict[str, Any] = {
    **PPO_DEFAULT, "NUM_ENVS": 16, "NUM_STEPS": 8, "TOTAL_TIMESTEPS": 16 * 8 * 3,
    "NUM_MINIBATCHES": 4, "UPDATE_EPOCHS": 2, "ENV_NAME": "fast",
}  # fmt: skip


def purejaxrl_ppo_brax(config: dict[str, Any] | None = None) -> Program:
    """PureJaxRL's ``make_train`` for continuous PPO (luchris429/purejaxrl,
    ``purejaxrl/ppo_continuous_action.py``, Apache-2.0) on a Brax env: actor and critic MLPs
    of 256 x 2 (tanh, orthogonal init), a diagonal Gaussian with a learned log-std, GAE,
    clipped value and policy losses, Adam with global-norm clipping; the whole run one scan of
    updates, each a scan of env steps then epochs of shuffled minibatches; the per-step info
    stacked as the run's metrics and passed to ``jax.debug.callback``."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import linen as nn

    c = dict(PPO_SMALL if config is None else config)
    num_updates = int(c["TOTAL_TIMESTEPS"] // c["NUM_STEPS"] // c["NUM_ENVS"])
    minibatch = c["NUM_ENVS"] * c["NUM_STEPS"] // c["NUM_MINIBATCHES"]
    base = BraxEnv(c["ENV_NAME"])
    env = VecNormalize(LogWrapper(base), c["NUM_ENVS"], c["GAMMA"])
    action_dim = base.action_size

    class ActorCritic(nn.Module):  # type: ignore[misc]
        @nn.compact
        def __call__(self, x: Any) -> tuple[Any, Any, Any]:
            a = nn.tanh(nn.Dense(256, kernel_init=_ortho(math.sqrt(2)))(x))
            a = nn.tanh(nn.Dense(256, kernel_init=_ortho(math.sqrt(2)))(a))
            mean = nn.Dense(action_dim, kernel_init=_ortho(0.01))(a)
            log_std = self.param("log_std", nn.initializers.zeros, (action_dim,))
            v = nn.tanh(nn.Dense(256, kernel_init=_ortho(math.sqrt(2)))(x))
            v = nn.tanh(nn.Dense(256, kernel_init=_ortho(math.sqrt(2)))(v))
            v = nn.Dense(1, kernel_init=_ortho(1.0))(v)
            return mean, log_std, jnp.squeeze(v, -1)

    def log_prob(mean: Any, log_std: Any, a: Any) -> Any:
        z = (a - mean) / jnp.exp(log_std)
        return jnp.sum(-0.5 * z**2 - log_std - 0.5 * math.log(2 * math.pi), axis=-1)

    net = ActorCritic()
    tx = optax.chain(optax.clip_by_global_norm(c["MAX_GRAD_NORM"]), optax.adam(c["LR"], eps=1e-5))

    class Transition(NamedTuple):
        done: Any
        action: Any
        value: Any
        reward: Any
        log_prob: Any
        obs: Any
        info: Any

    def train(rng: Any) -> Any:
        rng, k_net, k_env = jax.random.split(rng, 3)
        params = net.init(k_net, jnp.zeros((base.obs_size,)))
        state = _train_state(net.apply, params, tx)
        obs, env_state = env.reset(k_env)

        def update(runner: Any, _: Any) -> Any:
            def env_step(carry: Any, _: Any) -> Any:
                state, env_state, last_obs, rng = carry
                rng, k_act, k_step = jax.random.split(rng, 3)
                mean, log_std, value = net.apply(state.params, last_obs)
                action = mean + jnp.exp(log_std) * jax.random.normal(k_act, mean.shape)
                lp = log_prob(mean, log_std, action)
                obs, env_state, reward, done, info = env.step(
                    k_step, env_state, jnp.clip(action, -1.0, 1.0)
                )
                t = Transition(done, action, value, reward, lp, last_obs, info)
                return (state, env_state, obs, rng), t

            runner, traj = jax.lax.scan(env_step, runner, None, c["NUM_STEPS"])
            state, env_state, last_obs, rng = runner
            _, _, last_val = net.apply(state.params, last_obs)

            def gae_step(carry: Any, t: Any) -> Any:
                gae, next_value = carry
                delta = t.reward + c["GAMMA"] * next_value * (1 - t.done) - t.value
                gae = delta + c["GAMMA"] * c["GAE_LAMBDA"] * (1 - t.done) * gae
                return (gae, t.value), gae

            _, adv = jax.lax.scan(
                gae_step, (jnp.zeros_like(last_val), last_val), traj, reverse=True, unroll=16
            )
            targets = adv + traj.value

            def epoch(carry: Any, _: Any) -> Any:
                state, rng = carry
                rng, k_perm = jax.random.split(rng)
                size = c["NUM_ENVS"] * c["NUM_STEPS"]
                batch = jax.tree_util.tree_map(
                    lambda x: x.reshape((size, *x.shape[2:])), (traj, adv, targets)
                )
                perm = jax.random.permutation(k_perm, size)
                minis = jax.tree_util.tree_map(
                    lambda x: jnp.take(x, perm, axis=0).reshape(
                        (c["NUM_MINIBATCHES"], minibatch, *x.shape[1:])
                    ),
                    batch,
                )

                def minibatch_step(state: Any, mb: Any) -> Any:
                    t, gae, tgt = mb

                    def loss(params: Any) -> Any:
                        mean, log_std, value = net.apply(params, t.obs)
                        lp = log_prob(mean, log_std, t.action)
                        clipped = t.value + (value - t.value).clip(-c["CLIP_EPS"], c["CLIP_EPS"])
                        v_loss = (
                            0.5
                            * jnp.maximum(jnp.square(value - tgt), jnp.square(clipped - tgt)).mean()
                        )
                        ratio = jnp.exp(lp - t.log_prob)
                        g = (gae - gae.mean()) / (gae.std() + 1e-8)
                        pg = -jnp.minimum(
                            ratio * g, jnp.clip(ratio, 1 - c["CLIP_EPS"], 1 + c["CLIP_EPS"]) * g
                        ).mean()
                        entropy = jnp.sum(log_std + 0.5 * math.log(2 * math.pi * math.e))
                        return pg + c["VF_COEF"] * v_loss - c["ENT_COEF"] * entropy

                    value, grads = jax.value_and_grad(loss)(state.params)
                    return state.apply_gradients(grads=grads), value

                state, losses = jax.lax.scan(minibatch_step, state, minis)
                return (state, rng), losses

            (state, rng), _ = jax.lax.scan(epoch, (state, rng), None, c["UPDATE_EPOCHS"])
            metric = traj.info
            if c["DEBUG"]:
                jax.debug.callback(_log_callback, metric)
            return (state, env_state, last_obs, rng), metric

        rng, k = jax.random.split(rng)
        runner, metrics = jax.lax.scan(update, (state, env_state, obs, k), None, num_updates)
        return {"runner_state": runner, "metrics": metrics}

    return jax.jit(train), (jax.ShapeDtypeStruct((2,), jnp.uint32),)


# -- PureJaxRL DQN with flashbax's flat buffer -----------------------------------------------


DQN_DEFAULT: dict[str, Any] = {
    "NUM_ENVS": 10, "BUFFER_SIZE": 10000, "BUFFER_BATCH_SIZE": 128, "TOTAL_TIMESTEPS": 5e5,
    "EPSILON_START": 1.0, "EPSILON_FINISH": 0.05, "EPSILON_ANNEAL_TIME": 25e4,
    "TARGET_UPDATE_INTERVAL": 500, "LR": 2.5e-4, "LEARNING_STARTS": 10000,
    "TRAINING_INTERVAL": 10, "GAMMA": 0.99, "TAU": 1.0, "NUM_SEEDS": 1,
}  # fmt: skip
DQN_SMALL: dict[str, Any] = {
    **DQN_DEFAULT, "BUFFER_SIZE": 500, "BUFFER_BATCH_SIZE": 32, "TOTAL_TIMESTEPS": 10 * 20,
    "NUM_SEEDS": 2,
}  # fmt: skip


def purejaxrl_dqn(config: dict[str, Any] | None = None) -> Program:
    """PureJaxRL's DQN ``make_train`` (luchris429/purejaxrl, ``purejaxrl/dqn.py``,
    Apache-2.0): a Q-network of 120 and 84 ReLU units, flashbax's flat buffer
    (``make_flat_buffer``, transitions of one env step added per vectorized step), epsilon-
    greedy exploration, learning every ``TRAINING_INTERVAL`` steps once ``LEARNING_STARTS``
    are stored (``lax.cond``), the target network updated every ``TARGET_UPDATE_INTERVAL``;
    the run one scan of env steps, its metrics passed to ``jax.debug.callback`` (the wandb
    logging), seeds vmapped (``jax.jit(jax.vmap(make_train(config)))``)."""
    import flashbax as fbx
    import jax
    import jax.numpy as jnp
    import optax
    from flax import linen as nn
    from flax.training.train_state import TrainState

    c = dict(DQN_SMALL if config is None else config)
    num_updates = int(c["TOTAL_TIMESTEPS"] // c["NUM_ENVS"])
    env = LogWrapper(CartPole())

    class QNetwork(nn.Module):  # type: ignore[misc]
        @nn.compact
        def __call__(self, x: Any) -> Any:
            x = nn.relu(nn.Dense(120)(x))
            x = nn.relu(nn.Dense(84)(x))
            return nn.Dense(CartPole.num_actions)(x)

    class DQNState(TrainState):  # type: ignore[misc]
        target_network_params: Any
        timesteps: Any
        n_updates: Any

    net = QNetwork()
    buffer = fbx.make_flat_buffer(
        max_length=c["BUFFER_SIZE"], min_length=c["BUFFER_BATCH_SIZE"],
        sample_batch_size=c["BUFFER_BATCH_SIZE"], add_sequences=False,
        add_batch_size=c["NUM_ENVS"],
    )  # fmt: skip

    def train(rng: Any) -> Any:
        rng, k_env, k_net = jax.random.split(rng, 3)
        obs, env_state = jax.vmap(env.reset)(jax.random.split(k_env, c["NUM_ENVS"]))
        one = {"obs": obs[0], "action": jnp.int32(0), "reward": jnp.float32(0.0),
               "done": jnp.bool_(False)}  # fmt: skip
        buffer_state = buffer.init(one)
        params = net.init(k_net, jnp.zeros((CartPole.obs_size,)))
        state = DQNState.create(
            apply_fn=net.apply, params=params, target_network_params=params,
            tx=optax.adam(c["LR"]), timesteps=0, n_updates=0,
        )  # fmt: skip

        def update(runner: Any, _: Any) -> Any:
            state, buffer_state, env_state, last_obs, rng = runner
            rng, k_a, k_e, k_s, k_b = jax.random.split(rng, 5)
            q = net.apply(state.params, last_obs)
            frac = jnp.clip(state.timesteps / c["EPSILON_ANNEAL_TIME"], 0.0, 1.0)
            eps = c["EPSILON_START"] + frac * (c["EPSILON_FINISH"] - c["EPSILON_START"])
            greedy = jnp.argmax(q, axis=-1)
            random = jax.random.randint(k_a, greedy.shape, 0, CartPole.num_actions)
            explore = jax.random.uniform(k_e, greedy.shape) < eps
            action = jnp.where(explore, random, greedy)
            obs, env_state, reward, done, info = jax.vmap(env.step)(
                jax.random.split(k_s, c["NUM_ENVS"]), env_state, action
            )
            state = state.replace(timesteps=state.timesteps + c["NUM_ENVS"])
            buffer_state = buffer.add(
                buffer_state,
                {"obs": last_obs, "action": action, "reward": reward, "done": done},
            )

            def learn(state: Any) -> Any:
                batch = buffer.sample(buffer_state, k_b).experience
                q_next = net.apply(state.target_network_params, batch.second["obs"])
                target = batch.first["reward"] + (1 - batch.first["done"]) * c["GAMMA"] * jnp.max(
                    q_next, axis=-1
                )

                def loss(params: Any) -> Any:
                    q = net.apply(params, batch.first["obs"])
                    chosen = jnp.take_along_axis(
                        q, batch.first["action"][:, None], axis=-1
                    ).squeeze(-1)
                    return jnp.mean((chosen - target) ** 2)

                value, grads = jax.value_and_grad(loss)(state.params)
                state = state.apply_gradients(grads=grads).replace(n_updates=state.n_updates + 1)
                return state, value

            is_learn = (
                buffer.can_sample(buffer_state)
                & (state.timesteps > c["LEARNING_STARTS"])
                & (state.timesteps % c["TRAINING_INTERVAL"] == 0)
            )
            state, loss_value = jax.lax.cond(
                is_learn, learn, lambda s: (s, jnp.float32(0.0)), state
            )
            state = jax.lax.cond(
                state.timesteps % c["TARGET_UPDATE_INTERVAL"] == 0,
                lambda s: s.replace(
                    target_network_params=optax.incremental_update(
                        s.params, s.target_network_params, c["TAU"]
                    )
                ),
                lambda s: s,
                state,
            )
            metrics = {
                "timesteps": state.timesteps,
                "updates": state.n_updates,
                "loss": loss_value.mean(),
                "returns": info["returned_episode_returns"].mean(),
            }
            jax.debug.callback(_log_callback, metrics)
            return (state, buffer_state, env_state, obs, rng), metrics

        rng, k = jax.random.split(rng)
        runner, metrics = jax.lax.scan(
            update, (state, buffer_state, env_state, obs, k), None, num_updates
        )
        return {"runner_state": runner, "metrics": metrics}

    keys = jax.ShapeDtypeStruct((c["NUM_SEEDS"], 2), jnp.uint32)
    return jax.jit(jax.vmap(train)), (keys,)


# -- PQN (purejaxql) -------------------------------------------------------------------------


PQN_DEFAULT: dict[str, Any] = {
    "TOTAL_TIMESTEPS": 5e5, "NUM_ENVS": 32, "NUM_STEPS": 64, "EPS_START": 1.0,
    "EPS_FINISH": 0.2, "EPS_DECAY": 0.2, "NUM_MINIBATCHES": 16, "NUM_EPOCHS": 4,
    "HIDDEN_SIZE": 256, "NUM_LAYERS": 2, "LR": 1e-4, "MAX_GRAD_NORM": 10.0, "REW_SCALE": 0.1,
    "GAMMA": 0.99, "LAMBDA": 0.95,
}  # fmt: skip
PQN_SMALL: dict[str, Any] = {
    **PQN_DEFAULT, "NUM_ENVS": 8, "NUM_STEPS": 8, "TOTAL_TIMESTEPS": 8 * 8 * 3,
    "NUM_MINIBATCHES": 4, "NUM_EPOCHS": 2, "HIDDEN_SIZE": 64,
}  # fmt: skip


def purejaxql_pqn(config: dict[str, Any] | None = None) -> Program:
    """PQN's ``make_train`` (mttga/purejaxql, ``purejaxql/pqn_gymnax.py`` with
    ``config/alg/pqn_cartpole.yaml``, Apache-2.0): a Q-network of ``NUM_LAYERS`` dense layers
    with LayerNorm and ReLU, epsilon-greedy rollouts of ``NUM_STEPS`` over ``NUM_ENVS``
    vectorized envs, Q(lambda) targets computed backwards over the rollout, epochs of shuffled
    minibatches with Adam and global-norm clipping; no replay buffer, no target network; the
    run one scan of updates with its metrics passed to ``jax.debug.callback``."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import linen as nn

    c = dict(PQN_SMALL if config is None else config)
    num_updates = int(c["TOTAL_TIMESTEPS"] // c["NUM_STEPS"] // c["NUM_ENVS"])
    env = LogWrapper(CartPole())

    class QNetwork(nn.Module):  # type: ignore[misc]
        @nn.compact
        def __call__(self, x: Any) -> Any:
            for _ in range(c["NUM_LAYERS"]):
                x = nn.relu(nn.LayerNorm()(nn.Dense(c["HIDDEN_SIZE"])(x)))
            return nn.Dense(CartPole.num_actions)(x)

    class Transition(NamedTuple):
        obs: Any
        action: Any
        reward: Any
        done: Any
        next_obs: Any
        q_val: Any

    net = QNetwork()
    tx = optax.chain(optax.clip_by_global_norm(c["MAX_GRAD_NORM"]), optax.radam(c["LR"]))

    def train(rng: Any) -> Any:
        rng, k_env, k_net = jax.random.split(rng, 3)
        obs, env_state = jax.vmap(env.reset)(jax.random.split(k_env, c["NUM_ENVS"]))
        params = net.init(k_net, jnp.zeros((CartPole.obs_size,)))
        state = _train_state(net.apply, params, tx)
        decay = c["EPS_DECAY"] * num_updates

        def update(runner: Any, step: Any) -> Any:
            state, env_state, last_obs, rng = runner
            eps = jnp.maximum(
                c["EPS_FINISH"],
                c["EPS_START"] - (c["EPS_START"] - c["EPS_FINISH"]) * step / max(decay, 1),
            )

            def env_step(carry: Any, _: Any) -> Any:
                env_state, last_obs, rng = carry
                rng, k_a, k_e, k_s = jax.random.split(rng, 4)
                q = net.apply(state.params, last_obs)
                greedy = jnp.argmax(q, axis=-1)
                random = jax.random.randint(k_a, greedy.shape, 0, CartPole.num_actions)
                action = jnp.where(jax.random.uniform(k_e, greedy.shape) < eps, random, greedy)
                obs, env_state, reward, done, info = jax.vmap(env.step)(
                    jax.random.split(k_s, c["NUM_ENVS"]), env_state, action
                )
                t = Transition(last_obs, action, c["REW_SCALE"] * reward, done, obs, q)
                return (env_state, obs, rng), (t, info)

            (env_state, last_obs, rng), (traj, infos) = jax.lax.scan(
                env_step, (env_state, last_obs, rng), None, c["NUM_STEPS"]
            )
            last_q = jnp.max(net.apply(state.params, traj.next_obs[-1]), axis=-1)

            def lambda_step(carry: Any, t: Any) -> Any:
                ret, next_q = carry
                target = t.reward + c["GAMMA"] * (1 - t.done) * (
                    c["LAMBDA"] * ret + (1 - c["LAMBDA"]) * next_q
                )
                return (target, jnp.max(t.q_val, axis=-1)), target

            last = traj.reward[-1] + c["GAMMA"] * (1 - traj.done[-1]) * last_q
            _, targets = jax.lax.scan(
                lambda_step,
                (last, jnp.max(traj.q_val[-1], axis=-1)),
                jax.tree_util.tree_map(lambda x: x[:-1], traj),
                reverse=True,
            )
            targets = jnp.concatenate([targets, last[None]])

            def epoch(carry: Any, _: Any) -> Any:
                state, rng = carry
                rng, k = jax.random.split(rng)
                size = c["NUM_STEPS"] * c["NUM_ENVS"]
                perm = jax.random.permutation(k, size)

                def shuffle(x: Any) -> Any:
                    x = jnp.take(x.reshape((size, *x.shape[2:])), perm, axis=0)
                    return x.reshape((c["NUM_MINIBATCHES"], -1, *x.shape[1:]))

                minis = (shuffle(traj.obs), shuffle(traj.action), shuffle(targets))

                def minibatch_step(state: Any, mb: Any) -> Any:
                    obs, action, target = mb

                    def loss(params: Any) -> Any:
                        q = net.apply(params, obs)
                        chosen = jnp.take_along_axis(q, action[:, None], axis=-1).squeeze(-1)
                        return 0.5 * jnp.mean((chosen - target) ** 2)

                    value, grads = jax.value_and_grad(loss)(state.params)
                    return state.apply_gradients(grads=grads), value

                state, losses = jax.lax.scan(minibatch_step, state, minis)
                return (state, rng), losses

            (state, rng), losses = jax.lax.scan(epoch, (state, rng), None, c["NUM_EPOCHS"])
            metrics = {
                "env_step": (step + 1) * c["NUM_STEPS"] * c["NUM_ENVS"],
                "td_loss": losses.mean(),
                "returned_episode_returns": infos["returned_episode_returns"].mean(),
            }
            jax.debug.callback(_log_callback, metrics)
            return (state, env_state, last_obs, rng), metrics

        rng, k = jax.random.split(rng)
        runner, metrics = jax.lax.scan(update, (state, env_state, obs, k), jnp.arange(num_updates))
        return {"runner_state": runner, "metrics": metrics}

    return jax.jit(train), (jax.ShapeDtypeStruct((2,), jnp.uint32),)


# -- Brax's own ppo.train ---------------------------------------------------------------------


BRAX_PPO_DEFAULT: dict[str, Any] = {
    "env": "ant", "num_envs": 4096, "batch_size": 2048, "num_minibatches": 32,
    "unroll_length": 5, "num_updates_per_batch": 4, "episode_length": 1000,
    "normalize_observations": True,
}  # fmt: skip
BRAX_PPO_SMALL: dict[str, Any] = {
    **BRAX_PPO_DEFAULT, "env": "fast", "num_envs": 16, "batch_size": 8, "num_minibatches": 4,
    "unroll_length": 4, "num_updates_per_batch": 1, "episode_length": 100,
}  # fmt: skip


def brax_ppo_train(config: dict[str, Any] | None = None) -> Program:
    """Brax's ``ppo.train`` (google/brax ``brax/training/agents/ppo/train.py``, Apache-2.0):
    its ``training_epoch`` (``num_updates_per_batch`` passes of ``num_minibatches`` SGD steps
    over ``batch_size x num_minibatches`` rollouts of ``unroll_length``), captured with its
    training state and env state as :mod:`memfit.estimate.brax_measure` captures it (Brax's
    own networks: policy 32 x 4, value 256 x 5), on one device."""
    from brax import envs

    from memfit.estimate import brax_measure as bm

    c = dict(BRAX_PPO_SMALL if config is None else config)
    env = envs.get_environment(
        c["env"], **({} if c["env"] == "fast" else {"backend": "positional"})
    )
    measure = bm.measurement_config(
        policy_hidden_layer_sizes=(32,) * 4,
        value_hidden_layer_sizes=(256,) * 5,
        num_updates_per_batch=c["num_updates_per_batch"],
        normalize_observations=c["normalize_observations"],
        episode_length=c["episode_length"],
    )
    fn, args, _ = bm._prepare_step(
        env, bm.network_factory(measure), measure, c["num_envs"], c["batch_size"],
        c["num_minibatches"], c["unroll_length"], single_device_jit=True,
    )  # fmt: skip
    return fn, tuple(args)


# -- Brax's own sac.train ---------------------------------------------------------------------


#: Brax's published SAC settings for hopper (the training colab's ``train_fn['hopper']``,
#: google/brax ``notebooks/training.ipynb``), on the positional backend.
BRAX_SAC_DEFAULT: dict[str, Any] = {
    "env": "hopper", "num_timesteps": 6_553_600, "num_evals": 20, "episode_length": 1000,
    "normalize_observations": True, "num_envs": 128, "batch_size": 512,
    "grad_updates_per_step": 64, "max_replay_size": 1_048_576, "min_replay_size": 8192,
}  # fmt: skip
BRAX_SAC_SMALL: dict[str, Any] = {
    **BRAX_SAC_DEFAULT, "env": "fast", "num_timesteps": 2048, "num_evals": 2,
    "episode_length": 100, "num_envs": 16, "batch_size": 32, "grad_updates_per_step": 4,
    "max_replay_size": 1024, "min_replay_size": 64,
}  # fmt: skip


class _SacCaptured(Exception):
    """Raised once Brax's ``sac.train`` has built its training epoch and its states."""


def _sac_proxy(jax: Any, captured: dict[str, Any]) -> Any:
    """``jax`` as Brax's SAC module sees it while its training epoch is captured: JAX's own
    names except ``pmap`` (``training_epoch`` is kept; the env's reset and the buffer's init
    are evaluated abstractly; the prefill call records the states it is handed and stops
    ``train``) and ``device_put_replicated`` (the training state, abstract, one device)."""
    import types

    class _Proxy(types.ModuleType):
        def __getattr__(self, name: str) -> Any:
            return getattr(jax, name)

    proxy = _Proxy("memfit_sac_jax_proxy")

    def pmap(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[..., Any]:
        name = getattr(fn, "__name__", "")
        if name == "training_epoch":
            captured["epoch"], captured["pmap_kwargs"] = fn, kwargs
            return fn
        if name == "prefill_replay_buffer":

            def stop(training_state: Any, env_state: Any, buffer_state: Any, _key: Any) -> Any:
                captured["states"] = (training_state, env_state, buffer_state)
                raise _SacCaptured

            return stop
        return lambda *call: jax.eval_shape(jax.vmap(fn, axis_name=kwargs.get("axis_name")), *call)

    def device_put_replicated(tree: Any, devices: Any) -> Any:
        return jax.tree_util.tree_map(
            lambda x: jax.ShapeDtypeStruct((1, *jax.numpy.shape(x)), jax.numpy.asarray(x).dtype),
            tree,
        )

    proxy.pmap = pmap  # type: ignore[attr-defined]
    proxy.device_put_replicated = device_put_replicated  # type: ignore[attr-defined]
    return proxy


def brax_sac_train(config: dict[str, Any] | None = None) -> Program:
    """Brax's ``sac.train`` (google/brax ``brax/training/agents/sac/train.py``, Apache-2.0):
    its ``training_epoch`` (a scan of training steps, each an env step of ``num_envs``
    environments into the ``UniformSamplingQueue`` replay buffer, then
    ``grad_updates_per_step`` SGD steps of alpha, critic and actor on ``batch_size`` sampled
    transitions), captured with its training state, env state and the replay buffer (held on
    the card: ``max_replay_size`` transitions), on one device, donated as Brax donates them.
    Brax's own networks (policy and two Q-networks, 256 x 2)."""
    import jax
    from brax import envs
    from brax.training.agents.sac import train as sac

    c = dict(BRAX_SAC_SMALL if config is None else config)
    env = envs.get_environment(
        c["env"], **({} if c["env"] == "fast" else {"backend": "positional"})
    )
    # Brax's initial evaluation (num_evals > 1) would run the policy: captured with one
    # evaluation and the timesteps that give the same training steps per epoch
    envs_n, prefill = c["num_envs"], -(-c["min_replay_size"] // c["num_envs"]) * c["num_envs"]
    per_epoch = -(-(c["num_timesteps"] - prefill) // (max(c["num_evals"] - 1, 1) * envs_n))
    captured: dict[str, Any] = {}
    original = sac.jax
    sac.jax = _sac_proxy(jax, captured)
    try:
        sac.train(
            environment=env, num_timesteps=prefill + per_epoch * envs_n, num_evals=1,
            episode_length=c["episode_length"], normalize_observations=c["normalize_observations"],
            num_envs=c["num_envs"], batch_size=c["batch_size"],
            grad_updates_per_step=c["grad_updates_per_step"],
            max_replay_size=c["max_replay_size"], min_replay_size=c["min_replay_size"],
            max_devices_per_host=1, num_eval_envs=1,
        )  # fmt: skip
    except _SacCaptured:
        pass
    finally:
        sac.jax = original
    if "epoch" not in captured or "states" not in captured:
        raise RuntimeError("could not capture Brax's sac.train (this brax builds it differently)")
    kwargs = dict(captured["pmap_kwargs"])
    fn = jax.jit(
        jax.vmap(captured["epoch"], axis_name=kwargs.get("axis_name")),
        donate_argnums=kwargs.get("donate_argnums", ()),
    )
    keys = jax.ShapeDtypeStruct((1, 2), jax.numpy.uint32)
    return fn, (*captured["states"], keys)


# -- jumanji's A2C on Snake -------------------------------------------------------------------


#: jumanji's own training configuration for Snake (``jumanji/training/configs/env/snake.yaml``
#: and ``a2c`` there: instadeepai/jumanji 1.1.2, Apache-2.0).
JUMANJI_DEFAULT: dict[str, Any] = {
    "env": "Snake-v1", "num_channels": 32, "policy_layers": (64, 64),
    "value_layers": (128, 128), "num_learner_steps_per_epoch": 500, "n_steps": 20,
    "total_batch_size": 128, "discount_factor": 0.997, "bootstrapping_factor": 0.95,
    "l_pg": 1.0, "l_td": 1.0, "l_en": 0.01, "learning_rate": 3e-4,
}  # fmt: skip
JUMANJI_SMALL: dict[str, Any] = {
    **JUMANJI_DEFAULT, "num_channels": 8, "policy_layers": (16,), "value_layers": (16,),
    "num_learner_steps_per_epoch": 3, "n_steps": 4, "total_batch_size": 8,
}  # fmt: skip


def jumanji_a2c_snake(config: dict[str, Any] | None = None) -> Program:
    """jumanji's A2C on its Snake (instadeepai/jumanji 1.1.2, Apache-2.0): the env from the
    installed ``jumanji`` (``jumanji.make("Snake-v1")`` behind its ``VmapAutoResetWrapper``,
    as ``jumanji/training/setup_train.py`` wraps it), the training written here from
    ``jumanji/training/agents/a2c/a2c_agent.py`` and ``train.py`` (its ``epoch_fn``: a scan
    of ``num_learner_steps_per_epoch`` A2C steps, each a rollout of ``n_steps`` over
    ``total_batch_size`` envs, TD(lambda) advantages, one Adam step) and
    ``networks/snake/actor_critic.py`` (two 2x2 convolutions, the step count, an MLP; the
    policy's logits masked by the action mask), in flax instead of haiku (jumanji's training
    needs dm-haiku and rlax, not installed here). One device: jumanji's ``pmean`` and
    ``psum`` over its ``devices`` axis are the identity there and are left out."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import jumanji
    import optax
    from jumanji.wrappers import VmapAutoResetWrapper

    c = dict(JUMANJI_SMALL if config is None else config)
    base = jumanji.make(c["env"])
    env = VmapAutoResetWrapper(base)
    time_limit = float(base.time_limit)

    class SnakeCNN(nn.Module):
        outputs: int
        units: tuple[int, ...]

        @nn.compact
        def __call__(self, obs: Any) -> Any:
            x = nn.relu(nn.Conv(c["num_channels"], (2, 2), strides=2, padding="SAME")(obs.grid))
            x = nn.relu(nn.Conv(c["num_channels"], (2, 2), strides=1, padding="SAME")(x))
            x = x.reshape((*x.shape[:-3], -1))
            step = jnp.expand_dims(obs.step_count / time_limit, -1)
            x = jnp.concatenate([x, step], axis=-1)
            for width in self.units:
                x = nn.relu(nn.Dense(width)(x))
            x = nn.Dense(self.outputs)(x)
            if self.outputs == 1:
                return jnp.squeeze(x, -1)
            return jnp.where(obs.action_mask, x, jnp.finfo(jnp.float32).min)

    actions = int(base.action_spec.num_values)
    policy = SnakeCNN(actions, tuple(c["policy_layers"]))
    value = SnakeCNN(1, tuple(c["value_layers"]))
    tx = optax.adam(c["learning_rate"])
    batch = c["total_batch_size"]

    def td_lambda(v_tm1: Any, r_t: Any, discount_t: Any, v_t: Any) -> Any:
        lam = c["bootstrapping_factor"]

        def back(g: Any, xs: Any) -> Any:
            r, d, v = xs
            g = r + d * ((1 - lam) * v + lam * g)
            return g, g

        _, returns = jax.lax.scan(back, v_t[-1], (r_t, discount_t, v_t), reverse=True)
        return jax.lax.stop_gradient(returns) - v_tm1

    def rollout(actor: Any, acting: Any) -> Any:
        def one(carry: Any, key: Any) -> Any:
            state, timestep, episodes, steps = carry
            logits = policy.apply(actor, timestep.observation)
            action = jax.random.categorical(key, logits)
            log_prob = jnp.take_along_axis(jax.nn.log_softmax(logits), action[..., None], axis=-1)[
                ..., 0
            ]
            state, next_ts = env.step(state, action)
            episodes = episodes + next_ts.last().sum()
            data = (timestep.observation, action, next_ts.reward, next_ts.discount,
                    next_ts.observation, log_prob, logits)  # fmt: skip
            return (state, next_ts, episodes, steps + batch), data

        state, timestep, key, episodes, steps = acting
        keys = jax.random.split(key, c["n_steps"])
        (state, timestep, episodes, steps), data = jax.lax.scan(
            one, (state, timestep, episodes, steps), keys
        )
        return (state, timestep, keys[-1], episodes, steps), data

    def loss(params: Any, acting: Any) -> Any:
        acting, (obs, _, reward, discount, next_obs, log_prob, logits) = rollout(
            params["actor"], acting
        )
        last = jax.tree_util.tree_map(lambda x: x[-1], next_obs)
        seq = jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a, b[None]], axis=0), obs, last)
        v = jax.vmap(value.apply, in_axes=(None, 0))(params["critic"], seq)
        discounts = c["discount_factor"] * discount.astype(float)
        advantage = jax.vmap(td_lambda, in_axes=1, out_axes=1)(v[:-1], reward, discounts, v[1:])
        critic_loss = jnp.mean(advantage**2)
        policy_loss = -jnp.mean(jax.lax.stop_gradient(advantage) * log_prob)
        probs = jax.nn.softmax(logits)
        entropy = -jnp.mean(jnp.sum(probs * jax.nn.log_softmax(logits), axis=-1))
        total = c["l_pg"] * policy_loss + c["l_td"] * critic_loss - c["l_en"] * entropy
        return total, (acting, {"total_loss": total, "entropy": entropy, "value": v.mean()})

    def run_epoch(training: Any) -> Any:
        params, opt_state, count, acting = training
        grad, (acting, metrics) = jax.grad(loss, has_aux=True)(params, acting)
        updates, opt_state = tx.update(grad, opt_state)
        params = optax.apply_updates(params, updates)
        return (params, opt_state, count + 1, acting), metrics

    def epoch_fn(training: Any) -> Any:
        training, metrics = jax.lax.scan(
            lambda t, _: run_epoch(t), training, None, c["num_learner_steps_per_epoch"]
        )
        return training, jax.tree_util.tree_map(jnp.mean, metrics)

    def init(key: Any) -> Any:
        k_actor, k_critic, k_reset, k_act = jax.random.split(key, 4)
        dummy = jax.tree_util.tree_map(lambda x: x[None], base.observation_spec.generate_value())
        params = {"actor": policy.init(k_actor, dummy), "critic": value.init(k_critic, dummy)}
        state, timestep = env.reset(jax.random.split(k_reset, batch))
        acting = (state, timestep, k_act, jnp.zeros((), float), jnp.zeros((), float))
        return params, tx.init(params), jnp.zeros((), float), acting

    training = jax.eval_shape(init, jax.ShapeDtypeStruct((2,), jnp.uint32))
    return jax.jit(epoch_fn, donate_argnums=0), (training,)


#: The corpus: name -> (builder, small config, default config).
CORPUS: dict[str, tuple[Callable[..., Program], dict[str, Any], dict[str, Any]]] = {
    "purejaxrl_ppo_brax": (purejaxrl_ppo_brax, PPO_SMALL, PPO_DEFAULT),
    "purejaxrl_dqn": (purejaxrl_dqn, DQN_SMALL, DQN_DEFAULT),
    "purejaxql_pqn": (purejaxql_pqn, PQN_SMALL, PQN_DEFAULT),
    "brax_ppo_train": (brax_ppo_train, BRAX_PPO_SMALL, BRAX_PPO_DEFAULT),
    "brax_sac_train": (brax_sac_train, BRAX_SAC_SMALL, BRAX_SAC_DEFAULT),
    "jumanji_a2c_snake": (jumanji_a2c_snake, JUMANJI_SMALL, JUMANJI_DEFAULT),
}


def build(name: str, size: str = "small") -> Program:
    """The program ``name`` at ``size`` (``"small"`` or ``"default"``)."""
    builder, small, default = CORPUS[name]
    return builder(dict(small if size == "small" else default))


def holds(name: str, size: str = "default") -> dict[str, int]:
    """What the program's run holds at the end, from ``jax.eval_shape`` (nothing compiled):
    bytes of each top-level part of its output (the carried runner state, the stacked
    metrics), and ``"total"``."""
    import jax
    import numpy as np

    fn, args = build(name, size)
    out = jax.eval_shape(fn, *args)

    def nbytes(tree: Any) -> int:
        return sum(
            int(np.prod(leaf.shape, dtype=np.int64)) * np.dtype(leaf.dtype).itemsize
            for leaf in jax.tree_util.tree_leaves(tree)
        )

    parts = out.items() if isinstance(out, dict) else enumerate(out)
    found = {str(key): nbytes(part) for key, part in parts}
    found["total"] = sum(found.values())
    return found


def compile_corpus(
    names: list[str],
    gpus: list[str],
    size: str = "small",
    environ: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Every program exported once and compiled for each card (one child process per card):
    per (program, card) the estimate's figures and the compile's seconds. ``environ``: the
    compile's environment (default none of this process's: JAX's defaults)."""
    from memfit.estimate.xla.gpu import compile_exported, export_step
    from memfit.estimate.xla.step import _from_gpu_compile, _leaf_sizes
    from memfit.hardware.catalog import gpu as lookup_gpu
    from memfit.hardware.xla_target import target_config

    exported, leaves = [], []
    for name in names:
        fn, args = build(name, size)
        exported.append(export_step(fn, *args))
        leaves.append(_leaf_sizes((args, {})))
    rows = []
    for card in gpus:
        spec = lookup_gpu(card)
        target = target_config(spec)
        start = time.perf_counter()
        results = compile_exported(exported, target, environ=environ or {})
        wall = time.perf_counter() - start
        for name, step, result, n in zip(names, exported, results, leaves, strict=True):
            est = _from_gpu_compile(result, spec, target, n, environ or {}, None)
            rows.append(
                {
                    "program": name,
                    "size": size,
                    "gpu": spec.name,
                    "compiled_for": est.compiled_for,
                    "route": step.route,
                    "callbacks": step.held.describe() if step.held else None,
                    "argument_bytes": est.argument_bytes,
                    "output_bytes": est.output_bytes,
                    "temp_bytes": est.temp_bytes,
                    "executable_peak_bytes": est.executable_peak_bytes,
                    "peak_bytes_in_use": est.peak_bytes_in_use,
                    "fits": est.fits,
                    "compile_seconds": result.seconds,
                    "child_seconds": round(wall, 1),
                }
            )
    return rows
