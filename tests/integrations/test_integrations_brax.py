"""memfit.integrations.brax: Brax PPO's rules before Brax asserts, and plans that keep them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import memfit
from memfit._lazy import require
from memfit.allocator.xla_fraction import recommended_xla_fraction, xla_fraction_variable
from memfit.core.constraints import PRESETS
from memfit.core.measured import BraxMeasurements
from memfit.core.workload import parse_workload
from memfit.errors import BackendUnavailable, ConfigError
from memfit.integrations import brax as mbrax

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


def test_jax_allocator_settings_are_the_one_recommendation() -> None:
    w = mbrax.ppo_workload(observation_size=27, action_size=8, env_state_bytes=2540)
    spec = memfit.gpu("RTX 3060 Ti")
    p = memfit.plan(w, gpu=spec)
    env = mbrax.jax_allocator_settings(p, spec.total_bytes)
    advice = recommended_xla_fraction(spec)
    name = xla_fraction_variable()[0]  # the one name, the installed jaxlib's (issue 32)
    assert env == p.environment == {"XLA_PYTHON_CLIENT_PREALLOCATE": "true", name: advice.value}
    pool = p.predicted_bytes - p.breakdown["cuda_context"]
    assert pool == int(advice.fraction * spec.total_bytes)
    # planned without preallocation, the same recommendation once the buffers fit its pool
    on_demand = mbrax.ppo_workload(
        observation_size=27, action_size=8, env_state_bytes=2540, jax_preallocate=False
    )
    q = memfit.plan(on_demand, gpu=spec)
    assert q.environment == {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    assert mbrax.jax_allocator_settings(q, spec.total_bytes) == env
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


@pytest.mark.slow  # measures brax's fast env: minutes of CPU
def test_plan_ppo_on_a_real_brax_env(fast_measured: BraxMeasurements) -> None:
    from brax import envs

    env = envs.get_environment("fast")
    p = mbrax.plan_ppo(env, gpu="RTX 4070", **ONE)
    k = mbrax.ppo_kwargs(p)
    assert k["batch_size"] * k["num_minibatches"] % k["num_envs"] == 0
    # the terms are the measurements (the cache fixture measured this env once)
    assert {"training_state", "env_state", "rollout_buffer", "env_step_temporaries",
            "sgd_temporaries"} <= set(p.breakdown)  # fmt: skip
    assert p.breakdown["training_state"] == fast_measured.training_state_bytes
    assert p.breakdown["env_state"] == k["num_envs"] * fast_measured.env_state_bytes
    analytic = mbrax.plan_ppo(env, gpu="RTX 4070", measure=False, **ONE)
    assert "parameters" in analytic.breakdown and "sgd_temporaries" not in analytic.breakdown
    with pytest.raises(ConfigError, match="not a multiple"):
        mbrax.plan_ppo(env, gpu="RTX 4070", num_envs=512, batch_size=128, num_minibatches=2,
                       unroll_length=10, **ONE)  # fmt: skip


# --------------------------------------------------------------------------------------------
# Measuring Brax PPO from the real env and Brax's own compiled training step


@pytest.fixture(scope="module")
def measure_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One cache folder for this module's measurements (MEMFIT_CACHE_DIR)."""
    folder = tmp_path_factory.mktemp("memfit_cache")
    old = os.environ.get("MEMFIT_CACHE_DIR")
    os.environ["MEMFIT_CACHE_DIR"] = str(folder)
    yield folder
    if old is None:
        os.environ.pop("MEMFIT_CACHE_DIR", None)
    else:
        os.environ["MEMFIT_CACHE_DIR"] = old


@pytest.fixture(scope="module")
def fast_measured(measure_cache: Path) -> BraxMeasurements:
    """brax's ``fast`` test env measured once (about 10 s on a CPU)."""
    pytest.importorskip("brax", reason="brax is an optional extra (integrations)")
    return mbrax.measure_ppo("fast")


@pytest.mark.slow  # measures brax's fast env: minutes of CPU
def test_measurements_predict_a_fourth_compiled_step(fast_measured: BraxMeasurements) -> None:
    from brax import envs

    from memfit.estimate import brax_measure as bm

    m = fast_measured
    assert m.env == "brax:fast" and m.provenance.platform == "cpu"
    assert m.provenance.versions["brax"] == metadata.version("brax")
    # Brax's training wrappers keep the first state for automatic resets: more than raw
    assert m.env_state_raw_bytes is not None and m.env_state_bytes > m.env_state_raw_bytes
    assert [p["num_envs"] for p in m.step.points] == [256, 512, 256]
    # the three points are solved exactly
    for point in m.step.points:
        transitions = point["batch_size"] * point["num_minibatches"] * point["unroll_length"]
        items = point["batch_size"] * point["unroll_length"]
        assert abs(m.step.at(transitions, items) - point["bytes"]) <= 1
    # and a setting it was not fitted on is predicted within 1% of XLA's own analysis
    env = envs.get_environment("fast")
    values = {"num_envs": 1024, "batch_size": 512, "num_minibatches": 8, "unroll_length": 5}
    compiled = bm.compile_step(env, bm.network_factory(m.config), m.config, 1024, 512, 8, 5)
    model = sum(nbytes for _name, nbytes in m.terms(values))
    assert compiled["training_state_bytes"] == m.training_state_bytes
    assert compiled["env_state_bytes"] == 1024 * m.env_state_bytes
    assert abs(model - compiled["peak_bytes"]) <= 0.01 * compiled["peak_bytes"]


@pytest.mark.slow  # measures brax's fast env: minutes of CPU
def test_measurements_are_cached(
    fast_measured: BraxMeasurements, measure_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memfit.estimate import brax_measure as bm

    files = list((measure_cache / "measurements").glob("brax_ppo-*.json"))
    assert len(files) == 1

    def no_measuring(*_args: Any, **_kwargs: Any) -> None:
        raise AssertionError("measured again instead of reading the cache")

    monkeypatch.setattr(bm, "_measure", no_measuring)
    assert mbrax.measure_ppo("fast") == fast_measured
    # another configuration is another entry: it would be measured
    with pytest.raises(AssertionError, match="measured again"):
        mbrax.measure_ppo("fast", num_updates_per_batch=4)
    # a damaged entry is never trusted
    good = files[0].read_text(encoding="utf-8")
    files[0].write_text("{not json", encoding="utf-8")
    try:
        with pytest.raises(AssertionError, match="measured again"):
            mbrax.measure_ppo("fast")
    finally:
        files[0].write_text(good, encoding="utf-8")


FAST_WORKLOAD = """family: ppo
framework: jax
ppo: {layout: brax}
env: brax:fast
observations: {vector: 2}
action_dim: 1
networks:
  policy: {layers: [32, 32, 32, 32, 2]}
  value: {layers: [256, 256, 256, 256, 256, 1]}
knobs:
  num_envs: {min: 256, max: 65536, powers_of_two: true}
  unroll_length: {choices: [10, 20]}
  batch_size: {min: 64, max: 4096, powers_of_two: true}
  num_minibatches: {min: 4, max: 32, powers_of_two: true}
objective: num_envs * unroll_length
constraints: {presets: [brax_ppo]}
"""


@pytest.mark.slow  # measures brax's fast env: minutes of CPU
def test_resolve_measurements_modes(
    fast_measured: BraxMeasurements, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memfit.estimate import brax_measure as bm

    bare = parse_workload(FAST_WORKLOAD)
    # auto: this installation's cache
    resolved, notes = mbrax.resolve_measurements(bare)
    assert resolved.measurements == fast_measured
    assert notes[0].startswith("measurements cached for this installation")
    # a card known by its size alone: no XLA GPU target to compile for, so the plan takes
    # this installation's measurement (a named card, with the gpu-target extra, is compiled
    # for: tests/estimate/xla/test_xla_gpu_target.py)
    p = memfit.plan(bare, gpu="12GiB")
    assert p.breakdown["training_state"] == fast_measured.training_state_bytes
    assert any("cached for this installation" in n for n in p.notes)
    # recorded: only the workload's own, with its provenance
    with pytest.raises(ConfigError, match="records no measurements"):
        mbrax.resolve_measurements(bare, "recorded")
    recorded = bare.model_copy(update={"measurements": fast_measured})
    _, notes = mbrax.resolve_measurements(recorded, "recorded")
    assert "measurements recorded in the workload with brax" in notes[0]
    # without brax and jax the recording is all there is, and the plan says so
    monkeypatch.setattr(bm, "missing_packages", lambda: ["brax"])
    _, notes = mbrax.resolve_measurements(recorded)
    # the note names what is missing (issue 22: jax was there, only brax was not)
    assert notes[0].startswith("brax is not installed here: measurements recorded")
    monkeypatch.setattr(bm, "missing_packages", lambda: ["brax", "jax"])
    _, notes = mbrax.resolve_measurements(recorded)
    assert notes[0].startswith("brax and jax are not installed here: measurements recorded")
    with pytest.raises(ConfigError, match="brax and jax are not installed"):
        mbrax.resolve_measurements(bare)
    with pytest.raises(BackendUnavailable, match="needs brax and jax"):
        mbrax.resolve_measurements(bare, "fresh")
    with pytest.raises(ConfigError, match="unknown measurement mode"):
        mbrax.resolve_measurements(bare, "sometimes")


def test_bundled_humanoid_plans_from_its_recording_without_importing_brax() -> None:
    code = (
        "import json, sys, memfit\n"
        "p = memfit.plan('brax_humanoid_ppo', gpu='RTX 4070')\n"
        "print(json.dumps({'loaded': [m for m in ('brax', 'jax') if m in sys.modules],\n"
        "                  'notes': p.notes, 'terms': sorted(p.breakdown)}))\n"
    )
    env = {**os.environ, "MEMFIT_CACHE_DIR": str(Path(os.devnull).parent / "nonexistent")}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    ).stdout
    data = json.loads(out.strip().splitlines()[-1])
    assert data["loaded"] == []
    assert any("measurements recorded in the workload with brax 0.14.2" in n
               for n in data["notes"])  # fmt: skip
    assert "env_step_temporaries" in data["terms"] and "sgd_temporaries" in data["terms"]


def test_recorded_humanoid_figures_are_the_measured_ones() -> None:
    m = memfit.load_workload("brax_humanoid_ppo").measurements
    assert m is not None, "the bundled humanoid workload must ship its recorded measurements"
    # shared REFERENCE.md: jax.eval_shape of brax 0.14 humanoid (mjx) is 19,356 B; the
    # vmapped env.step adds about 12-14 KiB of temporaries per env on CPU
    assert m.env_state_raw_bytes == 19356
    assert 11_000 <= m.env_step.per_item_bytes <= 14 * 1024
    assert m.provenance.command.startswith("python bench/brax_measure.py --env humanoid")


def test_train_checks_before_brax() -> None:
    pytest.importorskip("brax", reason="brax is an optional extra (integrations)")
    env = SimpleNamespace(
        reset=lambda rng: None, step=lambda s, a: None, observation_size=4, action_size=1
    )
    with pytest.raises(ConfigError, match="episode_length"):
        mbrax.train(env, num_envs=4, batch_size=4, num_minibatches=1, num_timesteps=10)
    with pytest.raises(ConfigError, match="must be a Brax environment") as info:
        mbrax.train(object(), num_envs=4, batch_size=4, num_minibatches=1, num_timesteps=10)
    assert info.value.key_path == "environment"


def test_ensure_jax_compat_replicates_over_devices() -> None:
    jax = pytest.importorskip("jax")
    mbrax.ensure_jax_compat()
    out = jax.device_put_replicated({"w": jax.numpy.ones(3)}, jax.local_devices())
    assert out["w"].shape == (jax.local_device_count(), 3)


def test_the_plan_says_what_its_measurements_were_compiled_for() -> None:
    """``compiled_for`` is a field of the plan (and of its JSON), not only words in a note."""
    recorded = memfit.load_workload("brax_humanoid_ppo")
    assert recorded.measurements is not None
    plain = memfit.plan(recorded, gpu="RTX 4070")
    assert plain.compiled_for == recorded.measurements.provenance.platform == "cpu"
    card = "cuda sm_89 (NVIDIA GeForce RTX 4070)"
    provenance = recorded.measurements.provenance.model_copy(update={"platform": card})
    measured = recorded.measurements.model_copy(update={"provenance": provenance})
    for_card = memfit.plan(recorded.model_copy(update={"measurements": measured}), gpu="RTX 4070")
    assert for_card.compiled_for == card
    assert for_card.to_dict()["compiled_for"] == card
    # a workload planned without a compile has none
    assert memfit.plan("sac_pixels_8gb", gpu="RTX 4070").compiled_for is None


def test_plan_json_carries_compiled_for() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "memfit.cli.main", "plan", "brax_humanoid_ppo", "--gpu",
         "RTX 4070", "--json"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert json.loads(out)["compiled_for"] == "cpu"
