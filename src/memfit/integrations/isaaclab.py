"""Isaac Lab: an interval event term that applies a cleanup policy, and a guarded observation.

Isaac Lab calls an event term as ``func(env, env_ids, **params)`` where the term is declared
as ``EventTermCfg(func=..., mode="interval", interval_range_s=(a, b), params={...})``, and an
observation term as ``func(env, **params)`` returning a tensor with the environments first
(camera terms such as ``mdp.image(env, sensor_cfg, data_type)`` give ``(num_envs, H, W, C)``).
Both functions here follow those signatures and import nothing of Isaac Lab, so they work
with any object shaped like its ``ManagerBasedRLEnv``::

    from isaaclab.managers import EventTermCfg, ObservationTermCfg
    from memfit.integrations import isaaclab as mf

    cleanup = EventTermCfg(func=mf.cleanup_event, mode="interval",
                           interval_range_s=(10.0, 10.0),
                           params={"policy": memfit.cleanup.on_pressure()})
    rgb = ObservationTermCfg(func=mf.guarded_term(mdp.image, to_dtype=torch.uint8),
                             params={"sensor_cfg": SceneEntityCfg("tiled_camera"),
                                     "data_type": "rgb"})

:func:`autoconfig` is :func:`memfit.autoconfig` for an Isaac Lab env: Isaac Sim and its
renderer run in the training process, so once the env exists (the simulator started, its
cameras allocated) it reads what the env's device has free, pins ``num_envs`` to the env's,
leaves the workload's ``simulator`` terms out (they are in the used memory now) and plans the
rest::

    env = gym.make("Isaac-Lift-Cube-Franka-v0", cfg=env_cfg)
    cfg = mf.autoconfig(env.unwrapped, "act_dual_camera")   # its one knob: num_envs
    if not cfg.plan.fits:
        print(f"{cfg.knobs['num_envs']} envs do not fit what is free: lower num_envs")
    print(f"headroom {cfg.plan.headroom_bytes / 2**30:.2f} GiB with {cfg.knobs['num_envs']} envs")

:func:`measure` measures Isaac Sim on this card, inside the script, after the app started:
it creates the env at two or three settings, steps it, reads the device, closes it, fits
the simulator's figures and stores them, so the next ``memfit plan`` on this card plans with
them (:func:`memfit.measure_simulator`)::

    def make_env(point):
        cfg = parse_env_cfg("Isaac-Cartpole-RGB-Camera-Direct-v0", num_envs=point["num_envs"])
        cam = point["cameras"][0]
        cfg.tiled_camera.height, cfg.tiled_camera.width = cam["height"], cam["width"]
        return gym.make("Isaac-Cartpole-RGB-Camera-Direct-v0", cfg=cfg)

    cams = lambda size: [{"height": size, "width": size}]
    m = mf.measure(make_env, [{"num_envs": 16, "cameras": cams(80)},
                              {"num_envs": 64, "cameras": cams(80)},
                              {"num_envs": 64, "cameras": cams(160)}])

:func:`backends` reads which physics backend and renderer the running app uses (Isaac Lab
3: ``env.cfg.sim.physics`` is a ``PhysxCfg`` or ``NewtonCfg``; each camera's
``renderer_cfg`` an ``IsaacRtxRendererCfg``, ``NewtonWarpRendererCfg`` or
``OVRTXRendererCfg``); :func:`measure` records them with the measurement, so a plan uses it
for that backend and renderer only, and :func:`autoconfig` plans the workload with them.

Isaac Lab needs Isaac Sim and does not install on a CPU-only machine; memfit tests these
against its documented call signatures with a stand-in environment object.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from memfit._checks import parse_int, require_callable
from memfit._checks import require as require_arg
from memfit.errors import ConfigError
from memfit.runtime.events import EventSink, MemoryEvent, emit

__all__ = [
    "autoconfig",
    "backends",
    "cleanup_event",
    "guarded_term",
    "isaac_versions",
    "measure",
]

_DEFAULT_ATTR = "_memfit_cleanup_policy"


def cleanup_event(env: Any, env_ids: Any, policy: Any | None = None) -> bool:
    """Event term for ``EventTermCfg(mode="interval")``: run a memfit cleanup policy.

    Args:
        env: The Isaac Lab environment (only used to keep the default policy on).
        env_ids: The environments the event fires for (ignored: memory is per process).
        policy: A memfit cleanup policy (``memfit.cleanup.on_pressure()``,
            ``memfit.cleanup.every(n)``, ...): a callable returning whether it cleaned.
            ``None``: one ``on_pressure()`` policy kept on ``env``.

    Returns:
        Whether the policy cleaned.

    Raises:
        ConfigError: When ``policy`` is not callable.
    """
    if policy is None:
        policy = getattr(env, _DEFAULT_ATTR, None)
        if policy is None:
            from memfit.runtime.cleanup import on_pressure

            policy = on_pressure()
            setattr(env, _DEFAULT_ATTR, policy)
    if not callable(policy):
        raise ConfigError(
            f"policy must be a memfit cleanup policy, not {type(policy).__name__}",
            key_path="params.policy",
            hint="use memfit.cleanup.on_pressure() or memfit.cleanup.every(n)",
        )
    return bool(policy())


def guarded_term(
    term: Callable[..., Any],
    *,
    to_dtype: Any | None = None,
    on_event: EventSink | None = None,
    budget_bytes: int | None = None,
) -> Callable[..., Any]:
    """Wrap an observation term: retry it after freeing memory, shrink its dtype, watch its size.

    The returned function has the term's signature ``(env, **params)``. It runs the term
    under :class:`memfit.RolloutGuard` (an out-of-memory error is left, memory freed, the call
    retried once; an observation of every environment cannot be cut into parts here, so it
    does not split), converts the result to ``to_dtype`` when given (``torch.uint8`` keeps an
    RGB image at a quarter of its ``float32`` size), and reports an ``"observation"`` event
    the first time the observation's bytes are known, and again whenever they exceed
    ``budget_bytes``.

    Args:
        term: The observation term, e.g. ``isaaclab.envs.mdp.image``.
        to_dtype: A torch dtype to convert the observation to, or ``None``.
        on_event: Where events go (a :class:`memfit.Recorder`'s ``on_event``).
        budget_bytes: Bytes the observation may take before each call reports it.

    Returns:
        The wrapped term; ``.guard`` is its :class:`memfit.RolloutGuard`, ``.last_bytes`` the
        size of the last observation.

    Raises:
        ConfigError: When ``term`` is not callable or ``budget_bytes`` is not positive.
    """
    if not callable(term):
        raise ConfigError(f"term must be callable, not {type(term).__name__}", key_path="term")
    if to_dtype is not None and not (
        type(to_dtype).__name__ == "dtype" and type(to_dtype).__module__ == "torch"
    ):
        raise ConfigError(
            f"to_dtype must be a torch dtype (torch.uint8) or None, not {type(to_dtype).__name__}",
            key_path="to_dtype",
        )
    require_callable("on_event", on_event, optional=True)
    require_arg("budget_bytes", budget_bytes, "int", optional=True)
    if budget_bytes is not None and budget_bytes <= 0:
        raise ConfigError(
            f"budget_bytes must be positive, not {budget_bytes}", key_path="budget_bytes"
        )
    from memfit.runtime.guard import RolloutGuard

    guard: RolloutGuard[Any] = RolloutGuard(term, on_event=on_event, max_splits=1)
    name = getattr(term, "__name__", "term")

    @functools.wraps(term)
    def wrapped(env: Any, **params: Any) -> Any:
        out = guard(env, **params)
        if to_dtype is not None and getattr(out, "dtype", to_dtype) != to_dtype:
            out = _convert(out, to_dtype)
        nbytes = _nbytes(out)
        first = wrapped.last_bytes is None  # type: ignore[attr-defined]
        wrapped.last_bytes = nbytes  # type: ignore[attr-defined]
        over = budget_bytes is not None and nbytes is not None and nbytes > budget_bytes
        if nbytes is not None and (first or over):
            shape = tuple(getattr(out, "shape", ()))
            emit(
                on_event,
                MemoryEvent(
                    "observation",
                    None,
                    f"isaaclab.{name}",
                    f"{name} gives {shape} {getattr(out, 'dtype', '')}: {nbytes} bytes"
                    + (f", over the {budget_bytes}-byte budget" if over else ""),
                    {"bytes": nbytes, "shape": list(shape), "budget_bytes": budget_bytes},
                ),
            )
        return out

    wrapped.guard = guard  # type: ignore[attr-defined]
    wrapped.last_bytes = None  # type: ignore[attr-defined]
    return wrapped


def _convert(out: Any, dtype: Any) -> Any:
    """Convert a float image in [0, 1] or an integer one to ``dtype``."""
    import torch

    if dtype == torch.uint8 and out.is_floating_point():
        scale = 255.0 if float(out.max()) <= 1.0 else 1.0
        return (out * scale).round_().clamp_(0, 255).to(torch.uint8)
    return out.to(dtype)


def _nbytes(out: Any) -> int | None:
    numel = getattr(out, "numel", None)
    size = getattr(out, "element_size", None)
    if callable(numel) and callable(size):
        return int(numel()) * int(size())
    return None


def _device_index(device: Any) -> int:
    """``"cuda:1"`` -> 1; ``"cuda"`` or a ``torch.device`` without an index -> 0."""
    index = getattr(device, "index", None)
    if isinstance(index, int):
        return index
    text = str(device)
    if ":" in text:
        return parse_int("device", text.rsplit(":", 1)[1], lo=0, hint="a device such as cuda:0")
    return 0


def _physics_of(cfg: Any) -> str | None:
    """``physx`` or ``newton`` from a physics config's class (``None``: not Isaac Lab 3's)."""
    name = type(cfg).__name__.lower()
    if "newton" in name or "mjwarp" in name or "kamino" in name:
        return "newton"
    if "physx" in name:
        return "physx"
    return None


def _renderer_of(cfg: Any) -> str | None:
    """``rtx``, ``newton_warp`` or ``ovrtx`` from a renderer config (its ``renderer_type``,
    else its class name)."""
    kind = getattr(cfg, "renderer_type", None)
    text = kind if isinstance(kind, str) and kind not in ("", "base") else type(cfg).__name__
    text = text.lower()
    if "newton" in text or "warp" in text:
        return "newton_warp"
    if "ovrtx" in text or "ov_rtx" in text:
        return "ovrtx"
    if "rtx" in text:
        return "rtx"
    return None


def _sensors(env: Any) -> list[Any]:
    """The scene's sensors (``env.scene.sensors``, a mapping), or none."""
    scene = getattr(env, "scene", None)
    sensors = getattr(scene, "sensors", None)
    if isinstance(sensors, dict):
        return list(sensors.values())
    values = getattr(sensors, "values", None)
    return list(values()) if callable(values) else []


def backends(env: Any) -> tuple[str | None, str | None]:
    """``(physics, renderer)`` the running Isaac Lab app uses, as the workload's
    ``simulator.physics`` and ``simulator.renderer`` name them.

    Physics: the class of ``env.cfg.sim.physics`` (Isaac Lab 3: ``PhysxCfg``, ``NewtonCfg``;
    ``None`` there is Isaac Lab 3's default, PhysX); ``None`` when the config has no
    ``physics`` (Isaac Lab 1.x-2.x: PhysX, but not Isaac Lab 3's figures). Renderer: the
    ``renderer_cfg`` of the scene's cameras (``"none"`` when no sensor has one, on Isaac Lab
    3); ``None`` when it cannot be told.

    Args:
        env: The Isaac Lab env (or ``env.unwrapped``).
    """
    base = getattr(env, "unwrapped", env)
    sim_cfg = getattr(getattr(base, "cfg", None), "sim", None)
    lab3 = sim_cfg is not None and hasattr(sim_cfg, "physics")
    physics: str | None = None
    if lab3:
        physics_cfg = getattr(sim_cfg, "physics", None)
        physics = "physx" if physics_cfg is None else _physics_of(physics_cfg)
    renderer: str | None = None
    found = [getattr(getattr(s, "cfg", None), "renderer_cfg", None) for s in _sensors(base)]
    kinds = {_renderer_of(c) for c in found if c is not None} - {None}
    if len(kinds) == 1:
        renderer = kinds.pop()
    elif len(kinds) > 1:  # several renderers: the heaviest one's figures
        renderer = "rtx" if "rtx" in kinds else "ovrtx"
    elif lab3 and not any(c is not None for c in found):
        renderer = "none"
    return physics, renderer


def autoconfig(env: Any, workload: Any, **kwargs: Any) -> Any:
    """:func:`memfit.autoconfig` for an Isaac Lab env that has started: the env's device,
    ``num_envs`` pinned to the env's, the simulator and renderer already running.

    Args:
        env: An Isaac Lab env (``ManagerBasedRLEnv`` / ``DirectRLEnv``, or ``env.unwrapped``):
            its ``num_envs`` and ``device`` are read, and (Isaac Lab 3) the physics backend
            and renderer it runs (:func:`backends`), put into the workload's ``simulator``
            where it names none.
        workload: A workload, a path, or a bundled name.
        **kwargs: More arguments for :func:`memfit.autoconfig` (``margin``, ``probe``,
            ``apply``, more ``overrides``).

    Returns:
        The :class:`memfit.runtime.autoconfig.AutoConfig`.

    Raises:
        ConfigError: When the env has no ``num_envs``.
        BackendUnavailable: When the device cannot be read.
        InfeasiblePlan: When nothing fits what is free.
    """
    from memfit.core.workload import load_workload, require_workload
    from memfit.runtime.autoconfig import autoconfig as plan_now

    require_workload("workload", workload)
    num_envs = getattr(env, "num_envs", None)
    if not isinstance(num_envs, int) or num_envs < 1:
        raise ConfigError(
            f"{type(env).__name__} has no num_envs",
            key_path="env.num_envs",
            hint="pass the Isaac Lab env (or env.unwrapped) after it was created",
        )
    loaded = load_workload(workload)
    physics, renderer = backends(env)
    sim = loaded.simulator
    if sim is not None and sim.preset == "isaac_sim" and (physics or renderer):
        # plan with the backend and renderer that run (the simulator's own terms are left
        # out as already running; its figures still name what the plan assumed)
        update = {
            k: v
            for k, v in (("physics", physics), ("renderer", renderer))
            if v is not None and getattr(sim, k) != v
        }
        if update:
            changed = sim.model_copy(update=update)
            try:  # the combination the app runs must be one the workload can state
                type(sim).model_validate(changed.model_dump())
            except ValueError:
                changed = sim
            loaded = loaded.model_copy(update={"simulator": changed})
    overrides = dict(kwargs.pop("overrides", None) or {})
    if "num_envs" in loaded.knobs or "num_envs" in loaded.settings:
        overrides.setdefault("num_envs", num_envs)
    device = kwargs.pop("device", _device_index(getattr(env, "device", "cuda:0")))
    result = plan_now(loaded, device=device, overrides=overrides, **kwargs)
    if physics is not None or renderer is not None:
        result.notes.append(
            f"the Isaac Lab app runs {physics or 'unknown'} physics and the "
            f"{renderer or 'unknown'} renderer (read from the env)"
        )
    return result


def isaac_versions() -> str | None:
    """``"isaaclab 2.3.0, isaacsim 5.1.0"`` from the installed packages (``None`` when
    neither is installed as a package)."""
    from importlib import metadata

    parts = []
    for package in ("isaaclab", "isaacsim"):
        try:
            parts.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            continue
    return ", ".join(parts) or None


def _zero_step(env: Any) -> None:
    """One step with zero actions on the env's device."""
    import torch

    base = getattr(env, "unwrapped", env)
    device = getattr(base, "device", "cuda:0")
    env.step(torch.zeros(env.action_space.shape, device=device))


def measure(
    make_env: Callable[[dict[str, Any]], Any],
    points: Any = ({"num_envs": 16}, {"num_envs": 64}),
    **kwargs: Any,
) -> Any:
    """:func:`memfit.measure_simulator` for Isaac Lab: each env stepped ten times with zero
    actions before the reading, closed after it, the versions of the installed ``isaaclab``
    and ``isaacsim`` recorded, and (Isaac Lab 3) the physics backend and renderer of the
    first env created (:func:`backends`), so a plan uses the measurement for them only.

    Args:
        make_env: Creates the env for one point (``{"num_envs": 64, "cameras": [...]}``):
            ``gym.make(task, cfg=cfg)`` with the point's settings put into ``cfg``.
        points: The settings (see :func:`memfit.measure_simulator`).
        **kwargs: More arguments for :func:`memfit.measure_simulator` (``step``, ``steps``,
            ``version``, ``probe``, ``store``).

    Returns:
        The :class:`memfit.core.simulator.MeasuredSimulator`, stored for the next plan.

    Raises:
        ConfigError: On a bad argument.
        BackendUnavailable: When the device cannot be read.
    """
    from memfit.runtime.sim_measure import measure_simulator

    require_callable("make_env", make_env)
    kwargs.setdefault("step", _zero_step)
    kwargs.setdefault("simulator", "isaac_sim")
    if "version" not in kwargs:
        kwargs["version"] = isaac_versions()
    if "physics" in kwargs or "renderer" in kwargs:
        return measure_simulator(make_env, points, **kwargs)
    require_arg("store", kwargs.get("store", True), "bool")
    seen: dict[str, str | None] = {}

    def make_and_read(point: dict[str, Any]) -> Any:
        env = make_env(point)
        if not seen:
            seen["physics"], seen["renderer"] = backends(env)
        return env

    result = measure_simulator(make_and_read, points, **{**kwargs, "store": False})
    physics, renderer = seen.get("physics"), seen.get("renderer")
    if physics is not None or renderer is not None:
        result = result.model_copy(update={"physics": physics, "renderer": renderer})
    if kwargs.get("store", True):
        from pathlib import Path

        from memfit.runtime.sim_measure import store_measurement

        directory = kwargs.get("directory")
        store_measurement(result, Path(directory) if directory is not None else None)
    return result
