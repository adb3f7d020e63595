"""Actor-critic off-policy (SAC, TD3, DrQ) memory model: shared encoders, twin critics that
read the action, target networks, an entropy temperature, and replay stored three ways.

Networks (``networks:``, named by ``sac.actor`` / ``sac.critic``): a conv trunk shared by
several heads is one network, and each head names it as its ``trunk`` (DrQ-v2's encoder
feeding actor and critic; SAC-AE); a critic reads the action (``action_input: true``) and may
be twin (``copies: 2``: SB3's ``n_critics``, Brax's ``n_critics``); target networks are
``target: true`` networks (parameters only). A learned temperature (``log_alpha``) adds one
parameter, its gradient and Adam's two states.

Replay (``sac.replay.storage``), ``C`` = capacity transitions:

* ``transitions``: Stable-Baselines3's ``ReplayBuffer`` (``stable_baselines3/common/
  buffers.py``) and skrl's ``RandomMemory``: observation, next observation (dropped with
  ``optimize_memory_usage``, SB3), action in ``action_dtype``, float32 reward, done and
  timeout;
* ``frames``: pixels stored once (DrQ-v2's replay, frame-stacking buffers): one frame per
  step (observation bytes / ``frame_stack``, the first ``frame_stack - 1`` frames of an
  episode aside), the stack and the next observation rebuilt by index at sampling; action
  and float32 reward and discount;
* ``flat``: Brax's ``UniformSamplingQueue`` (``brax/training/replay_buffers.py``): the
  ``Transition`` pytree raveled to one float32 row, ``2 x obs + action + 3`` values
  (reward, discount, the training wrapper's truncation), ``max_replay_size`` rows.

Training (per update, each ``batch`` transitions, ``updates_per_step`` batches sampled at
once): the sampled minibatch (stacks rebuilt in the observation dtype; DrQ's augmentation
adds a float32 copy of observation and next observation), then the larger of two phases,
which run one after the other: the critic update (the trunk and the critics keep inputs and
pre-activations for backward, ``2 x widths``; the next-observation pass through the actor
and the target networks keeps its widths once) and the actor update (actor and critics keep
``2 x widths``; the trunk's features are detached).
"""

from __future__ import annotations

from collections.abc import Mapping

from memfit.core._workload_schema import NetworkSpec, SacSpec, Workload, dtype_bytes
from memfit.core.families.common import (
    Term,
    activation_bytes,
    camera_count,
    camera_hw,
    network_widths,
    observation_bytes,
    param_bytes,
    parameter_terms,
)
from memfit.core.families.registry import Fallback, Family, register
from memfit.errors import ConfigError

__all__ = ["FAMILY", "replay_row_bytes", "spec", "terms"]

_F32 = 4


def spec(workload: Workload) -> SacSpec:
    """The workload's ``sac:`` section, or its defaults."""
    return workload.sac or SacSpec()


def _camera_values(workload: Workload, values: Mapping[str, int], *, stacked: bool) -> int:
    cams = workload.observations.cameras
    if cams is None:
        return 0
    h, w = camera_hw(workload, values)
    count = camera_count(workload, values)
    return count * h * w * cams.channels * (cams.frame_stack if stacked else 1)


def _obs_values(workload: Workload, values: Mapping[str, int]) -> int:
    """Values (not bytes) of one observation, for float32 copies of it."""
    obs = workload.observations
    raster = obs.raster.channels * obs.raster.height * obs.raster.width if obs.raster else 0
    return obs.vector + raster + _camera_values(workload, values, stacked=True)


def _frame_bytes(workload: Workload, values: Mapping[str, int]) -> int:
    """Bytes of one stored step under ``frames`` storage: the vector part and the raster
    whole, the cameras one frame deep (the stack is rebuilt from neighbouring steps)."""
    obs = observation_bytes(workload, values)
    cams = workload.observations.cameras
    if cams is None:
        return obs
    unstacked = _camera_values(workload, values, stacked=True) - _camera_values(
        workload, values, stacked=False
    )
    return obs - unstacked * dtype_bytes(cams.dtype)


def replay_row_bytes(workload: Workload, values: Mapping[str, int]) -> tuple[int, ...]:
    """Bytes per stored transition, field by field, for the workload's storage."""
    s = spec(workload)
    r = s.replay
    if r.storage == "flat":
        # Brax ravels observation, action, reward, discount, next observation, truncation
        row = 2 * _obs_values(workload, values) + workload.action_dim + 3
        return (row * _F32,)
    action = workload.action_dim * dtype_bytes(r.action_dtype)
    if r.storage == "frames":
        return (_frame_bytes(workload, values), action, _F32, _F32)
    obs = observation_bytes(workload, values, stored=True)
    obs_fields = (obs,) if r.optimize_memory_usage else (obs, obs)
    return (*obs_fields, action, _F32, _F32, _F32)


def _net(workload: Workload, name: str, role: str) -> NetworkSpec:
    net = workload.networks.get(name)
    if net is None:
        raise ConfigError(
            f"sac.{role} names network {name!r}, which is not under networks:",
            key_path=f"sac.{role}",
            hint=f"networks: {', '.join(sorted(workload.networks))}",
        )
    return net


def _chain(workload: Workload, name: str) -> list[str]:
    """The network's name and the names of the trunks it reads, outermost trunk last."""
    out = [name]
    trunk = workload.networks[name].trunk
    while trunk is not None:
        out.append(trunk)
        trunk = workload.networks[trunk].trunk
    return out


def _widths(workload: Workload, names: list[str], values: Mapping[str, int]) -> int:
    nets = workload.networks
    return sum(sum(network_widths(workload, nets[n], values)) for n in names)


def _activation_values(workload: Workload, values: Mapping[str, int]) -> int:
    """Activation values per sampled transition, the larger of the two update phases."""
    s = spec(workload)
    _net(workload, s.actor, "actor")
    _net(workload, s.critic, "critic")
    critic_chain = _chain(workload, s.critic)
    actor_heads = [n for n in _chain(workload, s.actor) if n not in critic_chain]
    targets = [n for n, net in workload.networks.items() if net.target]
    # critic update: trunk and critics kept for backward, the target pass on the next
    # observation (actor for the next action, the target networks) once
    critic_phase = 2 * _widths(workload, critic_chain, values)
    critic_phase += _widths(workload, [*actor_heads, *targets], values)
    # actor update: the actor and the critics kept (the gradient flows through the action),
    # the shared trunk's features detached
    actor_phase = 2 * _widths(workload, [*actor_heads, s.critic], values)
    return max(critic_phase, actor_phase)


def terms(
    workload: Workload, values: Mapping[str, int], *, on_device: bool = True
) -> tuple[list[Term], int]:
    """Memory terms of an actor-critic off-policy workload (per device), and host bytes.

    Args:
        workload: A ``family: sac`` workload.
        values: Knob and setting values (the capacity and batch names of ``sac:``).
        on_device: Whether the replay buffer is on the device (else in host RAM).

    Returns:
        The device terms, and the host RAM the replay buffer takes (0 on the device).

    Raises:
        ConfigError: When ``sac:`` names a network the workload lacks, or a network reads an
            observation the workload does not have.
    """
    s = spec(workload)
    capacity = values[s.capacity]
    sampled = values[s.batch] * (values[s.updates_per_step] if s.updates_per_step else 1)
    row = replay_row_bytes(workload, values)
    replay = tuple(capacity * f for f in row)
    obs = observation_bytes(workload, values)
    ab = activation_bytes(workload)
    if s.replay.storage == "flat":
        # the sampled rows, and the pytree unraveled from them
        batch_terms: tuple[int, ...] = (sampled * row[0], sampled * row[0])
    else:
        action = workload.action_dim * dtype_bytes(s.replay.action_dtype)
        batch_terms = (sampled * obs, sampled * obs, sampled * action, *(sampled * _F32,) * 2)
    out = [
        *parameter_terms(workload, values),
        Term("env_state", (values.get("num_envs", 1) * workload.env_state_bytes,)),
        Term("minibatch_data", batch_terms),
        Term("activations", (sampled * _activation_values(workload, values) * ab,)),
    ]
    augment = s.augmentation if s.augmentation is not None else s.algorithm == "drq"
    if augment:
        copy = sampled * _obs_values(workload, values) * _F32
        out.append(Term("augmented_minibatch", (copy, copy)))
    if s.algorithm != "td3" and s.entropy == "learned":
        # log_alpha, its gradient and Adam's two states (SB3 ent_coef="auto", Brax, skrl)
        out.append(Term("entropy_temperature", (param_bytes(workload),) * 4))
    if s.normalize_observations:
        # running mean, variance and sum of squares (Brax's running_statistics, skrl's
        # RunningStandardScaler)
        out.append(Term("observation_normalizer", (_obs_values(workload, values) * _F32,) * 3))
    if on_device:
        out.insert(0, Term("replay_buffer", replay))
        return out, 0
    return out, sum(replay)


def _check(workload: Workload) -> str | None:
    s = spec(workload)
    for role, name in (("actor", s.actor), ("critic", s.critic)):
        if name not in workload.networks:
            return (
                f"sac.{role} names network {name!r}, which is not under networks: "
                f"({', '.join(sorted(workload.networks)) or 'none'})"
            )
        if workload.networks[name].target:
            return f"sac.{role} {name!r} is a target network; name the trained one"
    pixels = workload.observations.cameras is not None or workload.observations.raster is not None
    if s.replay.storage == "frames" and not pixels:
        return "frames storage stores pixels once: it needs observations.cameras or raster"
    return None


def _required(workload: Workload) -> tuple[str, ...]:
    s = spec(workload)
    names = (s.capacity, s.batch)
    return (*names, s.updates_per_step) if s.updates_per_step else names


def fallbacks(workload: Workload) -> list[Fallback]:
    """What may fit when the requested replay does not: the buffer in host RAM, pixels
    stored once (frames), observations stored once (``optimize_memory_usage``), or a smaller
    buffer."""
    s = spec(workload)
    out: list[Fallback] = []
    if s.replay.placement != "host":
        out.append(
            Fallback("replay buffer in host RAM", {"sac": {"replay": {"placement": "host"}}})
        )
    pixels = workload.observations.cameras is not None or workload.observations.raster is not None
    if s.replay.storage == "transitions" and pixels and workload.framework == "torch":
        out.append(
            Fallback(
                "pixels stored once: one frame per step, stacks rebuilt when sampled",
                {"sac": {"replay": {"storage": "frames"}}},
            )
        )
    if s.replay.storage == "transitions" and not s.replay.optimize_memory_usage:
        out.append(
            Fallback(
                "optimize_memory_usage: observations stored once (Stable-Baselines3)",
                {"sac": {"replay": {"optimize_memory_usage": True}}},
            )
        )
    if s.capacity in workload.knobs:
        out.append(Fallback("a smaller replay buffer", unpin=(s.capacity,)))
    return out


FAMILY = register(
    Family(
        name="sac",
        summary="actor-critic off-policy (SAC, TD3, DrQ): shared encoders, twin critics, "
        "replay stored once",
        terms=terms,
        section="sac",
        schema=SacSpec,
        requires=(("networks", "family sac needs an actor and a critic under networks:"),),
        required_names=_required,
        key=lambda w: f"sac/{spec(w).algorithm}",
        placement=lambda w: spec(w).replay.placement,
        placement_knob="replay_placement",
        fallbacks=fallbacks,
        check=_check,
    )
)
