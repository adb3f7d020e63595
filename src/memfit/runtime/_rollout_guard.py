"""RolloutGuard: inference and environment steps that survive out-of-memory.

See :mod:`memfit.runtime.guard` for the whole story; this module holds the class.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from memfit._checks import require_callable, require_count, require_iterable
from memfit.core import ladder
from memfit.runtime._batching import concat, map_arrays, walk
from memfit.runtime._guard_base import GuardBase
from memfit.runtime._memory import free_memory, memory_figures, out_of_memory
from memfit.runtime._rewind import rng_state as _rng_state
from memfit.runtime.events import EventSink
from memfit.runtime.oom import first_line, forget_exception, is_oom

__all__ = ["RolloutGuard"]

T = TypeVar("T")


class RolloutGuard(GuardBase, Generic[T]):
    """Guard inference and environment stepping: retry, then run in chunks along the envs.

    Args:
        fn: The call to guard (``policy.select_action``, ``env.step``).
        split_dim: The environment dimension of the array arguments and of the results.
        on_event: Called with every :class:`~memfit.runtime.events.MemoryEvent`.
        max_splits: Most chunks before giving up.
        grow_back_after: Clean calls after which the chunk count is halved again.
        restore_rng: Put random number generators back before a retry (torch CPU and CUDA,
            NumPy's global generator, Python's ``random``, and ``rngs``), so a retried
            epsilon-greedy policy draws what it would have drawn; ``"torch"`` only torch's,
            ``False`` none.
        rngs: More generators to put back (a Gymnasium space's ``np_random``, say).
        transient_retries: Retries of a chunk size that ran before, before splitting.

    Arguments whose size along ``split_dim`` equals the environment count are cut into
    chunks; other arguments are passed whole to every chunk. Results are concatenated along
    ``split_dim`` (arrays), leaf by leaf (dicts, tuples, lists); equal scalars are kept once,
    different ones are returned as a list.

    A chunk that runs out of memory is retried (or the rest of the call is cut into more
    chunks); chunks that already ran are kept, never run again, so ``fn`` may have side
    effects per chunk (stepping those environments). A call with ``fn``'s side effects
    *inside* one chunk (several environments stepped one after another in Python) is not
    safe to retry: guard each environment's own step instead.

    Raises:
        ConfigError: When ``max_splits`` or ``grow_back_after`` is not a positive integer,
            ``fn`` is not callable, ``split_dim`` is not an integer >= 0, or an ``rngs``
            entry cannot be saved.
    """

    source = "RolloutGuard"

    def __init__(
        self,
        fn: Callable[..., T],
        *,
        split_dim: int = 0,
        on_event: EventSink | None = None,
        max_splits: int = 64,
        grow_back_after: int = 50,
        restore_rng: bool | str = True,
        rngs: Iterable[Any] = (),
        transient_retries: int = 3,
    ) -> None:
        require_callable(
            "fn", fn, hint="RolloutGuard(policy.select_action) or RolloutGuard(env.step)"
        )
        require_callable("on_event", on_event, optional=True)
        rngs = require_iterable("rngs", rngs)
        require_count(
            "split_dim",
            split_dim,
            what="an integer",
            hint="the environment dimension counted from the front, usually 0",
        )
        self.fn = fn
        self.split_dim = split_dim
        self.calls = 0
        self._start_ladder(
            max_splits=max_splits,
            grow_back_after=grow_back_after,
            transient_retries=transient_retries,
            on_event=on_event,
        )
        self._rng = _rng_state(restore_rng, rngs)

    def _event(self, kind: str, message: str, **data: Any) -> None:
        figures: dict[str, Any] = memory_figures()
        figures.update(data)
        self._record(kind, message, self.calls, figures)

    def _envs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
        for _, leaf in walk((list(args), kwargs)):
            if leaf.ndim > self.split_dim:
                return int(leaf.shape[self.split_dim])
        return None

    def _call_chunk(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], n: int, start: int, stop: int
    ) -> Any:
        dim = self.split_dim
        index = (slice(None),) * dim + (slice(start, stop),)

        def cut(leaf: Any) -> Any:
            if leaf.ndim > dim and int(leaf.shape[dim]) == n:
                return leaf[index]
            return leaf

        return self.fn(*map_arrays(list(args), cut), **map_arrays(kwargs, cut))

    def __call__(self, *args: Any, **kwargs: Any) -> T:
        """Call ``fn``; on out-of-memory free, retry, then run it in chunks and join them.

        Raises:
            OutOfMemory: When ``max_splits`` chunks (or chunks of one environment) still
                run out of memory.
        """
        n = self._envs(args, kwargs)
        items = n if n is not None else 1
        config = self._config
        splits = ladder.first_splits(config, self._ladder, items)
        first_splits = splits
        tried: list[str] = []
        parts: list[Any] = []
        done = 0
        failures = 0
        split_here = False
        whole_result: Any = None
        if self._rng is not None:
            self._rng.capture()
        while done < items:
            size = math.ceil(items / splits)
            stop = min(items, done + size)
            whole = done == 0 and stop == items
            message: str | None = None
            try:
                if whole or n is None:
                    whole_result = self.fn(*args, **kwargs)
                else:
                    parts.append(self._call_chunk(args, kwargs, items, done, stop))
            except Exception as exc:
                if not is_oom(exc):
                    raise
                message = forget_exception(exc)
            if message is None:
                self._ladder = ladder.on_fit(self._ladder, stop - done, failures)
                done = stop
                failures = 0
                split_here = False
                if done < items and self._rng is not None:
                    self._rng.capture()
                continue
            free_memory()
            failures += 1
            if self._rng is not None:
                self._rng.restore()
            action = self._next_rung(
                tried,
                "out of memory in the guarded call",
                error=first_line(message),
                start=done,
                stop=stop,
                n=items,
                splits=splits,
                size=stop - done,
                failures=failures,
                split_here=split_here,
                unit="chunk",
                split_message="running in {splits} chunks of the environments",
            )
            if isinstance(action, ladder.Split):
                splits = action.splits
                failures = 0
                split_here = True
            elif isinstance(action, ladder.GiveUp):
                self._gave_up(tried)
                raise out_of_memory(
                    f"out of memory in {getattr(self.fn, '__name__', 'the guarded call')} "
                    f"even after {', '.join(tried)}: {first_line(message)}",
                    tried=tried,
                    hint="fewer environments per call, a smaller observation, or a larger GPU",
                )
        result: T = whole_result if not parts else concat(parts, self.split_dim)
        self.calls += 1
        self._end_step(splits=splits, split_further=splits > first_splits, unit="chunk")
        return result
