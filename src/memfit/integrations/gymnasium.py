"""Gymnasium: a wrapper that records memory per environment step and guards ``step``.

Usage::

    import gymnasium as gym
    from memfit.integrations.gymnasium import MemoryWrapper

    env = MemoryWrapper(gym.make("CartPole-v1"), recorder=memfit.Recorder("env.jsonl"))

``step`` runs under :class:`memfit.RolloutGuard`: an out-of-memory error is left, the
memory freed and the step retried. A Gymnasium step cannot be cut into parts (the
environment owns its batch), so the guard does not split by default; a vectorised env whose
``step`` does accept a subset of the environments may pass ``max_splits`` > 1.

gymnasium is imported when a wrapper is made, not when this module is imported; without it,
:func:`MemoryWrapper` raises :class:`memfit.BackendUnavailable`.
"""

from __future__ import annotations

import functools
from typing import Any

from memfit.errors import ConfigError
from memfit.integrations._lazy import require
from memfit.runtime.events import EventSink

__all__ = ["MemoryWrapper", "wrapper_class"]


def wrapper_class(vector: bool = False) -> type[Any]:
    """The wrapper class (built on first use, on top of gymnasium's ``Wrapper``).

    Args:
        vector: Build on ``gymnasium.vector.VectorWrapper`` for vector environments.

    Returns:
        The class; ``isinstance(env, wrapper_class())`` tells a wrapped env.

    Raises:
        BackendUnavailable: When gymnasium is not installed.
    """
    return _build(bool(vector))


@functools.cache
def _build(vector: bool) -> type[Any]:
    gym = require("gymnasium")
    base: type[Any] = gym.vector.VectorWrapper if vector else gym.Wrapper

    class _MemoryWrapper(base):  # type: ignore[misc]
        """Record memory after every step and guard ``step`` with :class:`RolloutGuard`."""

        def __init__(
            self,
            env: Any,
            *,
            recorder: Any | None,
            on_event: EventSink | None,
            max_splits: int,
            info_key: str | None,
        ) -> None:
            from memfit.runtime.guard import RolloutGuard

            super().__init__(env)
            self.recorder = recorder
            self.info_key = info_key
            sink = on_event
            if sink is None and recorder is not None:
                sink = recorder.on_event
            self.guard: RolloutGuard[Any] = RolloutGuard(
                self.env.step, on_event=sink, max_splits=max_splits
            )
            self.steps = 0

        def step(self, action: Any) -> Any:
            result = self.guard(action)
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
            super().close()
            if self.recorder is not None:
                self.recorder.close()

    _MemoryWrapper.__name__ = "MemoryVectorWrapper" if vector else "MemoryWrapper"
    _MemoryWrapper.__qualname__ = _MemoryWrapper.__name__
    return _MemoryWrapper


def MemoryWrapper(
    env: Any,
    *,
    recorder: Any | None = None,
    on_event: EventSink | None = None,
    max_splits: int = 1,
    info_key: str | None = "memfit",
) -> Any:
    """Wrap a Gymnasium environment (or vector environment) to record and guard its steps.

    Args:
        env: A ``gymnasium.Env`` or ``gymnasium.vector.VectorEnv``.
        recorder: A :class:`memfit.Recorder`; ``recorder.step(n)`` is called after step
            ``n`` (it is closed with the environment). ``None`` records nothing.
        on_event: Where guard events go (default: the recorder's ``on_event``).
        max_splits: Chunks the guard may cut a step into (1: free and retry only).
        info_key: Key under which the step's memory sample is put into ``info`` (``None``:
            leave ``info`` alone).

    Returns:
        The wrapped environment.

    Raises:
        ConfigError: When ``env`` is not a Gymnasium environment.
        BackendUnavailable: When gymnasium is not installed.
    """
    gym = require("gymnasium")
    if isinstance(env, gym.vector.VectorEnv):
        cls = wrapper_class(True)
    elif isinstance(env, gym.Env):
        cls = wrapper_class(False)
    else:
        raise ConfigError(
            f"not a Gymnasium environment: {type(env).__name__}",
            key_path="env",
            hint="pass gymnasium.make(...) or a gymnasium.vector env",
        )
    return cls(env, recorder=recorder, on_event=on_event, max_splits=max_splits, info_key=info_key)
