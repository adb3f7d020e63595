"""Published JAX GPU memory measurements (``tests/data/published_truth/`` files with
``framework: jax``), rebuilt from their text and predicted by memfit: the runs, the programs
that rebuild them (each jitted function as the source jitted it), the loop replay and the
comparison. ``bench/published_truth_jax.py`` runs every one and writes the table (its docstring
says how each figure is obtained); ``tests/estimate/xla/test_published_truth_jax.py`` runs a few of
the same comparisons in CI.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

DATA = Path(__file__).resolve().parents[2] / "tests" / "data" / "published_truth"


#: each run's phases as XLA's GPU compiler sized them for the source's card (``--store``), so
#: the loop replay can be checked without a compile
BUFFERS = DATA / "jax_phase_buffers.json"


MiB = 2**20


@dataclass(frozen=True)
class Run:
    """One published JAX run: where it comes from, how it was set up, what was measured."""

    series: str
    name: str
    workload: str
    settings: dict[str, Any]
    measured_bytes: int
    quantity: str
    gpu: str
    runtime: dict[str, str]
    source: str
    #: the environment the source ran under, as far as it says (JAX's allocator settings);
    #: empty: JAX's defaults (preallocation on)
    environ: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """``series/name``, the run's id in tests and tables."""
        return f"{self.series}/{self.name}"


def load_runs(root: Path = DATA) -> list[Run]:
    """Every run of every JAX source file (``framework: jax``), in file order."""
    runs: list[Run] = []
    for path in sorted(root.glob("*.yaml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        if data.get("framework") != "jax":
            continue
        for item in data["runs"]:
            runs.append(
                Run(
                    series=path.stem,
                    name=item["name"],
                    workload=data["workload"],
                    settings={**(data.get("settings") or {}), **(item.get("settings") or {})},
                    measured_bytes=int(item["measured_bytes"]),
                    quantity=data["quantity"],
                    gpu=data["gpu"],
                    runtime={k: str(v) for k, v in (data.get("runtime") or {}).items()},
                    source=data["source"]["url"],
                    environ={k: str(v) for k, v in (data.get("environ") or {}).items()},
                )
            )
    return runs


@dataclass(frozen=True)
class Phase:
    """One jitted function of a program, its arguments, and what the program holds besides."""

    name: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    held_bytes: int = 0


@dataclass
class Program:
    """The jitted functions a source's program runs, in order, and its loop: the arrays it
    holds before the loop (bytes by name) and one iteration's events
    (:mod:`memfit.estimate.xla.program`), when the source's loop is rebuilt too."""

    phases: list[Phase] = field(default_factory=list)
    initial: dict[str, list[int]] = field(default_factory=dict)
    loop: list[Any] = field(default_factory=list)
    #: how many times the source ran its loop (the allocator's holes drift for many)
    iterations: int = 1


#: gymnax 0.0.9's environments as the source made them: observation shape, actions, and the
#: leaves of one environment's state (shape, dtype). Read from ``gymnax.make(name)`` and
#: ``env.reset`` (the observation is float32 for every one of them).
GYMNAX_ENVS: dict[str, tuple[tuple[int, ...], int, tuple[tuple[tuple[int, ...], str], ...]]] = {
    "CartPole-v1": ((4,), 2, (((), "int32"),) + (((), "float32"),) * 4),
    "Acrobot-v1": ((6,), 3, (((), "int32"),) + (((), "float32"),) * 4),
    "MountainCar-v0": ((2,), 3, (((), "int32"),) + (((), "float32"),) * 2),
    "Asterix-MinAtar": (
        (10, 10, 4),
        5,
        (((), "int32"),) * 10 + (((8, 5), "int32"), ((), "bool")),
    ),
    "Breakout-MinAtar": (
        (10, 10, 4),
        3,
        (((), "int32"),) * 5
        + (((10, 10), "float32"), ((), "bool"), ((), "int32"), ((), "int32"), ((), "bool")),
    ),
    "Freeway-MinAtar": (
        (10, 10, 7),
        3,
        (((), "int32"), ((), "int32"), ((8, 4), "int32"), ((), "int32"), ((), "bool")),
    ),
    "SpaceInvaders-MinAtar": (
        (10, 10, 6),
        4,
        (((), "int32"),) * 2
        + (((10, 10), "float32"),) * 3
        + (((), "int32"),) * 6
        + (((), "bool"),) * 2,
    ),
}


class ShapeEnv:
    """A stand-in for a gymnax environment with its observation, action and state shapes.

    The dynamics are a few elementwise operations on the state (the memory of these programs
    is the networks, the optimizer, the rollout's arrays and the autotuner's buffers; an
    environment step of a few scalars or a 10x10 grid adds almost nothing). Like gymnax's
    ``step``, a step also computes a reset and selects it where the episode ended.
    """

    def __init__(self, name: str) -> None:
        if name not in GYMNAX_ENVS:
            raise KeyError(f"no shapes recorded for {name!r}")
        self.obs_shape, self.num_actions, self.state_leaves = GYMNAX_ENVS[name]

    def _state(self, key: Any) -> tuple[Any, ...]:
        import jax
        import jax.numpy as jnp

        leaves = []
        for index, (shape, dtype) in enumerate(self.state_leaves):
            noise = jax.random.uniform(jax.random.fold_in(key, index), shape)
            leaves.append((noise * 3).astype(jnp.dtype(dtype)))
        return tuple(leaves)

    def _obs(self, state: tuple[Any, ...]) -> Any:
        import jax.numpy as jnp

        total = sum(jnp.sum(leaf.astype(jnp.float32)) for leaf in state)
        size = 1
        for dim in self.obs_shape:
            size *= dim
        ramp = jnp.arange(size, dtype=jnp.float32)
        return jnp.sin(ramp * total).reshape(self.obs_shape)

    def reset(self, key: Any) -> tuple[Any, tuple[Any, ...]]:
        state = self._state(key)
        return self._obs(state), state

    def step(self, key: Any, state: tuple[Any, ...], action: Any) -> tuple[Any, ...]:
        import jax
        import jax.numpy as jnp

        moved = tuple(
            (leaf + action.astype(leaf.dtype)) if leaf.dtype != jnp.bool_ else ~leaf
            for leaf in state
        )
        reward = jnp.float32(1.0)
        done = jax.random.uniform(key) < 0.02
        obs_reset, state_reset = self.reset(key)
        obs_step = self._obs(moved)
        chosen = tuple(jnp.where(done, r, s) for r, s in zip(state_reset, moved, strict=True))
        return jnp.where(done, obs_reset, obs_step), chosen, reward, done


def benchback_linen_ppo(settings: dict[str, Any]) -> Program:
    """KluvaDa/benchback-rl's Flax Linen PPO on a gymnax environment (``framework: linen``,
    ``compile: jax.jit``): separate actor and critic MLPs (tanh, orthogonal init), Adam with
    global-norm clipping and a linear schedule, a jitted rollout (``lax.scan`` over the steps
    of the vmapped environments), jitted advantages, and a jitted update (epochs x minibatches
    of a shuffled, flattened batch), each its own ``jax.jit`` without donation."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax.linen.initializers import constant, orthogonal

    env = ShapeEnv(str(settings["env"]))
    hidden = tuple(int(h) for h in settings["hidden_sizes"])
    num_envs = int(settings.get("num_envs", 32))
    num_steps = int(settings.get("num_steps", 256))
    num_minibatches = int(settings.get("num_minibatches", 8))
    epochs = int(settings.get("update_epochs", 10))
    iterations = int(settings.get("num_iterations", 100))
    obs_dim = int(np.prod(env.obs_shape))  # the source flattens observations of more than 1D

    class MLP(nn.Module):
        features: tuple[int, ...]
        final_std: float

        @nn.compact
        def __call__(self, x: Any) -> Any:
            for width in self.features[:-1]:
                dense = nn.Dense(width, kernel_init=orthogonal(np.sqrt(2)), bias_init=constant(0))
                x = nn.tanh(dense(x))
            last = nn.Dense(self.features[-1], kernel_init=orthogonal(self.final_std))
            return last(x)

    class ActorCritic(nn.Module):
        def setup(self) -> None:
            self.actor = MLP((*hidden, env.num_actions), 0.01)
            self.critic = MLP((*hidden, 1), 1.0)

        def __call__(self, obs: Any, key: Any, action: Any = None) -> Any:
            logits = self.actor(obs)
            if action is None:
                action = jax.random.categorical(key, logits)
            log_probs = jax.nn.log_softmax(logits, axis=-1)
            log_prob = jnp.take_along_axis(log_probs, action[..., None], axis=-1)[..., 0]
            entropy = -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)
            return action, log_prob, entropy, self.critic(obs)[..., 0]

    model = ActorCritic()
    schedule = optax.linear_schedule(2.5e-4, 0.0, iterations * epochs * num_minibatches)
    tx = optax.chain(optax.clip_by_global_norm(0.5), optax.adam(schedule, eps=1e-5))

    def sds(tree: Any) -> Any:
        return jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), tree)

    key = jax.random.PRNGKey(0)
    params = jax.eval_shape(lambda k: model.init(k, jnp.zeros((1, obs_dim)), k), key)
    opt_state = jax.eval_shape(tx.init, params)
    step_count = jax.ShapeDtypeStruct((), jnp.int32)
    keys = jax.ShapeDtypeStruct((2,), jnp.uint32)

    def reset_all(k: Any) -> Any:
        obs, state = jax.vmap(env.reset)(jax.random.split(k, num_envs))
        carry = (
            obs.reshape(num_envs, obs_dim),
            state,
            jnp.zeros(num_envs),
            jnp.zeros(num_envs, jnp.int32),
        )
        return carry

    carry = sds(jax.eval_shape(reset_all, key))

    def collect_rollout(params: Any, carry: Any, k: Any) -> Any:
        def one(state: Any, _: Any) -> Any:
            (obs, env_state, ep_reward, ep_length), k1 = state
            k1, k_act, k_env = jax.random.split(k1, 3)
            action, log_prob, _, value = model.apply(params, obs, k_act)
            stepped = jax.vmap(env.step)(jax.random.split(k_env, num_envs), env_state, action)
            next_obs, next_state, reward, done = stepped
            ep_reward = ep_reward + reward
            ep_length = ep_length + 1
            finished = (jnp.sum(done), jnp.sum(ep_reward * done), jnp.sum(ep_length * done))
            ep_reward = jnp.where(done, 0.0, ep_reward)
            ep_length = jnp.where(done, 0, ep_length)
            new = ((next_obs.reshape(num_envs, obs_dim), next_state, ep_reward, ep_length), k1)
            return new, (obs, action, log_prob, value, reward, done, finished)

        (last, _), out = jax.lax.scan(one, (carry, k), None, num_steps)
        obs, actions, log_probs, values, rewards, dones, finished = out
        final_value = model.apply(params, last[0], k)[3]
        metrics = jax.tree_util.tree_map(jnp.sum, finished)
        return obs, actions, log_probs, values, rewards, dones, last[0], final_value, last, metrics

    rollout_out = jax.eval_shape(collect_rollout, params, carry, keys)
    values, rewards, dones, final_value = (
        sds(rollout_out[3]), sds(rollout_out[4]), sds(rollout_out[5]), sds(rollout_out[7])
    )  # fmt: skip

    def compute_gae(values: Any, rewards: Any, dones: Any, final_value: Any) -> Any:
        def back(state: Any, x: Any) -> Any:
            gae, next_value = state
            value, reward, done = x
            delta = reward + 0.99 * next_value * (1 - done) - value
            gae = delta + 0.99 * 0.95 * (1 - done) * gae
            return (gae, value), gae

        init = (jnp.zeros_like(final_value), final_value)
        _, adv = jax.lax.scan(
            back, init, (values, rewards, dones.astype(jnp.float32)), reverse=True
        )
        return adv, adv + values

    def update(train_state: Any, rollout: Any, k: Any) -> Any:
        params, opt_state, count = train_state
        obs, actions, log_probs, values, adv, returns = rollout
        batch = num_steps * num_envs
        size = batch // num_minibatches

        def loss_fn(p: Any, mb: Any) -> Any:
            o, a, old_lp, ad, ret, v = mb
            _, lp, ent, new_v = model.apply(p, o, k, a)
            ratio = jnp.exp(lp - old_lp)
            ad = (ad - ad.mean()) / (ad.std() + 1e-8)
            pg = jnp.maximum(-ad * ratio, -ad * jnp.clip(ratio, 0.8, 1.2)).mean()
            v_clip = v + jnp.clip(new_v - v, -0.2, 0.2)
            v_loss = 0.5 * jnp.maximum((new_v - ret) ** 2, (v_clip - ret) ** 2).mean()
            return pg - 0.01 * ent.mean() + 0.5 * v_loss

        def minibatch(state: Any, mb: Any) -> Any:
            p, o_state = state
            loss, grads = jax.value_and_grad(loss_fn)(p, mb)
            updates, o_state = tx.update(grads, o_state, p)
            return (optax.apply_updates(p, updates), o_state), loss

        def epoch(state: Any, k_epoch: Any) -> Any:
            order = jax.random.permutation(k_epoch, batch)

            def shuffled(x: Any) -> Any:
                flat = x.reshape((batch, *x.shape[2:]))[order]
                return flat.reshape((num_minibatches, size, *x.shape[2:]))

            data = tuple(shuffled(x) for x in (obs, actions, log_probs, adv, returns, values))
            return jax.lax.scan(minibatch, state, data)

        (params, opt_state), losses = jax.lax.scan(
            epoch, (params, opt_state), jax.random.split(k, epochs)
        )
        return (params, opt_state, count + epochs * num_minibatches), losses.mean()

    gae_out = jax.ShapeDtypeStruct(values.shape, jnp.float32)  # advantages, returns
    program = Program()
    rollout_args = (
        sds(rollout_out[0]), sds(rollout_out[1]), sds(rollout_out[2]), values, gae_out, gae_out,
    )  # fmt: skip
    state = (params, opt_state, step_count)
    nbytes = _tree_bytes
    program.phases.append(
        Phase(
            "rollout",
            jax.jit(collect_rollout),
            (params, carry, keys),
            held_bytes=nbytes(opt_state) + nbytes(step_count),
        )
    )
    program.phases.append(
        Phase(
            "advantages",
            jax.jit(compute_gae),
            (values, rewards, dones, final_value),
            held_bytes=nbytes(state) + nbytes(carry) + nbytes(rollout_out[:3]),
        )
    )
    program.phases.append(
        Phase(
            "update",
            jax.jit(update),
            (state, rollout_args, keys),
            held_bytes=nbytes(carry) + nbytes(rollout_out[4:6]),
        )
    )
    program.initial, program.loop = _benchback_loop(state, carry, keys)
    program.iterations = iterations
    return program


def _benchback_loop(state: Any, carry: Any, key: Any) -> tuple[dict[str, list[int]], list[Any]]:
    """benchback-rl's ``PPO.train_step`` (``rl_linen/ppo/train.py``) as allocator events:
    ``self._rng_key, k = jax.random.split(self._rng_key)`` (eager: the (2, 2) split, then one
    row each), the rollout, the advantages, another split, the update; then
    ``self._env_carry = new_env_carry``, ``self._train_state = new_train_state``, and the
    function's locals freed at return in the frame's order (the rollout key, the rollout's
    arrays, its metrics, the advantages and returns, the update key, the update's metrics)."""
    from memfit.estimate.xla.program import Allocate, Call, Rebind, Release

    def leaves(tree: Any) -> list[int]:
        import jax
        import numpy as np

        return [
            int(np.prod(leaf.shape, dtype=np.int64)) * np.dtype(leaf.dtype).itemsize
            for leaf in jax.tree_util.tree_leaves(tree)
        ]

    (key_bytes,) = leaves(key)

    def split(into: str) -> list[Any]:
        return [
            Allocate("split", (2 * key_bytes,)),
            Allocate("key_new", (key_bytes,)),
            Allocate(into, (key_bytes,)),
            Release("split"),
            Rebind("key", "key_new"),
        ]

    initial = {"state": leaves(state), "key": [key_bytes], "carry": leaves(carry)}
    rollout_names = ("rollout",) * 8 + ("carry_new", "episode_metrics")
    loop = [
        *split("rollout_key"),
        Call("rollout", rollout_names),
        Call("advantages", ("gae", "gae")),
        *split("update_key"),
        Call("update", ("state_new", "update_metrics")),
        Rebind("carry", "carry_new"),
        Rebind("state", "state_new"),
        Release("rollout_key"),
        Release("rollout"),
        Release("episode_metrics"),
        Release("gae"),
        Release("update_key"),
        Release("update_metrics"),
    ]
    return initial, loop


def _tree_bytes(tree: Any) -> int:
    from memfit.estimate.xla.step import tree_nbytes

    return int(tree_nbytes(tree))


WORKLOADS: dict[str, Callable[[dict[str, Any]], Program]] = {
    "benchback_linen_ppo": benchback_linen_ppo,
}


@dataclass(frozen=True)
class Outcome:
    """One run: what memfit predicts (after and before issue 30) against the measured figure."""

    run: Run
    predicted_bytes: int
    before_bytes: int | None
    peak_phase: str
    seconds: float
    compiled_for: str
    terms: tuple[tuple[str, int, str], ...] = ()
    #: the largest phase's own figure plus what the loop holds beside it (no replay)
    one_step_bytes: int | None = None
    #: each phase's buffers on the card (``PhaseBuffers`` as plain data), for --sensitivity
    phase_buffers: dict[str, Any] = field(default_factory=dict)

    @property
    def error(self) -> float:
        return (self.predicted_bytes - self.run.measured_bytes) / self.run.measured_bytes

    @property
    def before_error(self) -> float | None:
        if self.before_bytes is None:
            return None
        return (self.before_bytes - self.run.measured_bytes) / self.run.measured_bytes

    def row(self) -> str:
        before = "" if self.before_error is None else f"{self.before_error:+.1%}"
        before_mib = "" if self.before_bytes is None else f"{self.before_bytes / MiB:,.1f}"
        return (
            f"| {self.run.series} | {self.run.name} | {self.run.measured_bytes / MiB:,.1f} | "
            f"{before_mib} | {before} | {self.predicted_bytes / MiB:,.1f} | {self.error:+.1%} | "
            f"{self.peak_phase} |"
        )


def _phase_figures(
    phase: Phase,
    gpu: str,
    compiler: str,
    jaxlib: str | None = None,
    environ: dict[str, str] | None = None,
) -> tuple[int, str, tuple[Any, ...]]:
    import memfit

    est = memfit.estimate_jax(
        phase.fn, *phase.args, gpu=gpu, compiler=compiler, jaxlib=jaxlib, environ=environ or {}
    )
    if compiler == "cpu":
        return est.executable_peak_bytes + phase.held_bytes, est.compiled_for, ()
    assert est.peak_bytes_in_use is not None, f"{phase.name}: no peak_bytes_in_use"
    return est.peak_bytes_in_use + phase.held_bytes, est.compiled_for, est.breakdown


def predict(run: Run, *, before: bool = True, phases: Sequence[str] | None = None) -> Outcome:
    """Rebuild ``run``'s program and predict its measured quantity for the source's card.

    With the source's loop rebuilt (``Program.loop``) and every phase chosen, the loop is
    replayed through JAX's allocator (:func:`memfit.estimate.xla.program.replay_program`):
    the peak of the run, with the chunks earlier iterations left to later ones. Otherwise,
    and as ``one_step_bytes`` always, the largest phase's own figure plus what the loop
    holds beside it."""
    from memfit.estimate.xla.program import phase_buffers

    started = time.perf_counter()
    program = WORKLOADS[run.workload](run.settings)
    chosen = [p for p in program.phases if phases is None or p.name in phases]
    best = (-1, "", "", ())
    before_best: int | None = -1 if before else None
    # the first call's autotuning as the source's jaxlib ran it
    jaxlib = run.runtime.get("jaxlib")
    buffers = {}
    for phase in chosen:
        buffers[phase.name], est = phase_buffers(
            phase.name, phase.fn, *phase.args, gpu=run.gpu, compiler="gpu", jaxlib=jaxlib,
            environ=run.environ,
        )  # fmt: skip
        assert est.peak_bytes_in_use is not None, f"{phase.name}: no peak_bytes_in_use"
        figure = est.peak_bytes_in_use + phase.held_bytes
        if figure > best[0]:
            best = (figure, phase.name, est.compiled_for, est.breakdown)
        if before_best is not None:
            before_best = max(before_best, _phase_figures(phase, run.gpu, "cpu")[0])
    one_step, peak_phase = best[0], best[1]
    predicted = one_step
    if program.loop and len(chosen) == len(program.phases):
        replayed = replay(run, program, buffers)
        predicted, peak_phase = replayed.peak_bytes_in_use, replayed.peak_at
    seconds = time.perf_counter() - started
    plain = {
        name: {"outputs": [list(o) for o in b.outputs], "temp_bytes": b.temp_bytes,
               "first_call_bytes": b.first_call_bytes}
        for name, b in buffers.items()
    }  # fmt: skip
    return Outcome(
        run, predicted, before_best, peak_phase, seconds, best[2], tuple(best[3]), one_step,
        plain,
    )  # fmt: skip


def replay(
    run: Run,
    program: Program,
    phases: dict[str, Any],
    initial: dict[str, list[int]] | None = None,
    loop: list[Any] | None = None,
) -> Any:
    """``program``'s loop replayed through JAX's allocator on ``run``'s card, for the source's
    number of iterations (:func:`memfit.estimate.xla.program.replay_program`)."""
    from memfit.estimate.xla.program import allocator_settings, replay_program

    limit, preallocate = allocator_settings(run.gpu, run.environ)
    return replay_program(
        program.initial if initial is None else initial,
        phases,
        program.loop if loop is None else loop,
        limit_bytes=limit,
        preallocate=preallocate,
        iterations=program.iterations,
    )


def load_buffers(path: Path = BUFFERS) -> dict[str, dict[str, Any]]:
    """The stored phase buffers of each run (``--store``), by run key."""
    from memfit.estimate.xla.program import PhaseBuffers

    if not path.exists():
        return {}
    stored = json.loads(path.read_text(encoding="utf-8"))
    return {
        key: {
            name: PhaseBuffers(
                name,
                tuple(tuple(int(n) for n in leaves) for leaves in item["outputs"]),
                int(item["temp_bytes"]),
                int(item["first_call_bytes"]),
            )
            for name, item in phases.items()
        }
        for key, phases in stored["runs"].items()
    }


def outcomes(runs: list[Run], *, before: bool = True) -> Iterator[Outcome]:
    for run in runs:
        yield predict(run, before=before)
