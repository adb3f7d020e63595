"""Gymnasium: a wrapper that records memory per environment step and guards ``step``.

Usage::

    import gymnasium as gym
    from memfit.integrations.gymnasium import MemoryWrapper

    env = MemoryWrapper(gym.make("CartPole-v1"), recorder=memfit.Recorder("env.jsonl"))

What is guarded depends on what can be run again without stepping an environment twice:

* a single environment: its ``step`` runs under :class:`memfit.RolloutGuard`. An
  out-of-memory error is left, the memory freed, the environment's ``np_random`` (and the
  global generators) put back, and the step run again. This assumes the step failed before
  it changed the environment, as a step that allocates its outputs first does.
* a ``SyncVectorEnv``: its step loops over the sub-environments in Python, so an error in
  sub-environment ``i`` comes after ``0 .. i-1`` have stepped. Retrying the whole vector step
  would step them twice (and lose the transitions of the first try). Each sub-environment's
  own ``step`` and ``reset`` are guarded instead: only the one that failed runs again.
* an ``AsyncVectorEnv``: the sub-environments step in other processes and an error comes
  back after the others have stepped; nothing can be retried from here, so the wrapper
  records memory and does not guard (``guard=True`` is refused, ``"auto"`` warns once).
* any other vector environment (a batched GPU simulator): its batched ``step`` is guarded as
  one call, and with ``max_splits`` > 1 it may be run in chunks of the environments when its
  ``step`` accepts a subset; pass ``guard=False`` if its step is not safe to run again.

gymnasium is imported when a wrapper is made, not when this module is imported; without it,
:func:`MemoryWrapper` raises :class:`memfit.BackendUnavailable`.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

from memfit._checks import require as require_arg
from memfit._checks import require_callable, require_instance, require_object, require_positive_int
from memfit._lazy import require
from memfit.errors import ConfigError
from memfit.runtime.events import EventSink

__all__ = ["MemoryWrapper", "guard_mode", "wrapper_class"]


def wrapper_class(vector: bool = False) -> type[Any]:
    """The wrapper class (built on first use, on top of gymnasium's ``Wrapper``).

    Args:
        vector: Build on ``gymnasium.vector.VectorWrapper`` for vector environments.

    Returns:
        The class; ``isinstance(env, wrapper_class())`` tells a wrapped env.

    Raises:
        BackendUnavailable: When gymnasium is not installed.
    """
    require_arg("vector", vector, "bool")
    return _build(vector)


def guard_mode(env: Any, guard: bool | str = "auto") -> str:
    """How :func:`MemoryWrapper` guards ``env``: ``"step"``, ``"sub_envs"`` or ``"none"``.

    Args:
        env: A ``gymnasium.Env`` or ``gymnasium.vector.VectorEnv`` (wrapped or not).
        guard: ``"auto"``, ``True`` (guard, refusing what cannot be retried) or ``False``.

    Raises:
        ConfigError: When ``guard`` is not one of those, or is ``True`` for an environment
            whose steps cannot be retried (an ``AsyncVectorEnv``).
        BackendUnavailable: When gymnasium is not installed.
    """
    gym = require("gymnasium")
    _require_env(gym, env)
    if guard is False:
        return "none"
    if guard not in (True, "auto"):
        raise ConfigError(
            f"guard must be 'auto', True or False, not {guard!r}",
            key_path="guard",
        )
    if not isinstance(env, gym.vector.VectorEnv):
        return "step"
    base = env.unwrapped
    if isinstance(base, gym.vector.SyncVectorEnv):
        return "sub_envs"
    if isinstance(base, gym.vector.AsyncVectorEnv):
        if guard is True:
            raise ConfigError(
                "an AsyncVectorEnv steps its sub-environments in other processes: when one "
                "runs out of memory the others have already stepped, and no step can be "
                "run again from here",
                key_path="guard",
                hint="use vectorization_mode='sync' (each sub-environment is then guarded "
                "on its own), guard the step inside the worker, or pass guard=False to "
                "record memory only",
            )
        warnings.warn(
            "memfit: AsyncVectorEnv steps are recorded, not guarded (a failed step cannot "
            "be retried from the main process); use a SyncVectorEnv to guard them",
            stacklevel=3,
        )
        return "none"
    return "step"


def _require_env(gym: Any, env: Any) -> None:
    require_instance(
        "env",
        env,
        (gym.Env, gym.vector.VectorEnv),
        what="a Gymnasium environment",
        hint="pass gymnasium.make(...) or a gymnasium.vector env",
    )


@functools.cache
def _build(vector: bool) -> type[Any]:
    gym = require("gymnasium")
    base: type[Any] = gym.vector.VectorWrapper if vector else gym.Wrapper

    class _MemoryWrapper(base):  # type: ignore[misc]
        """Record memory after every step and guard what can be run again."""

        def __init__(
            self,
            env: Any,
            *,
            recorder: Any | None,
            on_event: EventSink | None,
            max_splits: int,
            info_key: str | None,
            guard: bool | str,
        ) -> None:
            from memfit.runtime.guard import RolloutGuard

            super().__init__(env)
            self.recorder = recorder
            self.info_key = info_key
            sink = on_event
            if sink is None and recorder is not None:
                sink = recorder.on_event
            self.guard_mode = guard_mode(env, guard)
            self.guard: RolloutGuard[Any] | None = None
            self.sub_guards: list[RolloutGuard[Any]] = []
            self._patched: list[tuple[Any, str, bool]] = []
            if self.guard_mode == "step":
                rngs = [] if vector else [_np_random(self.env)]
                self.guard = RolloutGuard(
                    self.env.step, on_event=sink, max_splits=max_splits, rngs=rngs
                )
            elif self.guard_mode == "sub_envs":
                for sub in self.env.unwrapped.envs:
                    rng = [_np_random(sub)]
                    for name in ("step", "reset"):
                        had_own = name in vars(sub)
                        # One environment's step is never cut: its action is not a batch.
                        made = RolloutGuard(
                            getattr(sub, name), on_event=sink, rngs=rng, max_splits=1
                        )
                        made.source = f"RolloutGuard(sub-env {len(self.sub_guards)}.{name})"
                        setattr(sub, name, made)
                        self._patched.append((sub, name, had_own))
                        self.sub_guards.append(made)
            self.steps = 0

        def step(self, action: Any) -> Any:
            result = self.guard(action) if self.guard is not None else self.env.step(action)
            sample = None
            if self.recorder is not None:
                sample = self.recorder.step(self.steps)
            self.steps += 1
            if self.info_key is not None and sample is not None:
                info = result[-1]
                if isinstance(info, dict):
                    info[self.info_key] = sample
            return result

        def close(self) -> None:
            for sub, name, had_own in self._patched:
                if not had_own:
                    vars(sub).pop(name, None)
            self._patched = []
            super().close()
            if self.recorder is not None:
                self.recorder.close()

    _MemoryWrapper.__name__ = "MemoryVectorWrapper" if vector else "MemoryWrapper"
    _MemoryWrapper.__qualname__ = _MemoryWrapper.__name__
    return _MemoryWrapper


def _np_random(env: Any) -> Any:
    """The environment's own generator (made, and seeded from entropy, on first use)."""
    return env.unwrapped.np_random


def MemoryWrapper(
    env: Any,
    *,
    recorder: Any | None = None,
    on_event: EventSink | None = None,
    max_splits: int = 1,
    info_key: str | None = "memfit",
    guard: bool | str = "auto",
) -> Any:
    """Wrap a Gymnasium environment (or vector environment) to record and guard its steps.

    Args:
        env: A ``gymnasium.Env`` or ``gymnasium.vector.VectorEnv``.
        recorder: A :class:`memfit.Recorder`; ``recorder.step(n)`` is called after step
            ``n`` (it is closed with the environment). ``None`` records nothing.
        on_event: Where guard events go (default: the recorder's ``on_event``).
        max_splits: Chunks the guard may cut a batched vector step into (1: free and retry
            only). Not used for a ``SyncVectorEnv``, whose sub-environments are guarded one
            by one.
        info_key: Key under which the step's memory sample is put into ``info`` (``None``:
            leave ``info`` alone).
        guard: ``"auto"`` (guard what can be retried, see the module's doc), ``True``
            (the same, refusing an environment that cannot be retried) or ``False``
            (record only).

    Returns:
        The wrapped environment; its ``guard_mode`` says what is guarded.

    Raises:
        ConfigError: When ``env`` is not a Gymnasium environment, or ``guard=True`` for an
            ``AsyncVectorEnv``.
        BackendUnavailable: When gymnasium is not installed.
    """
    gym = require("gymnasium")
    _require_env(gym, env)
    require_object(
        "recorder",
        recorder,
        methods=("step", "close", "on_event"),
        what="a memfit.Recorder",
        optional=True,
    )
    require_callable("on_event", on_event, optional=True)
    require_positive_int("max_splits", max_splits)
    require_arg("info_key", info_key, "str", optional=True)
    cls = wrapper_class(isinstance(env, gym.vector.VectorEnv))
    return cls(
        env,
        recorder=recorder,
        on_event=on_event,
        max_splits=max_splits,
        info_key=info_key,
        guard=guard,
    )
