"""What every guard has: a ladder state, its split count, and a list of events."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from memfit.core import ladder
from memfit.errors import require_positive_int
from memfit.runtime.events import EventSink, MemoryEvent, emit

__all__ = ["GuardBase"]


class GuardBase:
    """The ladder state and the events of a guard (TrainGuard, RolloutGuard, the JAX guard).

    Subclasses set ``source`` and call :meth:`_start_ladder` in their ``__init__``.
    """

    source = "guard"
    on_event: EventSink | None
    events: list[MemoryEvent]
    _config: ladder.LadderConfig
    _ladder: ladder.LadderState

    def _start_ladder(self, config: ladder.LadderConfig, on_event: EventSink | None) -> None:
        self._config = config
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
        self._ladder = replace(self._ladder, splits=value)

    def _record(self, kind: str, message: str, step: int, data: dict[str, Any]) -> None:
        """Keep an event and pass it to ``on_event``."""
        event = MemoryEvent(kind=kind, step=step, source=self.source, message=message, data=data)
        self.events.append(event)
        emit(self.on_event, event)
