"""memfit.integrations.brax: Brax PPO's rules before Brax asserts, and plans that keep them."""

from __future__ import annotations

import subprocess
import sys

import pytest

import memfit
from memfit.core.constraints import PRESETS
from memfit.errors import BackendUnavailable, ConfigError
from memfit.integrations import brax as mbrax
from memfit.integrations._lazy import require

ONE = {"local_device_count": 1, "process_count": 1}


def test_issue_example_names_nearest_fixes() -> None:
    problems = mbrax.ppo_violations(
        num_envs=512, batch_size=128, num_minibatches=2, episode_length=1000, **ONE
    )
    assert [p.rule for p in problems] == ["brax_ppo: batch_size * num_minibatches % num_envs == 0"]
    assert isinstance(problems[0], memfit.Violation)
    assert problems[0].knobs == {"batch_size": 128, "num_envs": 512, "num_minibatches": 2}
    fixes = problems[0].suggestions
    assert {"num_minibatches": 4} in fixes and {"batch_size": 256} in fixes
    for fix in fixes:
        args = {"num_envs": 512, "batch_size": 128, "num_minibatches": 2, **fix}
        assert args["batch_size"] * args["num_minibatches"] % args["num_envs"] == 0


def test_check_ppo_raises_config_error_with_hint() -> None:
    with pytest.raises(ConfigError, match="not a multiple of num_envs") as info:
        mbrax.check_ppo(num_envs=512, batch_size=128, num_minibatches=2, episode_length=1, **ONE)
    assert info.value.hint is not None and "num_minibatches=4" in info.value.hint
    assert info.value.key_path == "ppo.batch_size"


def test_device_count_rule_uses_max_devices_per_host_and_processes() -> None:
    base = {"batch_size": 64, "num_minibatches": 4, "episode_length": 10}
    # 4 local devices capped at 2 per host, 3 processes: 6 devices
    problems = mbrax.ppo_violations(
        num_envs=8, max_devices_per_host=2, local_device_count=4, process_count=3, **base
    )
    rules = {p.rule: p for p in problems}
    assert "brax_ppo: num_envs % device_count == 0" in rules
    for fix in rules["brax_ppo: num_envs % device_count == 0"].suggestions:
        assert fix["num_envs"] % 6 == 0
    assert not mbrax.ppo_violations(num_envs=8, local_device_count=4, process_count=2, **base)


@pytest.mark.parametrize(
    ("kwargs", "rule"),
    [
        ({"num_envs": 4}, "episode_length is not None when wrap_env"),
        ({"num_envs": 4, "episode_length": 5, "vision": True, "action_repeat": 2},
         "action_repeat == 1 when vision"),
        ({"num_envs": 4, "episode_length": 5, "use_distributional_critic": True},
         "clipping_epsilon_value is not None when use_distributional_critic"),
        ({"num_envs": 4, "episode_length": 5, "learning_rate_schedule": "cosine"},
         "learning_rate_schedule in (None, 'NONE', 'ADAPTIVE_KL')"),
        ({"num_envs": 4, "episode_length": 5, "normalize_observations_mode": "mean"},
         "normalize_observations_mode in ('welford', 'ema')"),
        ({"num_envs": 0, "episode_length": 5}, "num_envs >= 1"),
        ({"num_envs": 4, "episode_length": 5, "unroll_length": 2.5}, "unroll_length >= 1"),
    ],
)  # fmt: skip
def test_each_brax_rule(kwargs: dict[str, object], rule: str) -> None:
    assert rule in [p.rule for p in mbrax.ppo_violations(**kwargs, **ONE)]


def test_the_rules_are_the_core_preset_and_memfit_check_agrees() -> None:
    assert PRESETS["brax_ppo"] == mbrax.BRAX_PPO_RULES
    knobs = {"num_envs": 512, "batch_size": 128, "num_minibatches": 2}
    from_check = memfit.check("brax_humanoid_ppo", knobs)
    from_brax = mbrax.ppo_violations(episode_length=1000, unroll_length=20, **knobs, **ONE)
    assert [v.rule for v in from_check] == [v.rule for v in from_brax]
    # the two nearest fixes agree (memfit check searches the workload's knob domains)
    assert list(from_check[0].suggestions[:2]) == list(from_brax[0].suggestions[:2])


def test_valid_arguments_pass_and_defaults_are_brax_defaults() -> None:
    args = mbrax.check_ppo(num_envs=16, episode_length=100, **ONE)
    # Brax's defaults: batch 32 x 16 minibatches = 512 trajectories, a multiple of 16 envs
    assert args["batch_size"] == 32 and args["num_minibatches"] == 16
    assert args["unroll_length"] == 10


def test_unknown_argument_gets_did_you_mean() -> None:
    with pytest.raises(ConfigError, match="num_minibatch") as info:
        mbrax.check_ppo(num_minibatch=4, **ONE)
    assert info.value.hint == "did you mean 'num_minibatches'?"


def test_ppo_workload_plan_keeps_brax_rules_and_pins() -> None:
    w = mbrax.ppo_workload(observation_size=27, action_size=8, env_state_bytes=2540)
    for gpu in ("GTX 1650", "RTX 3060 Ti", "RTX 4090"):
        p = memfit.plan(w, gpu=gpu)
        k = mbrax.ppo_kwargs(p)
        assert p.fits and p.predicted_bytes <= p.budget_bytes
        assert k["batch_size"] * k["num_minibatches"] % k["num_envs"] == 0
        assert not mbrax.ppo_violations(episode_length=1000, **k, **ONE)
    pinned = mbrax.ppo_workload(
        observation_size=27, action_size=8, env_state_bytes=2540, pinned={"num_envs": 256}
    )
    assert memfit.plan(pinned, gpu="RTX 4090").knobs["num_envs"] == 256


def test_ppo_workload_env_state_term_scales_with_state_bytes() -> None:
    small = mbrax.ppo_workload(observation_size=27, action_size=8, env_state_bytes=1000,
                               pinned={"num_envs": 1024, "batch_size": 256,
                                       "num_minibatches": 8, "unroll_length": 10})  # fmt: skip
    big = mbrax.ppo_workload(observation_size=27, action_size=8, env_state_bytes=3000,
                             pinned={"num_envs": 1024, "batch_size": 256,
                                     "num_minibatches": 8, "unroll_length": 10})  # fmt: skip
    a = memfit.plan(small, gpu="RTX 4090").breakdown["env_state"]
    b = memfit.plan(big, gpu="RTX 4090").breakdown["env_state"]
    assert b - a == 1024 * 2000


def test_ppo_workload_rejects_bad_sizes() -> None:
    with pytest.raises(ConfigError, match="observation_size"):
        mbrax.ppo_workload(observation_size=0, action_size=8, env_state_bytes=1)
    with pytest.raises(ConfigError, match="policy_hidden_layer_sizes"):
        mbrax.ppo_workload(
            observation_size=4, action_size=2, env_state_bytes=1, policy_hidden_layer_sizes=[]
        )


def test_jax_allocator_settings_cover_the_plan_without_the_context() -> None:
    w = mbrax.ppo_workload(observation_size=27, action_size=8, env_state_bytes=2540)
    spec = memfit.gpu("RTX 3060 Ti")
    p = memfit.plan(w, gpu=spec)
    env = mbrax.jax_allocator_settings(p, spec.total_bytes)
    fraction = float(env["XLA_PYTHON_CLIENT_MEM_FRACTION"])
    pool = p.predicted_bytes - p.breakdown["cuda_context"]
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "true"
    assert pool <= fraction * spec.total_bytes
    assert 0 < fraction <= 1
    with pytest.raises(ConfigError, match="total_bytes"):
        mbrax.jax_allocator_settings(p, 0)


def test_require_names_what_to_install() -> None:
    with pytest.raises(BackendUnavailable) as info:
        require("gymnasium_no_such_thing.envs")
    assert info.value.hint == "pip install gymnasium_no_such_thing"
    with pytest.raises(BackendUnavailable, match="not installed") as info:
        require("isaaclab.envs")
    assert info.value.hint is not None and "Isaac Sim" in info.value.hint


def test_integration_modules_import_no_framework() -> None:
    code = (
        "import sys\n"
        "import memfit.integrations.brax, memfit.integrations.lightning, "
        "memfit.integrations.transformers, memfit.integrations.gymnasium, "
        "memfit.integrations.isaaclab\n"
        "bad = [m for m in ('brax', 'jax', 'torch', 'lightning', 'transformers', 'gymnasium') "
        "if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_plan_ppo_on_a_real_brax_env() -> None:
    pytest.importorskip("brax")
    from brax import envs

    env = envs.get_environment("inverted_pendulum", backend="spring")
    p = mbrax.plan_ppo(env, gpu="RTX 4070", **ONE)
    k = mbrax.ppo_kwargs(p)
    assert k["batch_size"] * k["num_minibatches"] % k["num_envs"] == 0
    assert p.breakdown["env_state"] > 0
    with pytest.raises(ConfigError, match="not a multiple"):
        mbrax.plan_ppo(env, gpu="RTX 4070", num_envs=512, batch_size=128, num_minibatches=2,
                       unroll_length=10, **ONE)  # fmt: skip


def test_train_checks_before_brax() -> None:
    pytest.importorskip("brax")
    with pytest.raises(ConfigError, match="episode_length"):
        mbrax.train(object(), num_envs=4, batch_size=4, num_minibatches=1, num_timesteps=10)


def test_ensure_jax_compat_replicates_over_devices() -> None:
    jax = pytest.importorskip("jax")
    mbrax.ensure_jax_compat()
    out = jax.device_put_replicated({"w": jax.numpy.ones(3)}, jax.local_devices())
    assert out["w"].shape == (jax.local_device_count(), 3)
