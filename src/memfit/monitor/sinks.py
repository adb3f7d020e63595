"""Where a :class:`memfit.Recorder` also sends its samples and events: the places people
already look (TensorBoard, Weights & Biases, Prometheus, a Lightning logger).

A sink is any object with ``sample(record)`` (a step or background sample: the Recorder's
JSON-lines ``sample`` record, sizes in bytes) and ``event(event)`` (a
:class:`~memfit.runtime.events.MemoryEvent`), and optionally ``close()``. Pass sinks as
``Recorder(..., sinks=[...])``; :func:`as_sink` also takes, as they are, a TensorBoard
``SummaryWriter`` (``torch.utils.tensorboard`` or ``tensorboardX``: anything with
``add_scalar`` and ``add_text``) and a W&B run or the ``wandb`` module (anything with
``log``), so no framework is imported here. Prometheus needs its client library to make its
metrics: :class:`memfit.integrations.prometheus.PrometheusSink`.

What a sink writes (sizes in MiB for the dashboards, as ``nvidia-smi`` and PyTorch's
``memory_summary`` show them; the Recorder's file keeps bytes):

* step samples: ``memory/allocated_mib``, ``memory/reserved_mib``,
  ``memory/peak_allocated_mib``, ``memory/device_used_mib``, ``memory/budget_mib`` and
  ``memory/step_seconds`` at the sample's step (a value the source cannot give is skipped);
* background samples of several devices: the same under ``memory/gpu<index>/...``;
* events: ``memory/events/<kind>`` counts (a scalar at the event's step) and, for
  TensorBoard, the message as text under ``memory/events``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from memfit.errors import ConfigError
from memfit.runtime.events import MemoryEvent

__all__ = [
    "RecordSink",
    "ScalarSink",
    "TensorBoardSink",
    "WandbSink",
    "as_sink",
    "scalars_of",
]

_MIB = float(2**20)

#: Sample fields a sink writes, and their names (sizes become MiB).
_FIELDS: tuple[tuple[str, str], ...] = (
    ("allocated_bytes", "allocated_mib"),
    ("reserved_bytes", "reserved_mib"),
    ("peak_allocated_bytes", "peak_allocated_mib"),
    ("device_used_bytes", "device_used_mib"),
    ("budget_bytes", "budget_mib"),
    ("step_seconds", "step_seconds"),
)


@runtime_checkable
class RecordSink(Protocol):
    """What the Recorder sends its samples and events to."""

    def sample(self, record: Mapping[str, Any]) -> None:
        """One step or background sample (sizes in bytes, unknown as ``None``)."""

    def event(self, event: MemoryEvent) -> None:
        """One guard or cleanup event."""


def scalars_of(record: Mapping[str, Any], prefix: str = "memory/") -> dict[str, float]:
    """The scalars a sink writes for one sample: known values only, sizes in MiB.

    >>> scalars_of({"allocated_bytes": 2**21, "reserved_bytes": None, "step_seconds": 0.5})
    {'memory/allocated_mib': 2.0, 'memory/step_seconds': 0.5}
    >>> scalars_of({"allocated_bytes": 2**20, "mode": "background", "device_index": 1})
    {'memory/gpu1/allocated_mib': 1.0}
    """
    if record.get("mode") == "background" and record.get("device_index") is not None:
        prefix = f"{prefix}gpu{record['device_index']}/"
    out: dict[str, float] = {}
    for field, name in _FIELDS:
        value = record.get(field)
        if value is None or isinstance(value, bool):
            continue
        out[prefix + name] = float(value) if field == "step_seconds" else value / _MIB
    return out


class ScalarSink:
    """A sink over ``log(scalars, step)``: counts events per kind and writes each count."""

    def __init__(self, log: Any, *, prefix: str = "memory/") -> None:
        self._log = log
        self.prefix = prefix
        self.counts: Counter[str] = Counter()

    def sample(self, record: Mapping[str, Any]) -> None:
        """Write the sample's scalars at its step."""
        scalars = scalars_of(record, self.prefix)
        if scalars:
            self._log(scalars, record.get("step"))

    def event(self, event: MemoryEvent) -> None:
        """Count the event and write the count of its kind at its step."""
        self.counts[event.kind] += 1
        self._log({f"{self.prefix}events/{event.kind}": float(self.counts[event.kind])}, event.step)


class TensorBoardSink(ScalarSink):
    """Samples and events into a TensorBoard ``SummaryWriter`` (``add_scalar``; events also
    as text). The writer stays the caller's: ``close()`` flushes it."""

    def __init__(self, writer: Any, *, prefix: str = "memory/") -> None:
        self.writer = writer

        def log(scalars: Mapping[str, float], step: int | None) -> None:
            for tag, value in scalars.items():
                writer.add_scalar(tag, value, global_step=step)

        super().__init__(log, prefix=prefix)

    def event(self, event: MemoryEvent) -> None:
        """Count the event, and write its message as text at its step."""
        super().event(event)
        text = f"{event.source} {event.kind}: {event.message}"
        self.writer.add_text(f"{self.prefix}events", text, global_step=event.step)

    def close(self) -> None:
        """Flush the writer (it is the caller's to close)."""
        flush = getattr(self.writer, "flush", None)
        if callable(flush):
            flush()


class WandbSink(ScalarSink):
    """Samples and events into Weights & Biases: ``run.log(scalars, step=step)`` (a run, or
    the ``wandb`` module for the current run). W&B wants steps that only grow, so a sample
    without a step, or at a step below the last one logged, is logged without ``step``."""

    def __init__(self, run: Any, *, prefix: str = "memory/") -> None:
        self.run = run
        self._last: int | None = None

        def log(scalars: Mapping[str, float], step: int | None) -> None:
            if step is not None and (self._last is None or step >= self._last):
                self._last = step
                run.log(dict(scalars), step=step)
            else:
                run.log(dict(scalars))

        super().__init__(log, prefix=prefix)


def as_sink(obj: Any) -> Any:
    """A Recorder sink from ``obj``: a sink as it is, a TensorBoard writer or a W&B run
    wrapped.

    Raises:
        ConfigError: When ``obj`` is none of these.
    """
    if callable(getattr(obj, "sample", None)) and callable(getattr(obj, "event", None)):
        return obj
    if callable(getattr(obj, "add_scalar", None)) and callable(getattr(obj, "add_text", None)):
        return TensorBoardSink(obj)
    if callable(getattr(obj, "log", None)) and hasattr(obj, "config"):
        return WandbSink(obj)
    raise ConfigError(
        f"a Recorder sink has sample() and event(), not {type(obj).__name__}",
        key_path="Recorder.sinks",
        hint="pass a SummaryWriter, a wandb run, "
        "memfit.integrations.prometheus.PrometheusSink(...), or an object with "
        "sample(record) and event(event)",
    )
