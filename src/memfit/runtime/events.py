"""Memory events: what guards and cleanup policies report, and what the Recorder records."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from memfit._plain import plain_fields

__all__ = ["EventSink", "MemoryEvent", "emit"]


@dataclass(frozen=True)
class MemoryEvent:
    """One thing that happened to a run's memory.

    Attributes:
        kind: ``"oom"``, ``"retry"``, ``"split"``, ``"grow_back"``, ``"cleanup"``,
            ``"give_up"``, ``"restore"``, ...
        step: The training or rollout step it happened at, if known.
        source: Who reported it (``"TrainGuard"``, ``"RolloutGuard"``, ``"cleanup.every"``).
        message: One human sentence.
        data: Figures, sizes in bytes (``{"splits": 4, "allocated_bytes": ...}``).
        time: Wall-clock time (``time.time()``).
    """

    kind: str
    step: int | None
    source: str
    message: str
    data: dict[str, Any] = field(default_factory=dict)
    time: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON lines."""
        return plain_fields(self, data=dict(self.data))


EventSink = Callable[[MemoryEvent], None]


def emit(sink: EventSink | None, event: MemoryEvent) -> MemoryEvent:
    """Send ``event`` to ``sink`` when there is one; return the event."""
    if sink is not None:
        sink(event)
    return event
