"""Measure Brax PPO from the real environment and Brax's own compiled training step.

:func:`measure_ppo` takes, without running anything on a device (every figure comes from
``jax.eval_shape`` or XLA's compiled memory analysis, on whatever backend JAX has):

1. the environment state, raw (``jax.eval_shape(env.reset, key)``) and as ``ppo.train``
   holds it after Brax's training wrappers (``brax.envs.training.wrap``: the automatic reset
   keeps the first state, so about twice the raw figure);
2. the bytes of one rollout transition (observation and next observation, action and raw
   action, reward, discount, log-probability, and the wrapper's ``truncation``,
   ``episode_metrics`` and ``episode_done``, as ``acting.generate_unroll`` stacks them);
3. the env step's temporaries: the wrapped, vmapped ``env.step`` compiled at two numbers of
   environments, fitted as a line;
4. Brax's own training step: ``brax.training.agents.ppo.train.train`` is called with the
   module's ``jax`` seen through a proxy that, instead of running, captures the function Brax
   hands to ``jax.pmap`` (``training_epoch``, one training step per epoch here) and the
   training state Brax would replicate, and evaluates the environment's reset abstractly.
   The captured step is lowered with ``jax.pmap(...).lower`` on abstract arguments at three
   settings (two numbers of environments) and compiled; XLA's memory analysis of each gives
   the bytes besides the training state and the env state, and the three solve
   ``fixed + per_transition * B*M*U + per_minibatch_item * B*U`` exactly.

The result (:class:`memfit.core.measured.BraxMeasurements`) is cached as JSON under
``$MEMFIT_CACHE_DIR`` (default ``~/.cache/memfit``), keyed by the brax, jax and jaxlib
versions, the XLA platform, the environment, its backend and everything else that shapes the
step, so a repeat plan is immediate. :func:`resolve_measurements` decides, for a workload that
names its environment, whether to use the cache, the measurements recorded in the workload
(with their provenance: the only choice where brax or jax is not installed) or to measure now.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import hashlib
import json
import os
import platform as _platform
import threading
import time
import types
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata, util
from pathlib import Path
from typing import Any

from memfit._checks import require as require_arg
from memfit._checks import (
    require_callable,
    require_instance,
    require_items,
    require_object,
    require_positive_int,
)
from memfit._lazy import require
from memfit.core.measured import AffineLine, BraxMeasurements, Provenance, StepFit
from memfit.core.workload import Workload
from memfit.errors import BackendUnavailable, ConfigError, EstimateError
from memfit.estimate import _brax_exports as _exports
from memfit.estimate._brax_exports import MAX_COMPILE_CHILDREN, compile_children

__all__ = [
    "ENV_STEP_SIZES",
    "MAX_COMPILE_CHILDREN",
    "MEASURE_POINTS",
    "cache_dir",
    "compile_children",
    "compile_step",
    "compile_steps",
    "gpu_target_for",
    "installed_versions",
    "is_env_factory",
    "measure_ppo",
    "measurement_config",
    "network_factory",
    "resolve_measurements",
]

#: The three settings Brax's training step is compiled at: ``(num_envs, batch_size,
#: num_minibatches, unroll_length)``. The second doubles the environments and the batch
#: (both counts double), the third doubles the minibatches (only ``B*M*U`` doubles), so the
#: three solve the fixed part and the two per-item coefficients exactly. All keep Brax's
#: rules (``batch_size * num_minibatches % num_envs == 0``).
MEASURE_POINTS: tuple[tuple[int, int, int, int], ...] = (
    (256, 64, 4, 10),
    (512, 128, 4, 10),
    (256, 64, 8, 10),
)

#: The share of a measurement's time its first stage (the env step's compiles) takes: the
#: humanoid (mjx) measured on the 2-core development VM in 123.8 s, Brax's training step's
#: three compiles about 25-30 s each of it (docs/benchmarks.md, "Brax PPO measured from the
#: real env"); the status line's time left is the first stage's time scaled by it.
ENV_STAGE_SHARE = 0.3


def time_left(elapsed_s: float, done_share: float) -> str:
    """``" (about 2 min left)"``: the time left when ``done_share`` of the work took
    ``elapsed_s``; ``""`` when nothing is known yet.

    >>> time_left(30.0, 0.25)
    ' (about 90 s left)'
    >>> time_left(100.0, 0.25)
    ' (about 5 min left)'
    >>> time_left(0.0, 0.25)
    ''
    """
    if elapsed_s <= 0 or not 0 < done_share < 1:
        return ""
    left = elapsed_s * (1 - done_share) / done_share
    if left < 120:
        return f" (about {max(10, round(left / 10) * 10):.0f} s left)"
    return f" (about {round(left / 60):.0f} min left)"


#: Numbers of environments the wrapped, vmapped ``env.step`` is compiled at.
ENV_STEP_SIZES: tuple[int, int] = (256, 1024)

#: Bump when what is measured changes, so old cache entries are not read.
_MEASURE_VERSION = 1

_CAPTURE_LOCK = threading.Lock()


class _Captured(Exception):
    """Raised by the proxy's ``device_put_replicated``: Brax has built everything."""


_MEASURE_PACKAGES: tuple[str, ...] = ("brax", "jax", "jaxlib")


def missing_packages() -> list[str]:
    """Which of brax, jax and jaxlib are not installed (package metadata and import spec;
    nothing is imported), in that order; empty when all three are."""
    missing: list[str] = []
    for name in _MEASURE_PACKAGES:
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            missing.append(name)
            continue
        if name != "jaxlib" and util.find_spec(name) is None:
            missing.append(name)
    return missing


def _missing_text(missing: list[str]) -> str:
    """``"brax is"`` / ``"brax and jax are"``: what is missing, for a sentence."""
    if not missing:
        return "one of brax, jax and jaxlib is"
    if len(missing) == 1:
        return f"{missing[0]} is"
    return ", ".join(missing[:-1]) + f" and {missing[-1]} are"


def installed_versions() -> dict[str, str] | None:
    """Versions of brax, jax and jaxlib, read from package metadata (nothing is imported);
    ``None`` when one of them is not installed (:func:`missing_packages` says which)."""
    if missing_packages():
        return None
    return {name: metadata.version(name) for name in _MEASURE_PACKAGES}


def _backends_started(started: Any) -> bool:
    """Whether JAX says its backends started (``False`` when its internals changed and the
    question cannot be asked: a JAX internals change must not break planning)."""
    try:
        return bool(started())
    except Exception:
        return False


def _guess_platform() -> str:
    """The XLA platform a measurement here would use, without starting JAX's backends: the
    one in use when JAX already started, else ``gpu`` where a CUDA plugin is installed."""
    import sys

    jax = sys.modules.get("jax")
    bridge = sys.modules.get("jax._src.xla_bridge")
    started = getattr(bridge, "backends_are_initialized", None)
    if jax is not None and callable(started) and _backends_started(started):
        return str(jax.default_backend())
    for plugin in ("jax-cuda12-plugin", "jax-cuda13-plugin", "jax-cuda12-pjrt", "jax-cuda13-pjrt"):
        try:
            metadata.version(plugin)
            return "gpu"
        except metadata.PackageNotFoundError:
            continue
    return "cpu"


def cache_dir() -> Path:
    """Where measurements are cached: ``$MEMFIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/memfit``,
    else ``~/.cache/memfit`` (a ``measurements`` folder inside)."""
    root = os.environ.get("MEMFIT_CACHE_DIR")
    if root:
        return Path(root) / "measurements"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "memfit" / "measurements"


def measurement_config(
    *,
    policy_hidden_layer_sizes: Sequence[int] = (32,) * 4,
    value_hidden_layer_sizes: Sequence[int] = (256,) * 5,
    num_updates_per_batch: int = 2,
    normalize_observations: bool = False,
    episode_length: int = 1000,
) -> dict[str, Any]:
    """What, besides the environment, shapes Brax's training step (the cache key's part)."""
    return {
        "policy_hidden_layer_sizes": [int(v) for v in policy_hidden_layer_sizes],
        "value_hidden_layer_sizes": [int(v) for v in value_hidden_layer_sizes],
        "num_updates_per_batch": int(num_updates_per_batch),
        "normalize_observations": bool(normalize_observations),
        "episode_length": int(episode_length),
        "points": [list(p) for p in MEASURE_POINTS],
        "env_step_sizes": list(ENV_STEP_SIZES),
        "memfit_measure_version": _MEASURE_VERSION,
    }


def _key(
    env_id: str,
    backend: str | None,
    config: Mapping[str, Any],
    versions: Mapping[str, str],
    platform: str,
) -> str:
    fields = {
        "env": _env_cache_id(env_id),
        "backend": backend,
        "config": dict(config),
        "versions": dict(versions),
        "platform": platform,
    }
    payload = json.dumps(fields, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:20]


def _cache_path(key: str, directory: Path | None) -> Path:
    return (directory or cache_dir()) / f"brax_ppo-{key}.json"


def _read_cache(path: Path) -> BraxMeasurements | None:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    try:
        return BraxMeasurements.model_validate_json(text)
    except ValueError:
        return None  # a damaged or older entry is measured again, never trusted


def _write_cache(path: Path, record: BraxMeasurements) -> None:
    """Write atomically (a temporary file renamed over the entry); a cache that cannot be
    written is not an error: the measurement is still returned."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(record.model_dump_json(indent=1), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        return


def _nbytes(tree: Any) -> int:
    import jax
    import numpy as np

    total = 0
    for leaf in jax.tree_util.tree_leaves(tree):
        shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
        if shape is None or dtype is None:
            continue
        total += int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return total


def _keys(n: int) -> Any:
    jax: Any = require("jax")
    return jax.ShapeDtypeStruct((n, 2), jax.numpy.uint32)


def _memory(compiled: Any) -> tuple[int, int, int, int]:
    """``(argument, output, alias, temp)`` bytes of a compiled executable."""
    stats = compiled.memory_analysis()
    if isinstance(stats, (list, tuple)):
        stats = stats[0]
    if stats is None:
        raise EstimateError(
            "this JAX backend has no compiled memory analysis",
            hint="measure on a backend that has one (CPU and GPU do), or upgrade jaxlib",
        )

    def get(name: str) -> int:
        return int(getattr(stats, name, 0) or 0)

    return (
        get("argument_size_in_bytes"),
        get("output_size_in_bytes"),
        get("alias_size_in_bytes"),
        get("temp_size_in_bytes"),
    )


def is_env_factory(env: str) -> bool:
    """Whether ``env`` names the user's own factory (``mypkg.envs:make_env``) rather than a
    registered Brax environment (``brax:humanoid``)."""
    return not env.startswith("brax:") and ":" in env


def _factory_env(spec: str, backend: str | None) -> Any:
    """The env the user's factory makes: ``factory(backend=backend)``, or ``factory()``
    without a backend.

    Raises:
        ConfigError: When the factory cannot be imported, fails, or returns no Brax env.
    """
    from memfit.estimate.bridge import load_factory

    make = load_factory(spec, key_path="env")
    try:
        made = make(**({"backend": backend} if backend else {}))
    except Exception as exc:  # the user's code
        raise ConfigError(
            f"the env factory {spec} failed: {type(exc).__name__}: {exc}",
            key_path="env",
            hint="call it in Python to see why"
            + ("; it is called with backend=" + repr(backend) if backend else ""),
        ) from exc
    envs = require("brax.envs")
    if not isinstance(made, envs.Env):
        raise ConfigError(
            f"the env factory {spec} returned {type(made).__name__}, not a brax.envs.Env",
            key_path="env",
            hint="return the environment (a brax.envs.PipelineEnv or brax.envs.Env), unwrapped: "
            "Brax's training wrappers are added when it is measured",
        )
    return made


def _env_cache_id(env_id: str) -> str:
    """The env's part of a cache key: for the user's factory, its id and a digest of its
    module's source, so that editing the env measures it again."""
    if not is_env_factory(env_id):
        return env_id
    module = env_id.partition(":")[0]
    try:
        found = util.find_spec(module)
    except (ImportError, ValueError):
        found = None
    origin = found.origin if found is not None else None
    if origin is None or not os.path.isfile(origin):
        return env_id
    with open(origin, "rb") as handle:
        digest = hashlib.sha256(handle.read()).hexdigest()[:16]
    return f"{env_id}#{digest}"


def _env_object(env: Any, backend: str | None) -> tuple[Any, str, str | None]:
    """The env object, its id (``brax:humanoid``, or the factory ``mypkg.envs:make_env``)
    and backend, from a name, a factory or an object."""
    if isinstance(env, str) and is_env_factory(env):
        return _factory_env(env, backend), env, backend
    if isinstance(env, str):
        name = env.split(":", 1)[1] if env.startswith("brax:") else env
        envs = require("brax.envs")
        try:
            made = envs.get_environment(name, **({"backend": backend} if backend else {}))
        except KeyError as exc:
            raise ConfigError(
                f"brax has no environment {name!r}",
                key_path="env",
                hint="one of " + ", ".join(sorted(getattr(envs, "_envs", {}))),
            ) from exc
        return made, f"brax:{name}", backend
    found = getattr(env, "_backend", None)
    kind = type(env)
    registry = getattr(require("brax.envs"), "_envs", {})
    names = [name for name, cls in registry.items() if cls is kind]
    env_id = f"brax:{names[0]}" if names else f"brax:{kind.__module__}.{kind.__qualname__}"
    return env, env_id, backend or (str(found) if found else None)


def _jax_proxy(jax: Any, captured: dict[str, Any]) -> types.ModuleType:
    """``jax`` as Brax's train module sees it while we capture its training step: every name
    is JAX's own except ``pmap`` (the training epoch is captured, anything else is evaluated
    abstractly: no environment is reset for real) and ``device_put_replicated`` (it records
    the training state and stops ``train`` before anything runs)."""

    class _Proxy(types.ModuleType):
        def __getattr__(self, name: str) -> Any:
            return getattr(jax, name)

    proxy = _Proxy("memfit_jax_proxy")

    def pmap(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[..., Any]:
        if getattr(fn, "__name__", "") == "training_epoch":
            captured["epoch"] = fn
            captured["pmap_kwargs"] = kwargs
            return fn

        def abstract(*call_args: Any) -> Any:
            out = jax.eval_shape(jax.vmap(fn, axis_name=kwargs.get("axis_name")), *call_args)
            captured.setdefault("reset", out)
            return out

        return abstract

    def device_put_replicated(tree: Any, devices: Any) -> Any:
        captured["training_state"] = tree
        raise _Captured

    proxy.pmap = pmap  # type: ignore[attr-defined]
    proxy.device_put_replicated = device_put_replicated  # type: ignore[attr-defined]
    return proxy


def _capture_step(env: Any, network_factory: Any, **kwargs: Any) -> dict[str, Any]:
    """Run Brax's ``ppo.train`` up to the point it would start training; return the captured
    training epoch, its pmap options, the training state and the abstract env state."""
    jax: Any = require("jax")
    ppo_train: Any = require("brax.training.agents.ppo.train")
    captured: dict[str, Any] = {}
    with _CAPTURE_LOCK:
        original = ppo_train.jax
        ppo_train.jax = _jax_proxy(jax, captured)
        # The proxy raises _Captured once it holds the training step: training never starts.
        try:
            with contextlib.suppress(_Captured):
                ppo_train.train(environment=env, network_factory=network_factory, **kwargs)
        finally:
            ppo_train.jax = original
    missing = [k for k in ("epoch", "training_state", "reset") if k not in captured]
    if missing:
        raise EstimateError(
            f"could not capture Brax's training step (no {', '.join(missing)}): this brax "
            f"({installed_versions() or {}}) builds ppo.train differently from brax 0.14",
            hint="plan with the measurements recorded in the workload (--measure recorded), "
            "or give env_state_bytes and drop env:",
        )
    return captured


def _transition_bytes(state: Any, action_size: int, n: int) -> int:
    """One rollout transition, as ``acting.generate_unroll`` stacks it for Brax PPO."""
    info = getattr(state, "info", {}) or {}
    extras = {k: info[k] for k in ("truncation", "episode_metrics", "episode_done") if k in info}
    per_env = 2 * _nbytes(state.obs) + _nbytes(extras)  # obs and next obs, state extras
    per_env += n * 4 * (2 * action_size + 3)  # action, raw action; reward, discount, log-prob
    return per_env // n


def measure_ppo(
    env: Any,
    *,
    backend: str | None = None,
    policy_hidden_layer_sizes: Sequence[int] = (32,) * 4,
    value_hidden_layer_sizes: Sequence[int] = (256,) * 5,
    num_updates_per_batch: int = 2,
    normalize_observations: bool = False,
    episode_length: int = 1000,
    cache: bool = True,
    refresh: bool = False,
    directory: Path | None = None,
    command: str | None = None,
    progress: Callable[[str], None] | None = None,
    gpu: str | None = None,
) -> BraxMeasurements:
    """Measure a Brax PPO job from its real environment and Brax's own training step.

    Args:
        env: A Brax environment, its name (``"humanoid"``, ``"brax:humanoid"``), or the
            user's factory as ``"module:function"`` (``"mypkg.envs:make_env"``, called as
            ``make_env(backend=backend)``, or with no argument without a backend; the
            current directory is on ``sys.path``), measured the same way.
        backend: The physics pipeline for a name (``"mjx"``, ``"generalized"``, ...).
        policy_hidden_layer_sizes: Brax's ``policy_hidden_layer_sizes``.
        value_hidden_layer_sizes: Brax's ``value_hidden_layer_sizes``.
        num_updates_per_batch: Brax's ``num_updates_per_batch`` (with two or more, the
            collected batch stays while each update permutes a copy of it).
        normalize_observations: Brax's ``normalize_observations``.
        episode_length: For Brax's training wrapper.
        cache: Read and write the cache.
        refresh: Measure even when the cache has this measurement.
        directory: The cache folder (default :func:`cache_dir`).
        command: The command to record in the provenance.
        progress: Called with a short sentence as each stage starts (compiling the env
            step, each training-step setting), for a status line; ``None``: silent.
        gpu: A catalog card to compile for with XLA's GPU compiler (the ``gpu-target``
            extra; :mod:`memfit.estimate.xla.gpu`), without the card; ``None``, a card
            without a target config, or no extra: this process's backend, as before. The
            provenance's ``platform`` says which (``"cuda sm_89 (NVIDIA GeForce RTX 4070)"``).

    Returns:
        The measurements (:class:`memfit.core.measured.BraxMeasurements`).

    Raises:
        BackendUnavailable: When brax or jax is not installed.
        ConfigError: When brax has no such environment, or the factory fails.
        EstimateError: When Brax's training step cannot be captured or compiled.
    """
    if not isinstance(env, str):
        require_object(
            "env",
            env,
            methods=("reset", "step"),
            what="a Brax environment or its name",
            hint="pass brax.envs.get_environment('humanoid'), 'humanoid' or 'module:function'",
        )
    require_arg("backend", backend, "str", optional=True)
    require_items("policy_hidden_layer_sizes", policy_hidden_layer_sizes, "int")
    require_items("value_hidden_layer_sizes", value_hidden_layer_sizes, "int")
    require_positive_int("num_updates_per_batch", num_updates_per_batch)
    require_arg("normalize_observations", normalize_observations, "bool")
    require_positive_int("episode_length", episode_length)
    require_arg("cache", cache, "bool")
    require_arg("refresh", refresh, "bool")
    require_arg("directory", directory, "path", optional=True)
    require_arg("command", command, "str", optional=True)
    require_callable("progress", progress, optional=True)
    require_arg("gpu", gpu, "str", optional=True)
    from memfit.estimate.xla._quiet import quiet_jax_start

    if not missing_packages():  # JAX and Brax start here: without their start-up noise
        quiet_jax_start(brax=True)
    require("brax")
    jax: Any = require("jax")
    versions = installed_versions() or {}
    made, env_id, backend = _env_object(env, backend)
    config = measurement_config(
        policy_hidden_layer_sizes=policy_hidden_layer_sizes,
        value_hidden_layer_sizes=value_hidden_layer_sizes,
        num_updates_per_batch=num_updates_per_batch,
        normalize_observations=normalize_observations,
        episode_length=episode_length,
    )
    target = gpu_target_for(gpu)
    platform = target.compiled_for if target is not None else str(jax.default_backend())
    path = _cache_path(_key(env_id, backend, config, versions, platform), directory)
    if cache and not refresh:
        found = _read_cache(path)
        if found is not None:
            return found
    start = time.perf_counter()
    # the steps exported for CUDA are the same for every card: kept beside the cache so that
    # measuring for another card only compiles (the child's XLA compile for the card)
    share = (
        _cache_path(_key(env_id, backend, config, versions, "exported"), directory).with_suffix(
            ".exported"
        )
        if cache and target is not None
        else None
    )
    record = _measure(
        made, env_id, backend, config, versions, platform, command, progress,
        target=target, share=share,
    )  # fmt: skip
    record = record.model_copy(
        update={
            "provenance": record.provenance.model_copy(
                update={"seconds": round(time.perf_counter() - start, 1)}
            )
        }
    )
    if cache:
        _write_cache(path, record)
    return record


def _measure(
    env: Any,
    env_id: str,
    backend: str | None,
    config: Mapping[str, Any],
    versions: Mapping[str, str],
    platform: str,
    command: str | None,
    progress: Callable[[str], None] | None = None,
    *,
    target: Any = None,
    share: Path | None = None,
) -> BraxMeasurements:
    say = progress or (lambda _text: None)
    started = time.perf_counter()
    jax: Any = require("jax")
    jnp: Any = require("jax.numpy")
    envs: Any = require("brax.envs")
    action_size = int(env.action_size)
    try:
        raw = _nbytes(jax.eval_shape(env.reset, jax.random.PRNGKey(0)))
        wrapped = envs.training.wrap(env, episode_length=config["episode_length"], action_repeat=1)
        n0 = ENV_STEP_SIZES[0]
        state0 = jax.eval_shape(wrapped.reset, _keys(n0))
        env_state = _nbytes(state0) // n0
        transition = _transition_bytes(state0, action_size, n0)
        step_points: list[list[int]] = []
        say(f"measuring {env_id}: compiling the env step at {len(ENV_STEP_SIZES)} sizes")

        def env_jobs() -> tuple[list[tuple[Any, tuple[Any, ...]]], dict[str, Any]]:
            jobs = []
            for n in ENV_STEP_SIZES:
                states = state0 if n == n0 else jax.eval_shape(wrapped.reset, _keys(n))
                actions = jax.ShapeDtypeStruct((n, action_size), jnp.float32)
                jobs.append((jax.jit(wrapped.step), (states, actions)))
            return jobs, {}

        if target is None:
            memories = _compile_all(env_jobs()[0], target)
        else:
            exported, _ = _exports.shared_exports(
                env_jobs, None if share is None else share / "env"
            )
            memories = _compile_exported_all(exported, target)
        step_points = [[n, m[3]] for n, m in zip(ENV_STEP_SIZES, memories, strict=True)]
    except (TypeError, ValueError, jax.errors.JAXTypeError) as exc:
        raise EstimateError(
            f"could not trace {env_id}'s reset or step abstractly: {exc}",
            hint="reset(key) and step(state, action) must be pure JAX functions",
        ) from exc
    (n_a, t_a), (n_b, t_b) = step_points
    slope = (t_b - t_a) / (n_b - n_a)
    env_step = AffineLine(fixed_bytes=t_a - slope * n_a, per_item_bytes=slope, points=step_points)
    factory = network_factory(config)
    points: list[dict[str, int]] = []
    training_state_bytes = 0
    say(
        f"measuring {env_id}: compiling Brax's training step at {len(MEASURE_POINTS)} settings"
        + (f" for {target.compiled_for}" if target is not None else "")
        + time_left(time.perf_counter() - started, ENV_STAGE_SHARE)
    )
    steps = compile_steps(
        env, factory, config, MEASURE_POINTS, env_id=env_id, target=target,
        share=None if share is None else share / "train",
    )  # fmt: skip
    for (n, batch, minis, unroll), compiled in zip(MEASURE_POINTS, steps, strict=True):
        training_state_bytes = compiled["training_state_bytes"]
        points.append(
            {
                "num_envs": n,
                "batch_size": batch,
                "num_minibatches": minis,
                "unroll_length": unroll,
                "bytes": compiled["peak_bytes"] - training_state_bytes - n * env_state,
            }
        )
    a, b, c = points
    transitions = [p["batch_size"] * p["num_minibatches"] * p["unroll_length"] for p in points]
    items = [p["batch_size"] * p["unroll_length"] for p in points]
    # c differs from a only in B*M*U; b from c only in B*U (see MEASURE_POINTS)
    per_transition = (c["bytes"] - a["bytes"]) / (transitions[2] - transitions[0])
    per_item = (b["bytes"] - c["bytes"]) / (items[1] - items[2])
    fixed = a["bytes"] - per_transition * transitions[0] - per_item * items[0]
    step = StepFit(
        fixed_bytes=fixed,
        per_transition_bytes=per_transition,
        per_minibatch_item_bytes=per_item,
        points=points,
    )
    provenance = Provenance(
        versions=dict(versions),
        platform=platform,
        date=_dt.datetime.now(_dt.timezone.utc).date().isoformat(),
        command=command or f"memfit.integrations.brax.measure_ppo({env_id!r}, backend={backend!r})",
        machine=f"{_platform.machine()}, {os.cpu_count()} CPUs, {platform} backend",
    )
    return BraxMeasurements(
        env=env_id,
        backend=backend,
        config=dict(config),
        provenance=provenance,
        env_state_bytes=env_state,
        env_state_raw_bytes=raw,
        transition_bytes=transition,
        training_state_bytes=training_state_bytes,
        env_step=env_step,
        step=step,
    )


def network_factory(config: Mapping[str, Any]) -> Any:
    """Brax's ``make_ppo_networks`` with the configuration's layer widths."""
    networks: Any = require("brax.training.agents.ppo.networks")
    return functools.partial(
        networks.make_ppo_networks,
        policy_hidden_layer_sizes=tuple(config["policy_hidden_layer_sizes"]),
        value_hidden_layer_sizes=tuple(config["value_hidden_layer_sizes"]),
    )


def gpu_target_for(gpu: str | None) -> Any:
    """The XLA target config to measure for, or ``None`` (this process's backend): ``gpu``
    must name a catalog card with a target config, and the ``gpu-target`` extra be here."""
    if gpu is None:
        return None
    from memfit.estimate.xla.gpu import gpu_target_missing
    from memfit.hardware.catalog import gpu as lookup_gpu
    from memfit.hardware.xla_target import target_config

    try:
        config = target_config(lookup_gpu(gpu))
    except ConfigError:
        return None
    return None if gpu_target_missing() else config


def _compile_all(
    jobs: Sequence[tuple[Any, tuple[Any, ...]]], target: Any
) -> list[tuple[int, int, int, int]]:
    """``(argument, output, alias, temp)`` of each ``(jitted, args)``: compiled here, or by
    XLA's GPU compiler for ``target`` (all in one child process)."""
    if target is None:
        return [_memory(fn.lower(*args).compile()) for fn, args in jobs]
    from memfit.estimate.xla.gpu import export_step

    return _compile_exported_all([export_step(fn, *args) for fn, args in jobs], target)


def _compile_exported_all(steps: Sequence[Any], target: Any) -> list[tuple[int, int, int, int]]:
    return _exports.compile_exported_all(steps, target)


def _prepare_step(
    env: Any, factory: Any, config: Mapping[str, Any], num_envs: int, batch_size: int,
    num_minibatches: int, unroll_length: int, *, single_device_jit: bool,
) -> tuple[Any, tuple[Any, ...], dict[str, int]]:  # fmt: skip
    """Brax's training step captured at one setting: the function to compile, its abstract
    arguments and the sizes of the training and env states."""
    jax: Any = require("jax")
    jnp: Any = require("jax.numpy")
    captured = _capture_step(
        env,
        factory,
        num_timesteps=batch_size * num_minibatches * unroll_length,
        num_envs=num_envs,
        batch_size=batch_size,
        num_minibatches=num_minibatches,
        unroll_length=unroll_length,
        episode_length=config["episode_length"],
        num_updates_per_batch=config["num_updates_per_batch"],
        normalize_observations=config["normalize_observations"],
        num_evals=1,
        run_evals=False,
        max_devices_per_host=1,
    )
    state = captured["training_state"]
    replicated = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct((1, *jnp.shape(x)), jnp.asarray(x).dtype), state
    )
    keys = jax.ShapeDtypeStruct((1, 2), jnp.uint32)
    kwargs = dict(captured["pmap_kwargs"])
    if single_device_jit:
        # one device: pmap's mapped axis of size 1 as a vmapped axis (collectives over it are
        # the identity), so the step can be exported and compiled for a GPU target
        donate = kwargs.pop("donate_argnums", ())
        fn = jax.jit(
            jax.vmap(captured["epoch"], axis_name=kwargs.get("axis_name"),
                     in_axes=kwargs.get("in_axes", 0)),
            donate_argnums=donate,
        )  # fmt: skip
    else:
        fn = jax.pmap(captured["epoch"], **kwargs)
    sizes = {
        "training_state_bytes": _nbytes(state),
        "env_state_bytes": _nbytes(captured["reset"]),
    }
    return fn, (replicated, captured["reset"], keys), sizes


def compile_steps(
    env: Any,
    factory: Any,
    config: Mapping[str, Any],
    settings: Sequence[tuple[int, int, int, int]],
    *,
    env_id: str = "env",
    target: Any = None,
    share: Path | None = None,
) -> list[dict[str, int]]:
    """Brax's own training step at each ``(num_envs, batch_size, num_minibatches,
    unroll_length)``, captured and compiled (nothing runs): here, or by XLA's GPU compiler
    for ``target`` (a :class:`memfit.hardware.xla_target.TargetConfig`); ``share``: a folder
    where the steps exported for CUDA are kept for other cards (read when present).

    Returns:
        Per setting ``{"peak_bytes", "training_state_bytes", "env_state_bytes",
        "argument_bytes", "output_bytes", "alias_bytes", "temp_bytes"}``.

    Raises:
        EstimateError: When the step cannot be captured or compiled.
    """
    jax: Any = require("jax")

    def build() -> tuple[list[tuple[Any, tuple[Any, ...]]], dict[str, Any]]:
        jobs, sizes = [], []
        for n, batch, minis, unroll in settings:
            fn, args, found = _prepare_step(
                env, factory, config, n, batch, minis, unroll,
                single_device_jit=target is not None,
            )  # fmt: skip
            jobs.append((fn, args))
            sizes.append(found)
        return jobs, {"sizes": sizes}

    try:
        if target is None:
            jobs, extra = build()
            memories = _compile_all(jobs, target)
        else:
            steps, extra = _exports.shared_exports(build, share)
            memories = _compile_exported_all(steps, target)
    except (TypeError, ValueError, jax.errors.JAXTypeError) as exc:
        raise EstimateError(
            f"could not compile Brax's training step for {env_id}: {exc}",
            hint="plan with the measurements recorded in the workload (--measure recorded)",
        ) from exc
    sizes = [{k: int(v) for k, v in found.items()} for found in extra["sizes"]]
    return [
        {
            "peak_bytes": argument + output - alias + temp,
            **found,
            "argument_bytes": argument,
            "output_bytes": output,
            "alias_bytes": alias,
            "temp_bytes": temp,
        }
        for (argument, output, alias, temp), found in zip(memories, sizes, strict=True)
    ]


def compile_step(
    env: Any,
    factory: Any,
    config: Mapping[str, Any],
    num_envs: int,
    batch_size: int,
    num_minibatches: int,
    unroll_length: int,
    *,
    env_id: str = "env",
    target: Any = None,
) -> dict[str, int]:
    """Brax's own training step at one setting (:func:`compile_steps` for one).

    Returns:
        ``{"peak_bytes", "training_state_bytes", "env_state_bytes", "argument_bytes",
        "output_bytes", "alias_bytes", "temp_bytes"}``: XLA's memory analysis of one
        training step (``peak = argument + output - alias + temp``).

    Raises:
        EstimateError: When the step cannot be captured or compiled.
    """
    setting = (num_envs, batch_size, num_minibatches, unroll_length)
    return compile_steps(env, factory, config, [setting], env_id=env_id, target=target)[0]


def _workload_config(workload: Workload) -> dict[str, Any]:
    nets = workload.networks
    policy = nets.get("policy")
    value = nets.get("value")
    settings = workload.settings
    return measurement_config(
        policy_hidden_layer_sizes=(policy.layers or [])[:-1] if policy else (32,) * 4,
        value_hidden_layer_sizes=(value.layers or [])[:-1] if value else (256,) * 5,
        num_updates_per_batch=settings.get("num_updates_per_batch", 2),
        normalize_observations=bool(settings.get("normalize_observations", 0)),
        episode_length=settings.get("episode_length", 1000),
    )


def _describe(record: BraxMeasurements) -> str:
    p = record.provenance
    versions = ", ".join(f"{k} {v}" for k, v in sorted(p.versions.items()))
    return f"{versions} on {p.platform}, {p.date} ({p.command})"


def resolve_measurements(
    workload: Workload,
    mode: str = "auto",
    *,
    directory: Path | None = None,
    progress: Callable[[str], None] | None = None,
    gpu: str | None = None,
) -> tuple[Workload, list[str]]:
    """The workload with the measurements a plan should use, and notes saying which.

    ``gpu`` (a catalog card) makes a measurement taken now compile with XLA's GPU compiler
    for that card where the ``gpu-target`` extra is installed (:func:`measure_ppo`).

    ``progress`` (a status line's updater) hears what a measurement is doing while it runs.

    For a workload that names its environment (``env: brax:humanoid``):

    * ``"auto"``: the recorded measurements when they were taken with the brax, jax and
      jaxlib installed here on this platform and the same configuration; else a cached
      measurement for this installation; else the recorded ones (saying with what they were
      taken); else, with brax installed, measure now (cached for next time);
    * ``"fresh"``: measure now (brax and jax needed), and cache;
    * ``"recorded"``: only the measurements recorded in the workload.

    A workload without ``env`` is returned as it is.

    Raises:
        ConfigError: When ``mode`` is unknown, or nothing usable exists (no recording, and
            brax is not installed, or ``"recorded"`` without a recording).
        BackendUnavailable: For ``"fresh"`` without brax or jax.
        EstimateError: When measuring fails.
    """
    require_instance(
        "workload",
        workload,
        Workload,
        what="a loaded memfit Workload",
        hint="memfit.load_workload('brax_humanoid_ppo') gives one",
    )
    require_arg("directory", directory, "path", optional=True)
    require_callable("progress", progress, optional=True)
    require_arg("gpu", gpu, "str", optional=True)
    if mode not in ("auto", "fresh", "recorded"):
        raise ConfigError(
            f"unknown measurement mode {mode!r}", key_path="--measure",
            hint="use auto, fresh or recorded",
        )  # fmt: skip
    if workload.env is None:
        return workload, []
    recorded = workload.measurements
    config = _workload_config(workload)
    versions = installed_versions()
    missing = missing_packages() if versions is None else []
    if mode == "recorded" or (mode == "auto" and versions is None):
        if recorded is None:
            raise ConfigError(
                f"{workload.name} names env {workload.env} but records no measurements"
                + (f", and {_missing_text(missing)} not installed" if missing else ""),
                key_path="measurements",
                hint=f"pip install {' '.join(missing or ['brax'])} and plan again (it "
                "measures the env), or give env_state_bytes and drop env:",
            )
        why = f"{_missing_text(missing)} not installed here: " if missing else ""
        return workload, [f"{why}measurements recorded in the workload with {_describe(recorded)}"]
    if mode == "auto" and versions is not None:
        target = gpu_target_for(gpu)
        platform = target.compiled_for if target is not None else _guess_platform()
        if (
            recorded is not None
            and recorded.provenance.versions == versions
            and recorded.provenance.platform == platform
            and recorded.config == config
        ):
            return workload, [f"measurements recorded in the workload with {_describe(recorded)}"]
        key = _key(workload.env, workload.backend, config, versions, platform)
        cached = _read_cache(_cache_path(key, directory))
        if cached is not None:
            return (
                workload.model_copy(update={"measurements": cached}),
                [f"measurements cached for this installation: {_describe(cached)}"],
            )
        if recorded is not None:
            return workload, [
                f"measurements recorded in the workload with {_describe(recorded)}; this "
                f"machine has {', '.join(f'{k} {v}' for k, v in sorted(versions.items()))}: "
                f"--measure fresh measures with those, compiled for {platform}"
            ]
    if versions is None:
        missing = missing_packages()
        raise BackendUnavailable(
            f"measuring a Brax env needs brax and jax; {_missing_text(missing)} not installed",
            hint=f"pip install {' '.join(missing or ['brax'])} (with an NVIDIA GPU: "
            'pip install "jax[cuda12]")',
        )
    start = time.perf_counter()
    record = measure_ppo(
        workload.env,
        backend=workload.backend,
        policy_hidden_layer_sizes=config["policy_hidden_layer_sizes"],
        value_hidden_layer_sizes=config["value_hidden_layer_sizes"],
        num_updates_per_batch=config["num_updates_per_batch"],
        normalize_observations=config["normalize_observations"],
        episode_length=config["episode_length"],
        refresh=mode == "fresh",
        directory=directory,
        command=f"memfit plan {workload.name} --measure fresh",
        progress=progress,
        gpu=gpu,
    )
    took = time.perf_counter() - start
    return (
        workload.model_copy(update={"measurements": record}),
        [f"measured now in {took:.0f} s (cached for next time): {_describe(record)}"],
    )
