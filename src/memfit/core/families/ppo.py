"""On-policy (PPO) memory model: Brax, CleanRL, rl_games, skrl and RSL-RL layouts.

Brax (``brax/training/agents/ppo/train.py``, shared REFERENCE.md): each training step
collects ``batch_size * num_minibatches`` trajectories of ``unroll_length`` steps in
``batch_size * num_minibatches // num_envs`` sequential unrolls of all environments
(``jax.lax.scan`` stacks them). A transition (``brax.training.types.Transition``) holds the
observation and the next observation, the action, reward, discount, and extras: the policy's
``log_prob`` and ``raw_action`` and the state's ``truncation``. ``sgd_step`` permutes the whole
batch into ``num_minibatches`` minibatches with ``jax.random.permutation`` each epoch, so a
shuffled copy lives next to the original. A minibatch is ``batch_size`` trajectories of
``unroll_length`` transitions. Under ``jax.pmap`` every device holds ``num_envs /
device_count`` environments and ``1 / device_count`` of the trajectories.

CleanRL (``ppo_continuous_action.py``): storage tensors shaped ``(num_steps, num_envs, ...)``
for obs, actions, logprobs, rewards, dones, values, plus advantages and returns; a minibatch
is ``num_envs * num_steps // num_minibatches`` transitions.

skrl (``skrl/agents/torch/ppo/ppo.py``, ``skrl/memories/torch/random.py``): a
``RandomMemory`` of ``memory_size = rollouts`` steps of ``num_envs`` environments holding
observations, actions, rewards, terminated and truncated (bool), log_prob, values, returns and
advantages; each learning epoch ``memory.sample(..., mini_batches=M)`` indexes every
minibatch at once, a shuffled copy of observations, actions, log_prob, values, returns and
advantages; ``compute_gae`` adds advantages and returns temporaries; a minibatch is
``rollouts * num_envs / mini_batches`` transitions.

rl_games (``a2c_common.py`` experience buffer): obses, rewards, values, neglogpacs, dones,
actions, mus, sigmas (plus returns and advantages) for ``horizon_length x num_actors x
num_agents`` steps; ``play_steps`` then hands the update a flattened copy
(``get_transformed_list(swap_and_flatten01, ...)``: obses, actions, neglogpacs, values, mus,
sigmas, dones, and the returns and advantages: isaac-sim/IsaacLab PR #7147 counts this
"rollout plus flatten allocation" for its camera task); a minibatch is ``minibatch_size``
transitions. The experience buffer keeps observations as float32 whatever the env returns
(its dtype comes from the observation space).

RSL-RL (``rsl_rl/storage/rollout_storage.py``, Isaac Lab's ``rsl_rl`` runner): a
``RolloutStorage`` of ``num_steps_per_env x num_envs`` transitions holding observations,
actions, rewards, dones, values, actions_log_prob, mu, sigma, returns and advantages;
``mini_batch_generator`` flattens them as views and indexes one minibatch of
``num_steps_per_env * num_envs / num_mini_batches`` transitions at a time (a copy of its
observations, actions, values, advantages, returns, log-probabilities, mu and sigma).
"""

from __future__ import annotations

from collections.abc import Mapping

from memfit.core._workload_schema import PpoSpec, Workload
from memfit.core.families.common import (
    Term,
    activation_bytes,
    network_widths,
    observation_bytes,
    parameter_terms,
)
from memfit.core.families.registry import Family, device_terms, register

__all__ = ["FAMILY", "rollout_item_values", "terms", "training_item_values"]

_F32 = 4


def training_item_values(workload: Workload, values: Mapping[str, int]) -> int:
    """Activation values kept per training item: 2 x (input + every layer output) of every
    trained network (the pre-activation is kept for backward)."""
    total = 0
    for net in workload.networks.values():
        if not net.target:
            total += 2 * sum(network_widths(workload, net, values))
    return total


def rollout_item_values(workload: Workload, values: Mapping[str, int]) -> int:
    """Activation values per environment during rollout: the policy's forward pass (the
    network named ``policy``, else every trained network)."""
    nets = workload.networks
    chosen = [nets["policy"]] if "policy" in nets else [n for n in nets.values() if not n.target]
    if "policy" in nets:  # a policy head on a shared trunk runs the trunk too
        trunk = nets["policy"].trunk
        while trunk is not None:
            chosen.append(nets[trunk])
            trunk = nets[trunk].trunk
    return sum(sum(network_widths(workload, n, values)) for n in chosen)


def _per_device(workload: Workload) -> int:
    return workload.devices.count if workload.devices.strategy == "pmap" else 1


def _brax_measured(workload: Workload, values: Mapping[str, int]) -> list[Term]:
    """Brax PPO from measurements of its real env and compiled training step
    (:class:`memfit.core.measured.BraxMeasurements`), with Brax's training loop (epochs and
    evaluations) replayed through the BFC allocator model
    (:meth:`~memfit.core.measured.BraxMeasurements.loop_terms`)."""
    assert workload.measurements is not None
    return [
        # stored in the workload (recorded); the loop's allocator term is XLA's buffers
        # replayed through its BFC allocator model
        Term(name, (nbytes,), basis="compiled" if name == "allocator_loop" else "recorded")
        for name, nbytes in workload.measurements.loop_terms(
            values, _per_device(workload), preallocate=workload.jax.preallocate
        )
    ]


def _brax(workload: Workload, values: Mapping[str, int]) -> list[Term]:
    if workload.measurements is not None:
        return _brax_measured(workload, values)
    dc = _per_device(workload)
    envs = values["num_envs"] // dc
    trajectories = values["batch_size"] * values["num_minibatches"] // dc
    steps = trajectories * values["unroll_length"]
    obs = observation_bytes(workload, values)
    act = workload.action_dim * _F32
    spec = workload.ppo or PpoSpec()
    fields = [obs, obs, act, act, _F32, _F32, _F32, _F32]  # obs, next_obs, action, raw_action,
    # reward, discount, truncation, log_prob
    if spec.store_value:
        fields.append(_F32)
    rollout = tuple(steps * f for f in fields)
    ab = activation_bytes(workload)
    minibatch_items = values["batch_size"] // dc * values["unroll_length"]
    train_act = minibatch_items * training_item_values(workload, values) * ab
    rollout_act = envs * rollout_item_values(workload, values) * ab
    return [
        *parameter_terms(workload, values),
        Term("env_state", (envs * workload.env_state_bytes,)),
        Term("rollout_buffer", rollout),
        Term("rollout_shuffled_copy", rollout),
        Term("activations", (max(train_act, rollout_act),)),
    ]


def _cleanrl(workload: Workload, values: Mapping[str, int]) -> list[Term]:
    envs = values["num_envs"]
    steps = values["num_steps"] * envs
    obs = observation_bytes(workload, values)
    act = workload.action_dim * _F32
    # obs, actions, logprobs, rewards, dones, values, advantages, returns
    stored = observation_bytes(workload, values, stored=True)
    rollout = (steps * stored, steps * act, *(steps * _F32 for _ in range(6)))
    ab = activation_bytes(workload)
    minibatch_items = steps // values["num_minibatches"]
    train_act = minibatch_items * training_item_values(workload, values) * ab
    rollout_act = envs * rollout_item_values(workload, values) * ab
    return [
        *parameter_terms(workload, values),
        Term("env_state", (envs * workload.env_state_bytes,)),
        Term("next_observation", (envs * obs,)),
        Term("rollout_buffer", rollout),
        Term("activations", (max(train_act, rollout_act),)),
    ]


def _rl_games(workload: Workload, values: Mapping[str, int]) -> list[Term]:
    actors = values["num_actors"] * values.get("num_agents", 1)
    steps = values["horizon_length"] * actors
    obs = observation_bytes(workload, values)
    act = workload.action_dim * _F32
    # obses, actions, mus, sigmas, rewards, values, neglogpacs, dones, returns, advantages
    rollout = (steps * obs, *(steps * act for _ in range(3)), *(steps * _F32 for _ in range(6)))
    ab = activation_bytes(workload)
    train_act = values["minibatch_size"] * training_item_values(workload, values) * ab
    rollout_act = actors * rollout_item_values(workload, values) * ab
    # the flattened copy play_steps hands the update: obses, actions, mus, sigmas,
    # neglogpacs, values, dones, returns, advantages
    flat = (steps * obs, *(steps * act for _ in range(3)), *(steps * _F32 for _ in range(5)))
    return [
        *parameter_terms(workload, values),
        Term("env_state", (values["num_actors"] * workload.env_state_bytes,)),
        Term("rollout_buffer", rollout),
        Term("rollout_flattened_copy", flat),
        Term("activations", (max(train_act, rollout_act),)),
    ]


def _rsl_rl(workload: Workload, values: Mapping[str, int]) -> list[Term]:
    envs = values["num_envs"]
    steps = values["num_steps_per_env"] * envs
    obs = observation_bytes(workload, values)
    act = workload.action_dim * _F32
    # observations, actions, mu, sigma, rewards, values, actions_log_prob, returns,
    # advantages (float32), dones (uint8)
    stored = observation_bytes(workload, values, stored=True)
    storage = (steps * stored, *(steps * act for _ in range(3)), *(steps * _F32 for _ in range(5)))
    storage += (steps,)
    minibatch = -(-steps // values["num_mini_batches"])
    # one minibatch indexed out: observations, actions, mu, sigma, values, advantages,
    # returns, old log-probabilities
    batch = (minibatch * obs, *(minibatch * act for _ in range(3)), *(minibatch * _F32,) * 4)
    ab = activation_bytes(workload)
    train_act = minibatch * training_item_values(workload, values) * ab
    rollout_act = envs * rollout_item_values(workload, values) * ab
    return [
        *parameter_terms(workload, values),
        Term("env_state", (envs * workload.env_state_bytes,)),
        Term("next_observation", (envs * obs,)),
        Term("rollout_buffer", storage),
        Term("minibatch_data", batch),
        Term("activations", (max(train_act, rollout_act),)),
    ]


def _skrl(workload: Workload, values: Mapping[str, int]) -> list[Term]:
    envs = values["num_envs"]
    steps = values["rollouts"] * envs
    obs = observation_bytes(workload, values)
    act = workload.action_dim * _F32
    # observations, actions, rewards, terminated, truncated, log_prob, values, returns,
    # advantages (terminated and truncated are torch.bool)
    stored = observation_bytes(workload, values, stored=True)
    memory = (steps * stored, steps * act, steps * _F32, steps, steps, *(steps * _F32,) * 4)
    # memory.sample(names, mini_batches=M): every minibatch indexed at once
    sampled = (steps * obs, steps * act, *(steps * _F32,) * 4)
    ab = activation_bytes(workload)
    minibatch_items = -(-steps // values["mini_batches"])
    train_act = minibatch_items * training_item_values(workload, values) * ab
    rollout_act = envs * rollout_item_values(workload, values) * ab
    return [
        *parameter_terms(workload, values),
        Term("env_state", (envs * workload.env_state_bytes,)),
        Term("next_observation", (envs * obs,)),
        Term("rollout_buffer", memory),
        Term("rollout_shuffled_copy", sampled),
        Term("gae_temporaries", (steps * _F32, steps * _F32)),
        Term("activations", (max(train_act, rollout_act),)),
    ]


def terms(workload: Workload, values: Mapping[str, int]) -> list[Term]:
    """Memory terms of an on-policy workload at these knob values (per device).

    Args:
        workload: A ``family: ppo`` workload.
        values: Knob and setting values (every name its layout needs).

    Returns:
        Parameters, gradients, optimizer state, env state, rollout buffer (and Brax's
        shuffled copy), activations.

    Raises:
        ConfigError: When a network reads an observation the workload lacks.
    """
    layout = (workload.ppo or PpoSpec()).layout
    if layout == "brax":
        return _brax(workload, values)
    if layout == "cleanrl":
        return _cleanrl(workload, values)
    if layout == "skrl":
        return _skrl(workload, values)
    if layout == "rsl_rl":
        return _rsl_rl(workload, values)
    return _rl_games(workload, values)


#: Names each layout reads from knobs or settings, named as the framework names its arguments.
LAYOUT_NAMES: dict[str, tuple[str, ...]] = {
    "brax": ("num_envs", "batch_size", "num_minibatches", "unroll_length"),
    "cleanrl": ("num_envs", "num_steps", "num_minibatches"),
    "rl_games": ("num_actors", "horizon_length", "minibatch_size"),
    "skrl": ("num_envs", "rollouts", "mini_batches"),
    "rsl_rl": ("num_envs", "num_steps_per_env", "num_mini_batches"),
}


def _layout(workload: Workload) -> str:
    return (workload.ppo or PpoSpec()).layout


FAMILY = register(
    Family(
        name="ppo",
        summary="on-policy PPO (Brax, CleanRL, rl_games, skrl or RSL-RL layout)",
        terms=device_terms(terms),
        section="ppo",
        schema=PpoSpec,
        requires=(("networks", "family ppo needs at least one network under networks:"),),
        required_names=lambda w: LAYOUT_NAMES[_layout(w)],
        key=lambda w: f"ppo/{_layout(w)}",
    )
)
