"""Off-policy (DQN / SAC) memory model: replay buffer, sampled minibatch, target network.

Replay layout after Stable-Baselines3's ``ReplayBuffer`` (``stable_baselines3/common/
buffers.py``) and CleanRL's DQN: ``buffer_size`` transitions, each with the observation, the
next observation (dropped when ``optimize_memory_usage`` stores observations once), the
action in its dtype (``int64`` for discrete actions), and float32 reward, done and timeout.
Placement ``host`` keeps the buffer in host RAM (checked against ``host_memory_bytes``; SB3
warns when the buffer exceeds available RAM); ``gpu`` keeps it on the device; ``auto`` lets the
planner choose the device when it fits and the host otherwise.

Training keeps the Q-network's parameters, gradients and optimizer state, the target
network's parameters, the sampled minibatch, and the activations of the online network
(kept for backward) plus the target network's forward pass on the next observations. A
PyTorch workload with convolutions adds ``cudnn_conv_workspace``: the largest workspace cuDNN
takes in one convolution kernel (forward, backward data, backward filter) at the minibatch,
a transient on top of the rest (basis: fitted,
:data:`memfit.core.families.common.CONV_WORKSPACE_BASIS`; elastic: on a small card an upper
bound).
"""

from __future__ import annotations

from collections.abc import Mapping

from memfit.core._workload_schema import OffPolicySpec, Workload, dtype_bytes
from memfit.core.families.common import (
    CONV_WORKSPACE_BASIS,
    CONV_WORKSPACE_TERM,
    Term,
    activation_bytes,
    conv_workspace_bytes,
    network_input,
    network_widths,
    observation_bytes,
    param_bytes,
    parameter_terms,
)
from memfit.core.families.registry import Fallback, Family, register

__all__ = ["FAMILY", "replay_transition_bytes", "terms"]

_F32 = 4


def replay_transition_bytes(workload: Workload, values: Mapping[str, int]) -> tuple[int, ...]:
    """Bytes per stored transition, field by field: obs, [next_obs], action, reward, done,
    timeout."""
    spec = workload.replay or OffPolicySpec()
    obs = observation_bytes(workload, values, stored=True)
    action = workload.action_dim * dtype_bytes(spec.action_dtype)
    obs_fields = (obs,) if spec.optimize_memory_usage else (obs, obs)
    return (*obs_fields, action, _F32, _F32, _F32)


def terms(
    workload: Workload, values: Mapping[str, int], *, on_device: bool = True
) -> tuple[list[Term], int]:
    """Memory terms of an off-policy workload (per device) and the host bytes it needs.

    Args:
        workload: A ``family: offpolicy`` workload.
        values: Knob and setting values (``buffer_size``, ``batch_size``).
        on_device: Whether the replay buffer is on the device (else in host RAM).

    Returns:
        The device terms, and the bytes of host RAM the replay buffer takes (0 on the GPU).

    Raises:
        ConfigError: When a network reads an observation the workload lacks.
    """
    capacity = values["buffer_size"]
    batch = values["batch_size"]
    fields = replay_transition_bytes(workload, values)
    replay = tuple(capacity * f for f in fields)
    obs = observation_bytes(workload, values)
    ab = activation_bytes(workload)
    online = 0
    target = 0
    for net in workload.networks.values():
        widths = sum(network_widths(workload, net, values))
        if net.target:
            target += widths
        else:
            online += 2 * widths
    out = [
        *parameter_terms(workload, values),
        Term("env_state", (values.get("num_envs", 1) * workload.env_state_bytes,)),
        Term("minibatch_data", (batch * obs, batch * obs, *(batch * f for f in fields[-4:]))),
        Term("activations", (batch * online * ab, batch * target * ab)),
    ]
    if workload.framework == "torch":
        ws = 0
        for net in workload.networks.values():
            if net.conv:
                c, h, w = network_input(workload, net, values)
                ws = max(
                    ws,
                    conv_workspace_bytes(
                        c, h, w, net.conv, batch, ab, param_bytes(workload),
                        backward=not net.target,
                    ),
                )  # fmt: skip
        if ws:
            out.append(Term(CONV_WORKSPACE_TERM, (ws,), basis=CONV_WORKSPACE_BASIS[0]))
    if on_device:
        out.insert(0, Term("replay_buffer", replay))
        return out, 0
    return out, sum(replay)


def _spec(workload: Workload) -> OffPolicySpec:
    return workload.replay or OffPolicySpec()


def fallbacks(workload: Workload) -> list[Fallback]:
    """What may fit when the requested replay buffer does not: the buffer in host RAM (as
    Stable-Baselines3 and CleanRL keep it), observations stored once
    (``optimize_memory_usage``, about half the buffer), or a smaller buffer."""
    spec = _spec(workload)
    out: list[Fallback] = []
    if spec.placement != "host":
        out.append(Fallback("replay buffer in host RAM", {"replay": {"placement": "host"}}))
    if not spec.optimize_memory_usage:
        out.append(
            Fallback(
                "optimize_memory_usage: observations stored once (Stable-Baselines3)",
                {"replay": {"optimize_memory_usage": True}},
            )
        )
    if "buffer_size" in workload.knobs:
        out.append(Fallback("a smaller replay buffer", unpin=("buffer_size",)))
    return out


FAMILY = register(
    Family(
        name="offpolicy",
        summary="off-policy (DQN, SAC) with a replay buffer in host RAM or on the device",
        terms=terms,
        section="replay",
        schema=OffPolicySpec,
        requires=(("networks", "family offpolicy needs at least one network under networks:"),),
        required_names=lambda _w: ("buffer_size", "batch_size"),
        placement=lambda w: _spec(w).placement,
        placement_knob="replay_placement",
        fallbacks=fallbacks,
    )
)
