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

Isaac Lab needs Isaac Sim and does not install on a CPU-only machine; memfit tests these
against its documented call signatures with a stand-in environment object.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from memfit.errors import ConfigError
from memfit.runtime.events import EventSink, MemoryEvent, emit

__all__ = ["cleanup_event", "guarded_term"]

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
