"""Brax PPO: check the arguments before Brax asserts, and plan them for a GPU.

:func:`check_ppo` tests every rule ``brax.training.agents.ppo.train.train`` enforces (read
from ``brax/training/agents/ppo/train.py``, brax 0.14) *before* Brax runs into it, and names
the nearest valid settings:

* ``assert batch_size * num_minibatches % num_envs == 0`` (each training step runs
  ``batch_size * num_minibatches // num_envs`` sequential unrolls of every environment);
* ``assert num_envs % device_count == 0`` where ``device_count`` is
  ``min(local_device_count, max_devices_per_host) * process_count``;
* ``ValueError`` when ``wrap_env`` is on and ``episode_length`` is ``None``;
* ``ValueError`` when ``vision`` is on and ``action_repeat != 1``;
* ``AssertionError`` when ``use_distributional_critic`` is on and ``clipping_epsilon_value``
  is ``None``;
* ``learning_rate_schedule`` must be ``None``, ``"NONE"`` or ``"ADAPTIVE_KL"``
  (``ppo_optimizer.LRSchedule``); ``normalize_observations_mode`` ``"welford"`` or ``"ema"``;
* the sizes (``num_envs``, ``batch_size``, ``num_minibatches``, ``unroll_length``,
  ``action_repeat``, ``num_updates_per_batch``) are positive integers (a zero divides by zero
  or builds empty scans deep inside a jitted function).

:func:`plan_ppo` measures one environment state with ``jax.eval_shape(env.reset, key)``
(:func:`memfit.estimate.xla.step.env_state_bytes`), builds a ``ppo`` workload in Brax's layout
(:func:`ppo_workload`) and hands it to :func:`memfit.plan`. :func:`train` checks, then calls
Brax's own ``ppo.train``.

Nothing here imports brax or jax at import time; the functions that need them raise
:class:`memfit.BackendUnavailable` with a ``pip install`` hint when they are missing.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from memfit._checks import require as require_arg
from memfit._checks import require_instance, require_mapping, require_object, require_positive_int
from memfit._lazy import require
from memfit.allocator.xla_fraction import (
    FRACTION_VARIABLES,
    recommended_xla_fraction,
    xla_fraction_variable,
)
from memfit.core.constraints import PRESETS, Violation, parse_expr
from memfit.core.measured import BraxMeasurements
from memfit.core.plan import Plan
from memfit.core.workload import Workload, parse_workload
from memfit.errors import ConfigError
from memfit.estimate.brax_measure import measure_ppo, resolve_measurements
from memfit.hardware.catalog import GpuSpec, anonymous_gpu
from memfit.hardware.catalog import gpu as catalog_gpu

__all__ = [
    "BRAX_PPO_DEFAULTS",
    "BRAX_PPO_RULES",
    "DEFAULT_RANGES",
    "PpoViolation",
    "check_ppo",
    "describe",
    "ensure_jax_compat",
    "jax_allocator_settings",
    "measure_ppo",
    "plan_ppo",
    "ppo_kwargs",
    "ppo_violations",
    "ppo_workload",
    "resolve_measurements",
    "train",
]

#: Defaults of ``brax.training.agents.ppo.train.train`` (brax 0.14) that the rules read.
BRAX_PPO_DEFAULTS: dict[str, Any] = {
    "num_envs": 1,
    "batch_size": 32,
    "num_minibatches": 16,
    "unroll_length": 10,
    "num_updates_per_batch": 2,
    "action_repeat": 1,
    "episode_length": None,
    "wrap_env": True,
    "vision": False,
    "max_devices_per_host": None,
    "use_distributional_critic": False,
    "clipping_epsilon_value": None,
    "learning_rate_schedule": None,
    "normalize_observations_mode": "welford",
}

#: Every keyword argument of brax 0.14's ``ppo.train`` (for did-you-mean on typos).
BRAX_PPO_PARAMETERS: frozenset[str] = frozenset(
    {
        "environment", "num_timesteps", "max_devices_per_host", "wrap_env", "vision",
        "augment_pixels", "num_envs", "episode_length", "action_repeat", "wrap_env_fn",
        "randomization_fn", "learning_rate", "entropy_cost", "discounting", "unroll_length",
        "batch_size", "num_minibatches", "num_updates_per_batch", "num_resets_per_eval",
        "normalize_observations", "normalize_observations_std_eps",
        "normalize_observations_mode", "normalize_until_count", "reward_scaling",
        "clipping_epsilon", "clipping_epsilon_value", "gae_lambda", "max_grad_norm",
        "normalize_advantage", "vf_loss_coefficient", "bootstrap_on_timeout",
        "use_distributional_critic", "desired_kl", "learning_rate_schedule",
        "learning_rate_schedule_min_lr", "learning_rate_schedule_max_lr", "network_factory",
        "seed", "use_pmap_on_reset", "num_evals", "eval_env", "num_eval_envs",
        "deterministic_eval", "log_training_metrics", "training_metrics_steps", "progress_fn",
        "policy_params_fn", "save_checkpoint_path", "restore_checkpoint_path",
        "restore_params", "restore_value_fn", "run_evals",
    }
)  # fmt: skip

#: Knob ranges searched by :func:`plan_ppo` for knobs the caller does not pin
#: (``(min, max)``, powers of two; ``unroll_length`` from a list).
DEFAULT_RANGES: dict[str, tuple[int, ...]] = {
    "num_envs": (128, 16384),
    "batch_size": (64, 4096),
    "num_minibatches": (1, 64),
    "unroll_length": (5, 10, 20, 30),
}

_KNOBS = ("num_envs", "batch_size", "num_minibatches", "unroll_length")
_POSITIVE = (*_KNOBS, "action_repeat", "num_updates_per_batch")


#: Brax's rules over the four knobs, exactly as the workload preset states them
#: (:data:`memfit.core.constraints.PRESETS`): one source for ``memfit check``, the planner
#: and :func:`check_ppo`.
BRAX_PPO_RULES: tuple[str, ...] = PRESETS["brax_ppo"]

#: A broken rule of Brax PPO is a core :class:`memfit.core.constraints.Violation`.
PpoViolation = Violation


def describe(violation: Violation) -> str:
    """A violation and its nearest fixes in one line."""
    require_instance(
        "violation", violation, Violation, what="a memfit Violation (from ppo_violations)"
    )
    if not violation.suggestions:
        return violation.message
    fixes = " or ".join(
        ", ".join(f"{k}={v!r}" for k, v in s.items()) for s in violation.suggestions
    )
    return f"{violation.message}; nearest valid: {fixes}"


def _first_knob(violation: Violation) -> str:
    """The key path of a violation: ``ppo.<the first knob it names>``."""
    return "ppo." + (next(iter(violation.knobs), None) or violation.rule.split()[0])


def _whole_or(value: Any, default: int) -> int:
    """``value`` as a positive int when it is one in disguise (``2048.0``, ``"2048"``)."""
    if isinstance(value, float) and value.is_integer() and value >= 1:
        return int(value)
    if isinstance(value, str) and value.strip().isdigit() and int(value) >= 1:
        return int(value)
    return default


def _multiples_near(value: int, unit: int, *, lowest: int = 1) -> list[int]:
    """The multiples of ``unit`` just below and just above ``value`` (at least ``lowest``)."""
    below = (value // unit) * unit
    above = below + unit if below != value else value
    out = [m for m in (below, above) if m >= lowest]
    return sorted(set(out), key=lambda m: (abs(m - value), m))


def _divisors_near(total: int, value: int, unit: int) -> list[int]:
    """Divisors of ``total`` that are multiples of ``unit``: the nearest below and above."""
    candidates = [d for d in range(unit, total + 1, unit) if total % d == 0]
    below = [d for d in candidates if d < value]
    above = [d for d in candidates if d > value]
    picks = ([below[-1]] if below else []) + ([above[0]] if above else [])
    return sorted(picks, key=lambda d: (abs(d - value), d))


def _check_counts(local_device_count: Any, process_count: Any) -> None:
    for name, value in (
        ("local_device_count", local_device_count),
        ("process_count", process_count),
    ):
        if value is not None:
            require_positive_int(name, value, hint="leave it None to ask JAX")


def require_env(env: Any, *, name: str = "env") -> None:
    """A Brax environment: what memfit calls on one (``reset``, ``step``) and reads
    (``observation_size``, ``action_size``).

    Raises:
        ConfigError: Naming ``name`` and what the object lacks.
    """
    require_object(
        name,
        env,
        methods=("reset", "step"),
        attributes=("observation_size", "action_size"),
        what="a Brax environment",
        hint="pass brax.envs.get_environment('humanoid') (or your own brax Env)",
    )


def _require_plan(plan: Any) -> None:
    require_instance(
        "plan", plan, Plan, what="a memfit Plan (what plan_ppo or memfit.plan returns)"
    )


def _device_count(
    local_device_count: int | None, process_count: int | None, max_devices_per_host: int | None
) -> int:
    if local_device_count is None or process_count is None:
        jax = require("jax")
        if local_device_count is None:
            local_device_count = int(jax.local_device_count())
        if process_count is None:
            process_count = int(jax.process_count())
    local = local_device_count
    if max_devices_per_host:
        local = min(local, max_devices_per_host)
    return local * process_count


def ppo_violations(
    *,
    local_device_count: int | None = None,
    process_count: int | None = None,
    **ppo_kwargs: Any,
) -> list[Violation]:
    """Every rule of Brax PPO that ``ppo_kwargs`` break, each with the nearest valid settings.

    Arguments not given take Brax's defaults (:data:`BRAX_PPO_DEFAULTS`).

    Args:
        local_device_count: Devices on this host; ``None`` asks ``jax.local_device_count()``
            (which starts JAX's backend: apply :func:`memfit.configure` first).
        process_count: JAX processes; ``None`` asks ``jax.process_count()``.
        **ppo_kwargs: The keyword arguments meant for ``ppo.train``.

    Returns:
        The broken rules, empty when Brax will accept the arguments.

    Raises:
        ConfigError: When an argument is not one ``ppo.train`` takes (with the nearest name).
        BackendUnavailable: When a device count is needed from JAX and JAX is not installed.
    """
    _check_counts(local_device_count, process_count)
    unknown = sorted(set(ppo_kwargs) - BRAX_PPO_PARAMETERS)
    if unknown:
        name = unknown[0]
        near = difflib.get_close_matches(name, sorted(BRAX_PPO_PARAMETERS), n=1)
        raise ConfigError(
            f"ppo.train takes no argument {name!r}",
            key_path=name,
            hint=f"did you mean {near[0]!r}?" if near else "see brax.training.agents.ppo.train",
        )
    args = {**BRAX_PPO_DEFAULTS, **ppo_kwargs}
    out: list[Violation] = []
    bad_sizes = False
    for key in _POSITIVE:
        value = args[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            bad_sizes = True
            out.append(
                Violation(
                    source="brax_ppo",
                    rule=f"{key} >= 1",
                    knobs={key: value},
                    message=f"{key} must be a positive integer, not {value!r}",
                    suggestions=({key: _whole_or(value, BRAX_PPO_DEFAULTS[key])},),
                )
            )
    if not bad_sizes:
        out.extend(_divisibility(args, local_device_count, process_count))
    if args["wrap_env"] and args["episode_length"] is None:
        out.append(
            Violation(
                source="brax_ppo",
                rule="episode_length is not None when wrap_env",
                knobs={"episode_length": None, "wrap_env": True},
                message="episode_length must be given when wrap_env=True "
                "(Brax raises 'episode_length must be specified in ppo.train')",
                suggestions=({"episode_length": 1000},),
            )
        )
    if args["vision"] and args["action_repeat"] != 1:
        out.append(
            Violation(
                source="brax_ppo",
                rule="action_repeat == 1 when vision",
                knobs={"action_repeat": args["action_repeat"], "vision": True},
                message=f"vision=True needs action_repeat=1, not {args['action_repeat']!r} "
                "(repeat actions with the env's n_frames instead)",
                suggestions=({"action_repeat": 1},),
            )
        )
    if args["use_distributional_critic"] and args["clipping_epsilon_value"] is None:
        out.append(
            Violation(
                source="brax_ppo",
                rule="clipping_epsilon_value is not None when use_distributional_critic",
                knobs={"clipping_epsilon_value": None, "use_distributional_critic": True},
                message="use_distributional_critic=True needs clipping_epsilon_value "
                "(it is the kappa of the quantile Huber loss)",
                suggestions=(
                    {"clipping_epsilon_value": args.get("clipping_epsilon", 0.3)},
                    {"use_distributional_critic": False},
                ),
            )
        )
    schedule = args["learning_rate_schedule"]
    schedule_name = getattr(schedule, "value", schedule)
    if schedule_name not in (None, "NONE", "ADAPTIVE_KL"):
        out.append(
            Violation(
                source="brax_ppo",
                rule="learning_rate_schedule in (None, 'NONE', 'ADAPTIVE_KL')",
                knobs={"learning_rate_schedule": schedule},
                message=f"unknown learning_rate_schedule {schedule!r}",
                suggestions=(
                    {"learning_rate_schedule": None},
                    {"learning_rate_schedule": "ADAPTIVE_KL"},
                ),
            )
        )
    if args["normalize_observations_mode"] not in ("welford", "ema"):
        out.append(
            Violation(
                source="brax_ppo",
                rule="normalize_observations_mode in ('welford', 'ema')",
                knobs={"normalize_observations_mode": args["normalize_observations_mode"]},
                message="unknown normalize_observations_mode "
                f"{args['normalize_observations_mode']!r}",
                suggestions=({"normalize_observations_mode": "welford"},),
            )
        )
    return out


def _divisibility(
    args: Mapping[str, Any], local_device_count: int | None, process_count: int | None
) -> list[Violation]:
    """The ``brax_ppo`` preset's rules, evaluated by the core's expression evaluator, each
    broken one with the nearest valid settings (Brax-specific arithmetic over any integers,
    not a knob domain)."""
    envs, batch, minis = args["num_envs"], args["batch_size"], args["num_minibatches"]
    devices = _device_count(local_device_count, process_count, args["max_devices_per_host"])
    values = {
        "num_envs": envs,
        "batch_size": batch,
        "num_minibatches": minis,
        "device_count": devices,
    }
    trajectories = batch * minis
    out: list[Violation] = []
    for text in BRAX_PPO_RULES:
        expr = parse_expr(text)
        if expr.evaluate(values):
            continue
        involved = {n: values[n] for n in expr.names}
        fixes: list[dict[str, Any]] = []
        if "batch_size" in expr.names:  # batch_size * num_minibatches % num_envs == 0
            minis_unit = envs // math.gcd(envs, batch)
            fixes += [{"num_minibatches": m} for m in _multiples_near(minis, minis_unit)[:1]]
            batch_unit = envs // math.gcd(envs, minis)
            fixes += [{"batch_size": b} for b in _multiples_near(batch, batch_unit)[:1]]
            fixes += [{"num_envs": e} for e in _divisors_near(trajectories, envs, devices)[:2]]
            message = (
                f"batch_size * num_minibatches = {batch} x {minis} = {trajectories} "
                f"is not a multiple of num_envs = {envs}"
            )
        else:  # num_envs % device_count == 0
            near = [
                e for e in _multiples_near(envs, devices, lowest=devices) if trajectories % e == 0
            ]
            fixes = [{"num_envs": e} for e in near] or [
                {"num_envs": e} for e in _multiples_near(envs, devices, lowest=devices)
            ]
            message = f"num_envs = {envs} is not a multiple of device_count = {devices}"
        out.append(
            Violation(
                source="brax_ppo",
                rule=f"brax_ppo: {text}",
                knobs=involved,
                message=message,
                suggestions=tuple(fixes),
            )
        )
    return out


def check_ppo(
    *,
    local_device_count: int | None = None,
    process_count: int | None = None,
    **ppo_kwargs: Any,
) -> dict[str, Any]:
    """Check Brax PPO arguments before ``ppo.train`` asserts on them.

    Args:
        local_device_count: Devices on this host (``None``: ask JAX).
        process_count: JAX processes (``None``: ask JAX).
        **ppo_kwargs: The keyword arguments meant for ``ppo.train``.

    Returns:
        The arguments with Brax's defaults filled in for the checked names.

    Raises:
        ConfigError: When any rule is broken; the message lists every broken rule and the
            hint the nearest valid settings (``key_path`` names the first rule's knobs).
        BackendUnavailable: When a device count is needed from JAX and JAX is not installed.

    >>> check_ppo(num_envs=512, batch_size=256, num_minibatches=4, episode_length=1000,
    ...           local_device_count=1, process_count=1)["num_envs"]
    512
    """
    problems = ppo_violations(
        local_device_count=local_device_count, process_count=process_count, **ppo_kwargs
    )
    if problems:
        first = problems[0]
        raise ConfigError(
            "Brax PPO would reject these arguments: " + "; ".join(p.message for p in problems),
            key_path=_first_knob(first),
            hint="; ".join(describe(p).split("; ", 1)[-1] for p in problems if p.suggestions),
        )
    return {**BRAX_PPO_DEFAULTS, **ppo_kwargs}


def _check_ranges(ranges: Any) -> None:
    """Search ranges: knob -> a tuple of values (or ``(low, high)``)."""
    require_mapping("ranges", ranges, optional=True)
    for knob, values in (ranges or {}).items():
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise ConfigError(
                f"ranges.{knob} must be a tuple of values, not {type(values).__name__}",
                key_path=f"ranges.{knob}",
                hint="ranges={'num_envs': (256, 8192)}",
            )
        for value in values:
            require_positive_int(f"ranges.{knob}", value)


def _widths(value: Any, name: str) -> list[int]:
    try:
        sizes = [int(v) for v in value]
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"{name} must be a sequence of layer widths, not {value!r}", key_path=name
        ) from exc
    if not sizes or min(sizes) < 1:
        raise ConfigError(f"{name} needs positive layer widths, not {value!r}", key_path=name)
    return sizes


def ppo_workload(
    *,
    observation_size: int,
    action_size: int,
    env_state_bytes: int,
    pinned: Mapping[str, int] | None = None,
    ranges: Mapping[str, tuple[int, ...]] | None = None,
    policy_hidden_layer_sizes: Sequence[int] = (32,) * 4,
    value_hidden_layer_sizes: Sequence[int] = (256,) * 5,
    device_count: int = 1,
    jax_preallocate: bool = True,
    name: str = "brax_ppo",
    measurements: BraxMeasurements | None = None,
    settings: Mapping[str, int] | None = None,
) -> Workload:
    """A ``ppo`` workload in Brax's layout, for :func:`memfit.plan`.

    Networks follow ``brax.training.agents.ppo.networks.make_ppo_networks``: the policy
    outputs a mean and a scale per action (``2 * action_size``), the value one number.

    Args:
        observation_size: Length of the observation vector.
        action_size: Length of the action vector.
        env_state_bytes: Bytes of one environment's state (``jax.eval_shape`` of ``reset``).
        pinned: Knob values to keep as they are (the others are searched).
        ranges: Search ranges for knobs that are not pinned (defaults :data:`DEFAULT_RANGES`):
            ``(min, max)`` searched over powers of two, or more values as a list of choices.
        policy_hidden_layer_sizes: Brax's ``policy_hidden_layer_sizes``.
        value_hidden_layer_sizes: Brax's ``value_hidden_layer_sizes``.
        device_count: Devices Brax ``pmap`` s over.
        jax_preallocate: Plan against the XLA pool memfit recommends for the card
            (``True``, the default:
            :func:`memfit.allocator.xla_fraction.recommended_xla_fraction`) or allocation on
            demand (``False``).
        measurements: The env and Brax's training step measured (:func:`measure_ppo`): the
            plan's terms are then these measurements instead of the analytic model.
        settings: Fixed Brax arguments the measurement depends on
            (``num_updates_per_batch``, ``episode_length``).
        name: The workload's name.

    Returns:
        The validated workload.

    Raises:
        ConfigError: When a size, range or pinned value is invalid.
    """
    for key, size in (("observation_size", observation_size), ("action_size", action_size)):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigError(f"{key} must be a positive integer, not {size!r}", key_path=key)
    require_arg("env_state_bytes", env_state_bytes, "int")
    require_mapping("pinned", pinned, values="int", optional=True)
    _check_ranges(ranges)
    require_positive_int("device_count", device_count)
    require_arg("jax_preallocate", jax_preallocate, "bool")
    require_arg("name", name, "str")
    require_instance(
        "measurements",
        measurements,
        BraxMeasurements,
        what="BraxMeasurements (from measure_ppo)",
        optional=True,
    )
    require_mapping("settings", settings, values="int", optional=True)
    policy = _widths(policy_hidden_layer_sizes, "policy_hidden_layer_sizes")
    value = _widths(value_hidden_layer_sizes, "value_hidden_layer_sizes")
    pinned = dict(pinned or {})
    ranges = {**DEFAULT_RANGES, **(ranges or {})}
    knobs: dict[str, dict[str, Any]] = {}
    priorities = {"num_envs": 3, "unroll_length": 2, "batch_size": 1, "num_minibatches": 0}
    for knob in _KNOBS:
        if knob in pinned:
            knobs[knob] = {"choices": [int(pinned[knob])], "priority": priorities[knob]}
            continue
        domain = tuple(int(v) for v in ranges[knob])
        if len(domain) == 2 and knob != "unroll_length":
            low = 1 << max(0, (domain[0] - 1).bit_length())  # lowest power of two >= min
            knobs[knob] = {"min": low, "max": domain[1], "powers_of_two": True}
        else:
            knobs[knob] = {"choices": list(domain)}
        knobs[knob]["priority"] = priorities[knob]
    data: dict[str, Any] = {
        "name": name,
        "description": "Brax PPO (memfit.integrations.brax.ppo_workload)",
        "family": "ppo",
        "framework": "jax",
        "precision": "fp32",
        "optimizer": "adam",
        "ppo": {"layout": "brax"},
        "observations": {"vector": observation_size},
        "action_dim": action_size,
        "env_state_bytes": int(env_state_bytes),
        "networks": {
            "policy": {"layers": [*policy, 2 * action_size]},
            "value": {"layers": [*value, 1]},
        },
        "devices": {"count": device_count, "strategy": "pmap" if device_count > 1 else "single"},
        "jax": {"preallocate": jax_preallocate},
        "settings": dict(settings or {}),
        "knobs": knobs,
        "objective": "num_envs * unroll_length",
        "constraints": {"presets": ["brax_ppo"]},
    }
    if measurements is not None:
        data["env"] = measurements.env
        data["backend"] = measurements.backend
        data["measurements"] = json.loads(measurements.model_dump_json())
    return parse_workload(yaml.safe_dump(data, sort_keys=False), source=name)


def _observation_size(env: Any) -> int:
    size = getattr(env, "observation_size", None)
    if isinstance(size, Mapping):
        shape = size.get("state")
        if shape is None:
            raise ConfigError(
                f"dict observations without a 'state' entry: {sorted(size)}",
                key_path="env.observation_size",
                hint="plan vision PPO with a workload file that lists the cameras",
            )
        return int(math.prod(shape)) if isinstance(shape, Sequence) else int(shape)
    if isinstance(size, int):
        return size
    if isinstance(size, Sequence):
        return int(math.prod(size))
    raise ConfigError(
        f"{type(env).__name__} has no observation_size", key_path="env.observation_size"
    )


def plan_ppo(
    env: Any,
    gpu: Any = "local",
    *,
    margin: float | str = 0.1,
    ranges: Mapping[str, tuple[int, ...]] | None = None,
    local_device_count: int | None = None,
    process_count: int | None = None,
    jax_preallocate: bool = True,
    state_bytes: int | None = None,
    measure: bool = True,
    measurements: BraxMeasurements | None = None,
    **ppo_kwargs: Any,
) -> Plan:
    """Plan Brax PPO's ``num_envs`` / ``batch_size`` / ``num_minibatches`` / ``unroll_length``.

    The plan's terms are measurements of this env and of Brax's own training step
    (:func:`measure_ppo`, cached: the env state, the env step's temporaries, and the step
    compiled at three settings); with ``measure=False`` only the env state is measured
    (``jax.eval_shape(env.reset, key)``) and the rest is memfit's analytic model. Knobs given
    in ``ppo_kwargs`` are pinned, the others searched over :data:`DEFAULT_RANGES` (or
    ``ranges``) under Brax's rules.

    Args:
        env: A Brax environment (``observation_size``, ``action_size``, ``reset(key)``).
        gpu: A catalog name, a size, a :class:`memfit.GpuSpec`, or ``"local"``.
        margin: Safety margin (fraction of the GPU).
        ranges: Search ranges for knobs that are not pinned.
        local_device_count: Devices on this host (``None``: ask JAX).
        process_count: JAX processes (``None``: ask JAX).
        jax_preallocate: Plan against memfit's recommended XLA pool (see
            :func:`ppo_workload`); ``False``: allocation on demand.
        state_bytes: With ``measure=False``, bytes of one environment state when already
            measured (``None``: ``jax.eval_shape(env.reset, key)``).
        measure: Measure Brax's training step (the default; about half a minute on a CPU
            for a small env the first time, then cached) or plan analytically.
        measurements: Measurements already taken (:func:`measure_ppo`), to reuse.
        **ppo_kwargs: Arguments meant for ``ppo.train``; the four knobs among them are pinned,
            ``policy_hidden_layer_sizes`` / ``value_hidden_layer_sizes`` size the networks,
            and every rule :func:`check_ppo` knows is checked on the pinned values.

    Returns:
        The plan (:class:`memfit.core.plan.Plan`); ``plan.knobs`` go to ``ppo.train``.

    Raises:
        ConfigError: When a pinned argument breaks a Brax rule, or the env lacks sizes.
        InfeasiblePlan: When no configuration fits the GPU.
        EstimateError: When ``env.reset`` cannot be traced abstractly.
        BackendUnavailable: When JAX is not installed.
    """
    from memfit.estimate.xla.step import env_state_bytes
    from memfit.planning import plan

    require_env(env)
    if not isinstance(gpu, GpuSpec):
        require_arg("gpu", gpu, "str", "int")
    require_arg("margin", margin, "number", "str")
    _check_ranges(ranges)
    _check_counts(local_device_count, process_count)
    require_arg("jax_preallocate", jax_preallocate, "bool")
    require_arg("state_bytes", state_bytes, "int", optional=True)
    require_arg("measure", measure, "bool")
    require_instance(
        "measurements",
        measurements,
        BraxMeasurements,
        what="BraxMeasurements (from measure_ppo)",
        optional=True,
    )
    policy = _widths(
        ppo_kwargs.get("policy_hidden_layer_sizes", (32,) * 4), "policy_hidden_layer_sizes"
    )
    value = _widths(
        ppo_kwargs.get("value_hidden_layer_sizes", (256,) * 5), "value_hidden_layer_sizes"
    )
    brax_args = {
        k: v
        for k, v in ppo_kwargs.items()
        if k not in ("policy_hidden_layer_sizes", "value_hidden_layer_sizes")
    }
    devices = _device_count(
        local_device_count, process_count, brax_args.get("max_devices_per_host")
    )
    pinned = {k: int(brax_args[k]) for k in _KNOBS if k in brax_args}
    # planning needs no episode length: check that rule only when the caller wraps the env
    checked = brax_args if "episode_length" in brax_args else {"wrap_env": False, **brax_args}
    problems = ppo_violations(local_device_count=devices, process_count=1, **checked)
    if len(pinned) < len(_KNOBS):  # the planner keeps the preset's rules for the rest
        problems = [p for p in problems if not p.rule.startswith("brax_ppo: ")]
    if problems:
        raise ConfigError(
            "Brax PPO would reject these arguments: " + "; ".join(p.message for p in problems),
            key_path=_first_knob(problems[0]),
            hint="; ".join(describe(p) for p in problems),
        )
    require("jax")
    fixed = {
        k: int(brax_args[k])
        for k in ("num_updates_per_batch", "episode_length")
        if isinstance(brax_args.get(k), int)
    }
    if measurements is None and measure:
        measurements = measure_ppo(
            env,
            policy_hidden_layer_sizes=policy,
            value_hidden_layer_sizes=value,
            num_updates_per_batch=fixed.get("num_updates_per_batch", 2),
            normalize_observations=bool(brax_args.get("normalize_observations", False)),
            episode_length=fixed.get("episode_length", 1000),
        )
    if measurements is not None:
        state = measurements.env_state_bytes
    else:
        state = env_state_bytes(env) if state_bytes is None else state_bytes
    workload = ppo_workload(
        observation_size=_observation_size(env),
        action_size=int(env.action_size),
        env_state_bytes=state,
        pinned=pinned,
        ranges=ranges,
        policy_hidden_layer_sizes=policy,
        value_hidden_layer_sizes=value,
        device_count=devices,
        jax_preallocate=jax_preallocate,
        name=f"brax_ppo_{type(env).__name__.lower()}",
        measurements=measurements,
        settings=fixed,
    )
    return plan(workload, gpu=gpu, margin=margin)


def ppo_kwargs(plan: Plan) -> dict[str, int]:
    """The planned knobs as keyword arguments for ``ppo.train``.

    Raises:
        ConfigError: When the plan lacks one of Brax's four knobs.
    """
    _require_plan(plan)
    missing = [k for k in _KNOBS if k not in plan.knobs]
    if missing:
        raise ConfigError(
            f"the plan has no {', '.join(missing)}",
            key_path="plan.knobs",
            hint="plan a Brax PPO workload (plan_ppo or a ppo workload file)",
        )
    return {k: int(plan.knobs[k]) for k in _KNOBS}


def jax_allocator_settings(plan: Plan, total_bytes: int) -> dict[str, str]:
    """XLA client settings for a planned job: memfit's one XLA fraction recommendation.

    A plan made against a preallocated pool (the default) carries its settings
    (``plan.environment``): preallocate that pool, whose fraction is
    :func:`memfit.allocator.xla_fraction.recommended_xla_fraction` for the card unless the
    workload set one. A plan made without preallocation gets the same recommendation for a card of
    ``total_bytes``, once its buffers are checked to fit that pool.

    Args:
        plan: A plan from :func:`plan_ppo` (or :func:`memfit.plan` of a JAX workload).
        total_bytes: The GPU's total memory.

    Returns:
        ``{"XLA_PYTHON_CLIENT_PREALLOCATE": "true", NAME: ...}``, ``NAME`` the fraction's
        variable the installed jaxlib reads
        (:func:`memfit.allocator.xla_fraction.xla_fraction_variable`).

    Raises:
        ConfigError: When ``total_bytes`` is not positive, the plan does not fit, or its
            buffers need more than the recommended pool.
    """
    _require_plan(plan)
    require_arg("total_bytes", total_bytes, "int", hint="the GPU's total memory in bytes")
    if total_bytes <= 0:
        raise ConfigError(
            f"total_bytes must be positive, not {total_bytes}", key_path="total_bytes"
        )
    if not plan.fits:
        raise ConfigError(
            f"the plan does not fit {plan.gpu}",
            key_path="plan",
            hint="plan a smaller configuration first",
        )
    if any(name in plan.environment for name in FRACTION_VARIABLES):
        return dict(plan.environment)
    try:
        spec = catalog_gpu(plan.gpu)
    except ConfigError:
        spec = anonymous_gpu(total_bytes)
    if spec.total_bytes != total_bytes:
        spec = anonymous_gpu(total_bytes)
    advice = recommended_xla_fraction(spec)
    need = plan.predicted_bytes - plan.breakdown.get("cuda_context", 0)
    if need > advice.fraction * total_bytes:
        raise ConfigError(
            f"the plan's buffers ({need} bytes) need more than the {advice.value} pool memfit "
            f"recommends on {plan.gpu}",
            key_path="plan",
            hint="plan with jax_preallocate=True, so the plan fits the pool",
        )
    return {"XLA_PYTHON_CLIENT_PREALLOCATE": "true", xla_fraction_variable()[0]: advice.value}


def ensure_jax_compat() -> bool:
    """Give brax 0.14 the ``jax.device_put_replicated`` that newer JAX removed.

    JAX 0.10 removed ``jax.device_put_replicated`` (its migration guide names
    ``jax.device_put`` with a sharding as the replacement); brax 0.14's ``ppo.train`` still
    calls it once, to replicate the training state over the local devices. This installs
    that documented replacement under the old name when, and only when, JAX lacks it.

    Returns:
        ``True`` when the replacement was installed, ``False`` when JAX has its own.

    Raises:
        BackendUnavailable: When JAX is not installed.
    """
    jax: Any = require("jax")
    if hasattr(jax, "device_put_replicated"):  # JAX still has its own
        return False
    import jax.numpy as jnp
    import numpy as np

    def device_put_replicated(x: Any, devices: Sequence[Any]) -> Any:
        devs = list(devices)
        mesh = jax.sharding.Mesh(np.array(devs), ("replica",))
        sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("replica"))
        return jax.tree_util.tree_map(
            lambda a: jax.device_put(jnp.stack([jnp.asarray(a)] * len(devs)), sharding), x
        )

    jax.device_put_replicated = device_put_replicated
    return True


def train(environment: Any, **ppo_kwargs: Any) -> Any:
    """Check the arguments with :func:`check_ppo`, then run Brax's own ``ppo.train``.

    Args:
        environment: The Brax environment.
        **ppo_kwargs: Keyword arguments for ``brax.training.agents.ppo.train.train``.

    Returns:
        What ``ppo.train`` returns: ``(make_policy, params, metrics)``.

    Raises:
        ConfigError: When a Brax rule is broken (before Brax asserts).
        BackendUnavailable: When brax is not installed.
    """
    require_env(environment, name="environment")
    ppo = require("brax.training.agents.ppo.train")
    check_ppo(**ppo_kwargs)
    ensure_jax_compat()
    return ppo.train(environment=environment, **ppo_kwargs)
