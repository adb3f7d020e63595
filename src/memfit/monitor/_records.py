"""A Recorder file: the fields of its records, and the writer that appends them.

A Recorder file is JSON lines, one record per line, ``type`` first: ``"start"``,
``"sample"`` (``mode`` ``"step"`` or ``"background"``, then :data:`SAMPLE_FIELDS`),
``"event"`` (:meth:`memfit.runtime.events.MemoryEvent.to_dict`), ``"end"``; or CSV with
:data:`CSV_FIELDS` as columns. ``memfit report`` reads them back (:mod:`memfit.monitor.report`).
"""

from __future__ import annotations

import csv as _csv
import json
import threading
import time
from pathlib import Path
from typing import IO, Any

from memfit._userfiles import file_error
from memfit.backends.live import Reading

__all__ = ["CSV_FIELDS", "SAMPLE_FIELDS", "RecordWriter", "sample_fields"]

#: The memory figures of a sample: fields of :class:`memfit.backends.live.Reading`.
READING_FIELDS: tuple[str, ...] = (
    "allocated_bytes",
    "reserved_bytes",
    "peak_allocated_bytes",
    "device_used_bytes",
    "total_bytes",
    "budget_bytes",
    "resident_bytes",
)

#: The fields of every sample, in the order they are written.
SAMPLE_FIELDS: tuple[str, ...] = ("step", "time", "step_seconds", *READING_FIELDS, "source")

CSV_FIELDS: tuple[str, ...] = (
    "type",
    "mode",
    *SAMPLE_FIELDS,
    "device_index",
    "event_kind",
    "event_source",
    "message",
)


def sample_fields(reading: Reading) -> dict[str, int | None]:
    """A reading's figures as a Recorder sample carries them."""
    return {key: getattr(reading, key) for key in READING_FIELDS}


#: Samples are flushed to the file at least this often (other records at once).
FLUSH_SECONDS = 1.0


class RecordWriter:
    """Appends records to a Recorder file (JSON lines, or CSV), thread-safe.

    Args:
        path: The file (created with its folders; appended to when it exists).
        csv: Write CSV with :data:`CSV_FIELDS` as columns instead of JSON lines.

    Raises:
        ConfigError: When the file cannot be opened.
    """

    def __init__(self, path: Path, *, csv: bool = False) -> None:
        self.path = path
        self._lock = threading.RLock()
        self._csv_writer: Any = None
        self._last_flush = time.monotonic()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            exists = path.exists() and path.stat().st_size > 0
            self._file: IO[str] | None = path.open("a", encoding="utf-8", newline="")
        except OSError as exc:
            raise file_error(exc, path, action="open the recording file") from exc
        if csv:
            self._csv_writer = _csv.DictWriter(
                self._file, fieldnames=list(CSV_FIELDS), extrasaction="ignore"
            )
            if not exists:
                self._csv_writer.writeheader()

    @property
    def csv(self) -> bool:
        """Whether the file is CSV."""
        return self._csv_writer is not None

    def write(self, record: dict[str, Any]) -> None:
        """Append one record; samples are flushed at most every :data:`FLUSH_SECONDS`."""
        with self._lock:
            if self._file is None:
                return
            if self._csv_writer is not None:
                self._csv_writer.writerow(record)
            else:
                self._file.write(json.dumps(record, separators=(",", ":")) + "\n")
            now = time.monotonic()
            if record.get("type") != "sample" or now - self._last_flush >= FLUSH_SECONDS:
                self._file.flush()
                self._last_flush = now

    def close(self) -> None:
        """Flush and close the file (again: nothing)."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
