"""Monitoring without a GPU: a probe that always sees one snapshot, and a recorded run of a
simulated GPU whose memory grows step by step."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from memfit.backends.base import SystemSnapshot
from memfit.backends.simulated import SimulatedDevice
from memfit.monitor.recorder import Recorder
from memfit.runtime.events import MemoryEvent

MiB = 2**20


class StaticProbe:
    """A device probe (named ``name``) whose every snapshot is ``snapshot``."""

    def __init__(self, snapshot: SystemSnapshot, name: str = "static") -> None:
        self.name = name
        self._snapshot = snapshot

    def snapshot(self) -> SystemSnapshot:
        return self._snapshot


def record_run(
    path: Path,
    steps: int,
    *,
    per_step: int = MiB,
    budget: str | None = None,
    events: Mapping[int, Sequence[tuple[str, str, str]]] | None = None,
) -> Path:
    """``path``: a Recorder's log of ``steps`` steps on a simulated 1 GiB GPU. Each step
    allocates ``per_step`` bytes more, reports that step's ``events`` (kind, source, message),
    made then, so that their time is the step's, then is recorded."""
    dev = SimulatedDevice("1GiB")
    with Recorder(path, device=dev, log=False, budget=budget) as rec:
        for step in range(steps):
            dev.allocate(per_step)
            for kind, source, message in (events or {}).get(step, ()):
                rec.on_event(MemoryEvent(kind, step, source, message))
            rec.step(step=step)
    return path
