"""What every guard has: a ladder state, its split count, and a list of events."""

from __future__ import annotations

import abc
from typing import Any

from memfit._checks import require_positive_int
from memfit._plain import plural
from memfit.core import ladder
from memfit.runtime.events import EventSink, MemoryEvent, emit

__all__ = ["GuardBase"]


class GuardBase(abc.ABC):
    """The ladder state and the events of a guard (TrainGuard, RolloutGuard, the JAX guard).

    Subclasses set ``source`` and call :meth:`_start_ladder` in their ``__init__``.
    """

    source = "guard"
    max_splits: int
    grow_back_after: int
    on_event: EventSink | None
    events: list[MemoryEvent]
    _config: ladder.LadderConfig
    _ladder: ladder.LadderState

    def _start_ladder(
        self,
        *,
        max_splits: int,
        grow_back_after: int,
        on_event: EventSink | None,
        transient_retries: int = 3,
        divisors: bool = False,
    ) -> None:
        """Check the ladder's settings and start at the bottom rung (one chunk).

        Raises:
            ConfigError: When ``max_splits`` or ``grow_back_after`` is not a positive integer.
        """
        self.max_splits = require_positive_int("max_splits", max_splits)
        self.grow_back_after = require_positive_int("grow_back_after", grow_back_after)
        self._config = ladder.LadderConfig(
            max_splits=max_splits,
            grow_back_after=grow_back_after,
            transient_retries=transient_retries,
            divisors=divisors,
        )
        self._ladder = ladder.LadderState()
        self.on_event = on_event
        self.events = []

    @property
    def splits(self) -> int:
        """Chunks (micro-batches) the next call starts with."""
        return self._ladder.splits

    @splits.setter
    def splits(self, value: int) -> None:
        require_positive_int("splits", value)
        self._ladder = self._ladder._replace(splits=value)

    @abc.abstractmethod
    def _event(self, kind: str, message: str, **data: Any) -> None:
        """Report an event (each guard says which step it counts and which figures)."""

    def _next_rung(
        self,
        tried: list[str],
        oom_message: str,
        *,
        error: str,
        n: int,
        splits: int,
        size: int,
        failures: int,
        split_here: bool,
        unit: str,
        split_message: str,
        **oom_data: Any,
    ) -> ladder.Action:
        """Report a chunk's out-of-memory (``oom_message``, the error's first line and
        ``oom_data`` as figures), ask the ladder what to do, and note a retry or a split in
        ``tried`` and as an event (``unit`` names a chunk in the retry's message).

        Returns:
            The ladder's action (:class:`~memfit.core.ladder.GiveUp` is left to the guard).
        """
        self._event("oom", oom_message, splits=splits, **oom_data, error=error)
        self._ladder, action = ladder.on_oom(
            self._config,
            self._ladder,
            n=n,
            splits=splits,
            size=size,
            failures=failures,
            split_here=split_here,
        )
        if isinstance(action, ladder.Retry):
            tried.append(f"retry x{splits}")
            self._event(
                "retry",
                f"retrying with {plural(splits, unit)}"
                + (" (this size ran before: a transient failure)" if action.transient else ""),
                splits=splits,
                transient=action.transient,
            )
        elif isinstance(action, ladder.Split):
            tried.append(f"split x{action.splits}")
            self._event("split", split_message.format(splits=action.splits), splits=action.splits)
        return action

    def _gave_up(self, tried: list[str], *, splits: int | None = None) -> None:
        """A call gave up: the next one starts lower on the ladder; report it."""
        state = self._ladder if splits is None else self._ladder._replace(splits=splits)
        self._ladder = ladder.after_give_up(state)
        self._event("give_up", "out of memory after " + ", ".join(tried), tried=tried)

    def _end_step(self, *, splits: int, split_further: bool, unit: str) -> bool:
        """A call completed with ``splits`` chunks: count it and maybe grow back (reported).

        Returns:
            Whether the split count was halved.
        """
        self._ladder, grow = ladder.end_step(
            self._config, self._ladder, splits=splits, split_further=split_further
        )
        if grow is not None:
            self._event(
                "grow_back",
                f"{self._config.grow_back_after} clean steps: {unit}s {grow.previous} -> "
                f"{grow.splits}",
                splits=grow.splits,
                previous=grow.previous,
            )
        return grow is not None

    def _record(self, kind: str, message: str, step: int, data: dict[str, Any]) -> None:
        """Keep an event and pass it to ``on_event``."""
        event = MemoryEvent(kind=kind, step=step, source=self.source, message=message, data=data)
        self.events.append(event)
        emit(self.on_event, event)
