"""Every memory term against a value computed by hand, and the monotonicity the planner's
pruning relies on."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memfit.core.budget import compose_budget
from memfit.core.families import evaluate
from memfit.core.families.common import allocator_slack, conv_shapes
from memfit.core.families.vision import token_count
from memfit.core.measured import MeasuredTerms
from memfit.core.workload import ConvLayer, Workload, load_workload, parse_workload
from memfit.errors import ConfigError
from memfit.hardware.catalog import anonymous_gpu
from memfit.units import MiB

BRAX = """\
family: ppo
framework: jax
precision: PRECISION
devices: DEVICES
ppo: {layout: brax}
observations: {vector: 10}
action_dim: 2
env_state_bytes: 100
networks:
  policy: {layers: [8, 4]}
  value: {layers: [8, 1]}
settings: {num_envs: 8, batch_size: 4, num_minibatches: 2, unroll_length: 5}
"""
# parameters: policy 10*8+8 + 8*4+4 = 124, value 10*8+8 + 8*1+1 = 97 -> 221
PARAMS = 221


def brax(precision: str = "fp32", devices: str = "{count: 1}") -> Workload:
    return parse_workload(BRAX.replace("PRECISION", precision).replace("DEVICES", devices))


def terms_of(w: Workload, **values: int) -> dict[str, int]:
    return evaluate(w, {**w.default_values(), **values}).terms


def test_brax_terms_by_hand() -> None:
    t = terms_of(brax())
    assert t["parameters"] == PARAMS * 4
    assert t["gradients"] == PARAMS * 4
    assert t["optimizer_state"] == PARAMS * 4 * 2  # Adam: two states
    assert t["env_state"] == 8 * 100
    # 4 * 2 trajectories x 5 steps = 40 transitions of
    # obs 40 + next_obs 40 + action 8 + raw_action 8 + reward, discount, truncation, log_prob 16
    assert t["rollout_buffer"] == 40 * 112
    assert t["rollout_shuffled_copy"] == 40 * 112
    # minibatch: 4 trajectories x 5 steps = 20 items x 2 x ((10+8+4) + (10+8+1)) values x 4 B
    assert t["activations"] == 20 * 2 * 41 * 4
    assert set(t) == {
        "parameters",
        "gradients",
        "optimizer_state",
        "env_state",
        "rollout_buffer",
        "rollout_shuffled_copy",
        "activations",
    }


def test_brax_rollout_activations_win_with_many_envs() -> None:
    # 4096 envs x policy widths (10+8+4) x 4 B > 20 items x 82 x 4 B
    t = terms_of(brax(), num_envs=4096)
    assert t["activations"] == 4096 * 22 * 4


def test_brax_pmap_terms_are_per_device() -> None:
    t = terms_of(brax(devices="{count: 2, strategy: pmap}"))
    assert t["env_state"] == 4 * 100
    assert t["rollout_buffer"] == 20 * 112
    assert t["activations"] == 10 * 2 * 41 * 4
    assert t["parameters"] == PARAMS * 4  # replicated


def test_precision_terms() -> None:
    amp = terms_of(brax("amp"))
    assert amp["parameters"] == PARAMS * 4  # fp32 master weights
    assert amp["parameters_amp_copy"] == PARAMS * 2
    assert amp["gradients"] == PARAMS * 4
    assert amp["activations"] == 20 * 2 * 41 * 2  # autocast halves activations
    bf16 = terms_of(brax("bf16"))
    assert (bf16["parameters"], bf16["gradients"], bf16["optimizer_state"]) == (442, 442, 884)
    assert "parameters_amp_copy" not in bf16


def test_fsdp_shards_and_ddp_buckets() -> None:
    fsdp = terms_of(brax(devices="{count: 2, strategy: fsdp}"))
    # tensors 80, 8, 32, 4, 80, 8, 8, 1 -> ceil halves 40, 4, 16, 2, 40, 4, 4, 1 = 111
    assert fsdp["parameters"] == 111 * 4
    assert fsdp["optimizer_state"] == 111 * 4 * 2
    ddp = terms_of(brax(devices="{count: 2, strategy: ddp}"))
    assert ddp["ddp_gradient_buckets"] == PARAMS * 4
    assert ddp["env_state"] == 8 * 100  # ddp knobs are per rank already


@pytest.mark.parametrize(("optimizer", "states"), [("sgd", 0), ("sgd_momentum", 1), ("adamw", 2)])
def test_optimizer_states(optimizer: str, states: int) -> None:
    w = parse_workload(
        BRAX.replace("PRECISION", "fp32").replace("DEVICES", "{count: 1}")
        + f"optimizer: {optimizer}\n"
    )
    t = terms_of(w)
    assert t.get("optimizer_state", 0) == PARAMS * 4 * states


def test_cleanrl_and_rl_games_layouts() -> None:
    common = """\
family: ppo
observations: {vector: 10}
action_dim: 2
networks:
  policy: {layers: [8, 4]}
  value: {layers: [8, 1]}
"""
    cleanrl = parse_workload(
        common + "ppo: {layout: cleanrl}\n"
        "settings: {num_envs: 4, num_steps: 8, num_minibatches: 4}\n"
    )
    t = terms_of(cleanrl)
    # 32 steps x (obs 40 + actions 8 + logprobs, rewards, dones, values, advantages, returns)
    assert t["rollout_buffer"] == 32 * 40 + 32 * 8 + 6 * 32 * 4
    assert t["next_observation"] == 4 * 40
    assert t["activations"] == 8 * 82 * 4  # minibatch 32 // 4 = 8 items
    rl_games = parse_workload(
        common + "ppo: {layout: rl_games}\n"
        "settings: {num_actors: 4, horizon_length: 8, minibatch_size: 16}\n"
    )
    t = terms_of(rl_games)
    # obses, actions + mus + sigmas, six float32 scalars per step
    assert t["rollout_buffer"] == 32 * 40 + 3 * 32 * 8 + 6 * 32 * 4
    # play_steps' flattened copy: obses, actions, mus, sigmas, and neglogpacs, values,
    # dones, returns, advantages
    assert t["rollout_flattened_copy"] == 32 * 40 + 3 * 32 * 8 + 5 * 32 * 4
    assert t["activations"] == 16 * 82 * 4
    rsl = parse_workload(
        common + "ppo: {layout: rsl_rl}\n"
        "settings: {num_envs: 4, num_steps_per_env: 8, num_mini_batches: 4}\n"
    )
    t = terms_of(rsl)
    # RolloutStorage: observations, actions + mu + sigma, five float32 scalars, uint8 dones
    assert t["rollout_buffer"] == 32 * 40 + 3 * 32 * 8 + 5 * 32 * 4 + 32
    # one minibatch of 32 / 4 = 8 transitions indexed out
    assert t["minibatch_data"] == 8 * 40 + 3 * 8 * 8 + 4 * 8 * 4
    assert t["next_observation"] == 4 * 40
    assert t["activations"] == 8 * 82 * 4
    with pytest.raises(ConfigError, match="num_steps_per_env"):
        parse_workload(common + "ppo: {layout: rsl_rl}\nsettings: {num_envs: 4}\n")


EXTRACTOR = """\
family: ppo
ppo: {layout: rsl_rl}
observations: {vector: 16, cameras: {count: 2, height: 16, width: 16}}
action_dim: 2
networks:
  policy: {layers: [8, 2]}
feature_extractor:
  params: 1000
  backbone:
    - {out_channels: 4, kernel: 3, stride: 2, padding: 1}
    - {out_channels: 8, kernel: 3, stride: 2, padding: 1}
settings: {num_envs: 3, num_steps_per_env: 2, num_mini_batches: 1}
"""


def test_a_frozen_feature_extractor_beside_the_learner() -> None:
    w = parse_workload(EXTRACTOR)
    t = terms_of(w)
    images = 3 * 2  # 3 envs, 2 cameras each
    assert t["extractor_parameters"] == 1000 * 4  # frozen: no gradients, no optimizer state
    assert "gradients" in t and t["gradients"] < t["extractor_parameters"]
    assert t["extractor_input"] == images * 3 * 16 * 16 * 4
    # maps 4x8x8 = 256 then 8x4x4 = 128 values; with batch norm a conv's output and its
    # normalised copy live together, the second layer's input too
    assert t["extractor_activations"] == images * max(2 * 256, 256 + 2 * 128) * 4
    own = parse_workload(
        EXTRACTOR.replace("params: 1000", "params: 1000\n  height: 32\n  width: 32\n  count: 1")
    )
    assert terms_of(own)["extractor_input"] == 3 * 3 * 32 * 32 * 4
    with pytest.raises(ConfigError, match=r"feature_extractor reads observations\.cameras"):
        parse_workload(EXTRACTOR.replace(", cameras: {count: 2, height: 16, width: 16}", ""))
    with pytest.raises(ConfigError, match=r"feature_extractor\.height names 'res'"):
        parse_workload(EXTRACTOR.replace("params: 1000", "params: 1000\n  height: res\n  width: 8"))
    with pytest.raises(ConfigError, match="both height and width"):
        parse_workload(EXTRACTOR.replace("params: 1000", "params: 1000\n  height: 8"))


OFFPOLICY = """\
family: offpolicy
observations:
  raster: {channels: 2, height: 8, width: 8, dtype: uint8}
action_dim: 1
replay: {placement: PLACEMENT, optimize_memory_usage: OPTIMIZE}
networks:
  q:
    conv: [{out_channels: 4, kernel: 3}]
    layers: [3]
  q_target:
    target: true
    conv: [{out_channels: 4, kernel: 3}]
    layers: [3]
settings: {buffer_size: 100, batch_size: 4}
"""


def offpolicy(placement: str = "gpu", optimize: bool = False) -> Workload:
    text = OFFPOLICY.replace("PLACEMENT", placement).replace("OPTIMIZE", str(optimize).lower())
    return parse_workload(text)


def test_replay_buffer_and_dqn_terms_by_hand() -> None:
    w = offpolicy()
    ev = evaluate(w, w.default_values())
    t = ev.terms
    # obs 2*8*8 = 128 B, next_obs 128, action int64 8, reward, done, timeout 12
    assert t["replay_buffer"] == 100 * (128 + 128 + 8 + 12)
    # conv 4*2*3*3 + 4 = 76, linear (4*6*6)*3 + 3 = 435
    assert t["parameters"] == (76 + 435) * 4
    assert t["target_network"] == (76 + 435) * 4
    assert t["gradients"] == (76 + 435) * 4
    assert t["minibatch_data"] == 4 * (128 + 128 + 8 + 12)
    # online 2 x (128 + 144 + 3) per item, target 1 x (128 + 144 + 3), 4 items, 4 B
    assert t["activations"] == 4 * (2 * 275 + 275) * 4
    assert ev.host_bytes == 0


def test_replay_optimize_memory_usage_and_host_placement() -> None:
    w = offpolicy(optimize=True)
    assert terms_of(w)["replay_buffer"] == 100 * (128 + 8 + 12)
    host = offpolicy(placement="host")
    ev = evaluate(host, host.default_values(), on_device=False)
    assert "replay_buffer" not in ev.terms
    assert ev.host_bytes == 100 * (128 + 128 + 8 + 12)


VISION = """\
family: vision_inference
framework: torch
optimizer: none
observations:
  cameras: {count: 2, height: 32, width: 32, channels: 3, dtype: uint8}
action_dim: 3
networks: {policy: {params: 1000}}
vision:
  autocast: true
  chunk_size: 10
  backbone: [{out_channels: 8, kernel: 3, stride: 2, padding: 1}]
  transformer: {dim_model: 16, ff_dim: 32, heads: 2, extra_tokens: 2}
settings: {num_envs: 4}
"""


def test_vision_terms_by_hand() -> None:
    w = parse_workload(VISION)
    t = terms_of(w)
    assert t["camera_frames"] == 4 * 2 * 32 * 32 * 3
    # the backbone runs without autograd: input 3*32*32 + output 8*16*16 live at once, 2 B
    assert t["backbone_activations"] == 8 * (3072 + 2048) * 2
    assert t["backbone_features"] == 8 * 2048 * 2
    tokens = 2 * 16 * 16 + 2 + 10
    assert token_count(w, w.default_values()) == tokens
    per_env = 5 * tokens * 16 + 2 * tokens * tokens + tokens * 32
    assert t["transformer_activations"] == 4 * per_env * 2
    assert t["action_queue"] == 4 * 10 * 3 * 4
    assert t["parameters"] == 4000
    assert t["parameters_amp_copy"] == 2000
    assert "gradients" not in t and "optimizer_state" not in t


def test_bundled_act_backbone_is_resnet18_shaped() -> None:
    w = load_workload("act_dual_camera")
    assert w.vision is not None
    shapes = conv_shapes(3, 512, 512, w.vision.backbone)
    assert shapes[0] == (64, 256, 256)
    assert shapes[1] == (64, 128, 128)  # max pool
    assert shapes[-1] == (512, 16, 16)
    assert token_count(w, w.default_values()) == 2 * 256 + 2 + 100


def test_conv_shapes_nature_dqn() -> None:
    layers = [
        ConvLayer(out_channels=32, kernel=8, stride=4),
        ConvLayer(out_channels=64, kernel=4, stride=2),
        ConvLayer(out_channels=64, kernel=3, stride=1),
    ]
    assert conv_shapes(4, 84, 84, layers) == [(32, 20, 20), (64, 9, 9), (64, 7, 7)]


def test_custom_terms() -> None:
    w = parse_workload(
        "family: custom\nterms: {weights: 1MiB, buffer: 'num_envs * 1024', fixed: 7}\n"
        "knobs:\n  num_envs: {min: 1, max: 8, default: 4}\n"
    )
    assert terms_of(w) == {"weights": MiB, "buffer": 4096, "fixed": 7}


def test_allocator_slack_by_hand() -> None:
    assert allocator_slack("torch", [100]) == 2 * MiB - 100  # one block in a 2 MiB segment
    assert allocator_slack("torch", [12 * MiB + 1]) == 14 * MiB - (12 * MiB + 1)
    assert allocator_slack("torch", [5 * MiB]) == 15 * MiB  # a 20 MiB segment
    assert allocator_slack("torch", [5 * MiB, 5 * MiB]) == 10 * MiB  # sharing one
    assert allocator_slack("torch", [0]) == 0
    assert allocator_slack("jax", [100, 256, 257]) == 156 + 0 + 255


def test_budget_composition_by_hand() -> None:
    spec = anonymous_gpu(8 * 2**30)  # unknown architecture: 824 MiB context, 32 MiB cuBLAS
    b = compose_budget(spec, framework="torch", margin=0.1, other_processes_bytes=MiB)
    margin = int(8 * 2**30 * 0.1)
    assert b.budget_bytes == 8 * 2**30 - margin - MiB
    assert b.job_limit_bytes == b.budget_bytes - 824 * MiB - 32 * MiB
    assert b.pool_bytes is None and b.breaking_term is None
    jax = compose_budget(spec, framework="jax", margin=0.1, jax_mem_fraction=0.75)
    assert jax.pool_bytes == 6 * 2**30
    assert jax.job_limit_bytes == 6 * 2**30 - 32 * MiB
    # memfit's recommended pool: 0.9 x 8 GiB - 824 MiB context leaves 0.799 -> 0.75
    recommended = compose_budget(spec, framework="jax", margin=0.1)
    assert recommended.pool_fraction == 0.75
    assert recommended.pool_bytes == int(8 * 2**30 * 0.75)
    assert recommended.outside_limit_bytes == b.budget_bytes + MiB - 824 * MiB - int(
        8 * 2**30 * 0.75
    )
    off = compose_budget(spec, framework="jax", jax_preallocate=False)
    assert off.pool_bytes is None
    tight = compose_budget(anonymous_gpu(2**30), framework="jax", margin=0.2,
                           jax_mem_fraction=0.75)  # fmt: skip
    assert tight.breaking_term == "jax_preallocation"  # 768 MiB pool + 500 MiB context
    tiny = compose_budget(anonymous_gpu(512 * MiB), framework="torch")
    assert tiny.breaking_term == "cuda_context"


def test_measured_terms_replace_the_model_terms() -> None:
    w = offpolicy()
    measured = MeasuredTerms(
        knob="batch_size",
        fixed_bytes={"parameters": 1000, "optimizer_state": 2000, "replay_buffer": 5},
        per_item_bytes=10.5,
    )
    t = evaluate(w, w.default_values(), measured=measured).terms
    assert t["parameters"] == 1000
    assert t["optimizer_state"] == 2000
    assert t["measured_replay_buffer"] == 5  # a name clash keeps both
    assert t["replay_buffer"] == 100 * 276
    assert t["activations"] == 42  # 10.5 x batch 4
    assert "gradients" not in t and "target_network" not in t


BUNDLED = [
    "brax_humanoid_ppo",
    "dqn_fire_raster",
    "dqn_fire_raster@device_replay",
    "act_dual_camera",
    "act_dual_camera@no_sim",
    "brax_humanoid_ppo@quick",
    "analytic_brax",
]

#: The one term allowed to fall: what Brax's SGD phase needs beyond the rollout and the env
#: step's scratch (XLA reuses that scratch), which shrinks as the env step's part grows; the
#: sum with it, the larger of the two phases, never falls.
#: Terms that may fall as a knob grows (the total may not): the measured step's phase term, and
#: the loop replay's whole-chunk waste in XLA's BFC allocator (a larger buffer can fit a hole
#: a smaller one left part-used).
PHASE_TERMS = {"sgd_temporaries", "allocator_loop"}


@settings(max_examples=80, deadline=None)
@given(data=st.data(), name=st.sampled_from(BUNDLED))
def test_memory_never_falls_when_a_knob_grows(data: st.DataObject, name: str) -> None:
    """The planner prunes on this: the allocated total is non-decreasing in every knob, and
    so is every term but the measured Brax step's phase term and the loop replay's chunk
    waste. Reserved bytes are not: the
    allocator's segment slack can fall when a block crosses 10 MiB and leaves a shared 20 MiB
    segment, so the planner bounds with allocated."""
    if name == "analytic_brax":  # the bundled humanoid without its measurements
        w = load_workload("brax_humanoid_ppo").model_copy(
            update={"measurements": None, "env": None, "backend": None}
        )
    else:
        w = load_workload(name)
    values = dict(w.settings)
    for knob, spec in w.knobs.items():
        values[knob] = data.draw(st.sampled_from(spec.values()), label=knob)
    knob = data.draw(st.sampled_from(sorted(w.knobs)), label="grown")
    domain = w.knobs[knob].values()
    position = domain.index(values[knob])
    if position + 1 == len(domain):
        position -= 1
        values[knob] = domain[position]
    bigger = {**values, knob: domain[position + 1]}
    small, large = evaluate(w, values), evaluate(w, bigger)
    for term, nbytes in small.terms.items():
        if term not in PHASE_TERMS:
            assert large.terms[term] >= nbytes, term
    assert large.allocated_bytes >= small.allocated_bytes
