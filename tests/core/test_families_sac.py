"""The ``sac`` family: shared trunks, critics that read the action, twin critics and targets,
replay stored as transitions, frames or Brax's flat rows; the mujoco#1431 answer."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memfit.core.families import evaluate
from memfit.core.families.common import network_param_counts
from memfit.core.families.sac import replay_row_bytes
from memfit.core.plan import plan_for_gpu
from memfit.core.simulator_figures import SCENE_RULE, card_figures
from memfit.core.workload import load_workload, parse_workload
from memfit.errors import ConfigError, InfeasiblePlan
from memfit.hardware.catalog import gpu

PIXELS = """\
family: sac
sac: {algorithm: drq, replay: {storage: frames}}
observations:
  cameras: {count: 1, height: 84, width: 84, channels: 3, dtype: uint8, frame_stack: 3}
action_dim: 6
networks:
  encoder:
    conv:
      - {out_channels: 32, kernel: 3, stride: 2}
      - {out_channels: 32, kernel: 3}
      - {out_channels: 32, kernel: 3}
      - {out_channels: 32, kernel: 3}
  actor: {trunk: encoder, layers: [50, 12]}
  critic: {trunk: encoder, action_input: true, layers: [50, 1], copies: 2}
settings: {batch_size: 256}
knobs:
  buffer_size: {min: 1000, max: 100000, step: 1000}
"""


def test_mujoco_1431_replay_is_the_reported_49_62_gib() -> None:
    w = load_workload("brax_mjx_sac@as_reported")
    ev = evaluate(w, w.default_values())
    # the XLA log in the report: 53,280,000,080 bytes; the buffer is 30M rows of 444 floats
    assert ev.terms["replay_buffer"] == 30_000_000 * (2 * 214 + 13 + 3) * 4 == 53_280_000_000
    with pytest.raises(InfeasiblePlan, match="replay_buffer") as info:
        plan_for_gpu(w, gpu("RTX 4090"))
    assert "max_replay_size=30000000" in str(info.value)
    # the batch size does not matter: 32 or 1024, the buffer alone is over the card
    other = evaluate(w, {**w.default_values(), "batch_size": 1024})
    assert other.terms["replay_buffer"] == ev.terms["replay_buffer"]
    chosen = plan_for_gpu(load_workload("brax_mjx_sac"), gpu("RTX 4090"))
    assert chosen.fits and 1_000_000 < chosen.knobs["max_replay_size"] < 30_000_000
    assert chosen.binding == "replay_buffer"


def test_frames_store_pixels_once() -> None:
    w = parse_workload(PIXELS)
    values = {"buffer_size": 1000, "batch_size": 256}
    frame = 84 * 84 * 3
    assert replay_row_bytes(w, values) == (frame, 6 * 4, 4, 4)
    sb3 = parse_workload(PIXELS.replace("storage: frames", "storage: transitions"))
    assert replay_row_bytes(sb3, values) == (3 * frame, 3 * frame, 24, 4, 4, 4)
    stored_once = parse_workload(
        PIXELS.replace("storage: frames", "storage: transitions, optimize_memory_usage: true")
    )
    assert replay_row_bytes(stored_once, values) == (3 * frame, 24, 4, 4, 4)


def test_shared_trunk_is_counted_once_and_the_critic_reads_the_action() -> None:
    w = parse_workload(PIXELS)
    values = {"buffer_size": 1000, "batch_size": 256}
    nets = w.networks
    enc = network_param_counts(w, nets["encoder"], values)
    assert enc == [32 * 9 * 9, 32, *[32 * 32 * 9, 32] * 3]
    features = 32 * 35 * 35
    assert network_param_counts(w, nets["actor"], values) == [features * 50, 50, 50 * 12, 12]
    critic = [(features + 6) * 50, 50, 50, 1]
    assert network_param_counts(w, nets["critic"], values) == critic * 2
    ev = evaluate(w, values)
    assert ev.terms["parameters"] == 4 * (
        sum(enc) + features * 50 + 50 + 50 * 12 + 12 + 2 * sum(critic)
    )
    assert ev.terms["augmented_minibatch"] == 2 * 256 * 84 * 84 * 9 * 4
    assert ev.terms["entropy_temperature"] == 16


def test_td3_has_no_temperature_and_more_items_need_more_memory() -> None:
    w = parse_workload(PIXELS.replace("algorithm: drq", "algorithm: td3"))
    small = evaluate(w, {"buffer_size": 1000, "batch_size": 256})
    assert "entropy_temperature" not in small.terms and "augmented_minibatch" not in small.terms
    big = evaluate(w, {"buffer_size": 2000, "batch_size": 512})
    for name, nbytes in small.terms.items():
        assert big.terms[name] >= nbytes, name
    assert big.terms["replay_buffer"] == 2 * small.terms["replay_buffer"]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("trunk: encoder, layers: [50, 12]", "trunk: encodr, layers: [50, 12]"), "not a network"),
        (("actor: {trunk", "pilot: {trunk"), "sac.actor names network 'actor'"),
        (("algorithm: drq,", "algorithm: drq, optimize_memory_usage: true,"), "sac"),
        (
            ("storage: frames}", "storage: flat, optimize_memory_usage: true}"),
            "optimize_memory_usage applies to storage transitions",
        ),
        (
            ("layers: [50, 12]}", "layers: [50, 12], conv: [{out_channels: 4, kernel: 1}]}"),
            "drop conv",
        ),
    ],
)
def test_mistakes_name_their_key(edit: tuple[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_workload(PIXELS.replace(*edit))


def test_trunks_that_loop_are_refused() -> None:
    text = PIXELS.replace(
        "actor: {trunk: encoder, layers: [50, 12]}",
        "actor: {trunk: head, layers: [50, 12]}\n  head: {trunk: actor, layers: [8]}",
    )
    with pytest.raises(ConfigError, match="loop through their trunks"):
        parse_workload(text)


def test_fallbacks_store_pixels_once_before_shrinking() -> None:
    w = load_workload("sac_pixels_8gb@sb3_buffer")
    p = plan_for_gpu(
        w, gpu("RTX 4060 Ti 8GB"), overrides={"buffer_size": 250_000}, host_memory_bytes=2**30
    )
    assert not p.fits
    fits = {alt["change"]: alt["fits"] for alt in p.would_fit}
    assert fits["replay buffer in host RAM"] is False  # 31.8 GB of stacks, 1 GiB of RAM
    assert fits["pixels stored once: one frame per step, stacks rebuilt when sampled"] is True
    assert fits["optimize_memory_usage: observations stored once (Stable-Baselines3)"] is False


def test_brax_layout_matches_brax_sac() -> None:
    """Brax's own replay and SAC networks, built abstractly (nothing is allocated)."""
    pytest.importorskip("brax", reason="the flat layout is checked against brax itself")
    import jax
    import jax.numpy as jnp
    from brax.training import replay_buffers
    from brax.training.agents.sac import networks as sac_networks
    from brax.training.types import Transition

    w = load_workload("brax_mjx_sac")
    obs, act = w.observations.vector, w.action_dim
    values = {**w.default_values(), "max_replay_size": 1000}
    dummy = Transition(  # as brax/training/agents/sac/train.py builds it
        observation=jnp.zeros((obs,)),
        action=jnp.zeros((act,)),
        reward=0.0,
        discount=0.0,
        next_observation=jnp.zeros((obs,)),
        extras={"state_extras": {"truncation": 0.0}, "policy_extras": {}},
    )
    queue = replay_buffers.UniformSamplingQueue(
        max_replay_size=1000, dummy_data_sample=dummy, sample_batch_size=32
    )
    state = jax.eval_shape(queue.init, jax.random.PRNGKey(0))
    assert evaluate(w, values).terms["replay_buffer"] == state.data.size * state.data.dtype.itemsize

    nets = sac_networks.make_sac_networks(observation_size=obs, action_size=act)
    key = jax.random.PRNGKey(0)
    policy = jax.eval_shape(nets.policy_network.init, key)
    q = jax.eval_shape(nets.q_network.init, key)
    size = sum(x.size for x in jax.tree_util.tree_leaves((policy, q)))
    ev = evaluate(w, values)
    assert ev.terms["parameters"] == 4 * size
    assert ev.terms["target_network"] == 4 * sum(x.size for x in jax.tree_util.tree_leaves(q))


NEW_BUNDLED = [
    "brax_mjx_sac",
    "sac_pixels_8gb",
    "sac_pixels_8gb@sb3_buffer",
    "skrl_isaaclab_ppo",
    "skrl_isaaclab_ppo@no_sim",
]


@settings(max_examples=60, deadline=None)
@given(data=st.data(), name=st.sampled_from(NEW_BUNDLED))
def test_new_workloads_never_need_less_when_a_knob_grows(data: st.DataObject, name: str) -> None:
    """The planner prunes on this (see test_families_terms): every term is non-decreasing
    in every knob of the issue-25 workloads, on the device and with the replay on the host."""
    w = load_workload(name)
    values = dict(w.settings)
    for knob, spec in w.knobs.items():
        values[knob] = data.draw(st.sampled_from(spec.values()), label=knob)
    knob = data.draw(st.sampled_from(sorted(w.knobs)), label="grown")
    domain = w.knobs[knob].values()
    position = min(domain.index(values[knob]), len(domain) - 2)
    values[knob] = domain[position]
    bigger = {**values, knob: domain[position + 1]}
    for on_device in (True, False):
        small = evaluate(w, values, on_device=on_device)
        large = evaluate(w, bigger, on_device=on_device)
        for term, nbytes in small.terms.items():
            assert large.terms[term] >= nbytes, term
        assert large.host_bytes >= small.host_bytes


def test_bundled_workloads_plan() -> None:
    """What docs/workload.md says of them."""
    pixels = plan_for_gpu(
        load_workload("sac_pixels_8gb"), gpu("RTX 4060 Ti 8GB"), host_memory_bytes=16 * 2**30
    )
    assert pixels.knobs == {"buffer_size": 760_000, "replay_placement": "host"}
    sb3 = plan_for_gpu(
        load_workload("sac_pixels_8gb@sb3_buffer"),
        gpu("RTX 4060 Ti 8GB"),
        host_memory_bytes=16 * 2**30,
    )
    assert sb3.knobs["buffer_size"] == 120_000
    skrl = plan_for_gpu(load_workload("skrl_isaaclab_ppo"), gpu("RTX 4060 Ti 8GB"))
    assert skrl.knobs == {"num_envs": 8192, "rollouts": 64} and skrl.binding == "simulator_envs"
    # the Ant's 8 joints by the scene rule; no reading of this card: the largest base
    assert skrl.breakdown["simulator_envs"] == 8192 * SCENE_RULE.per_env(8)
    assert skrl.breakdown["simulator_base"] == card_figures(None).base_bytes
