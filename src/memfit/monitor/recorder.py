"""The in-process memory recorder: per-step samples, events, leaks, fragmentation, OOM dumps.

:class:`Recorder` samples the memory of the *active device* once per training step (or every
``every`` steps) and, optionally, in a background thread at a fixed interval. Where the numbers
come from, in this order (each sample says which in ``source``):

1. the live bytes of :func:`memfit.simulate_gpu` when one is active;
2. ``torch.cuda`` when torch is imported and has CUDA (allocator statistics and
   ``mem_get_info``);
3. JAX ``memory_stats()`` on a GPU device when JAX is imported;
4. the :class:`~memfit.backends.base.DeviceProbe` given as ``device=``.

All of them through the one live-memory reader, :mod:`memfit.backends.live`.

A sample is a plain ``dict``: ``step``, ``time``, ``step_seconds``, ``allocated_bytes``,
``reserved_bytes``, ``peak_allocated_bytes``, ``device_used_bytes``, ``total_bytes``,
``budget_bytes`` (``None`` where unknown) and ``source``. Samples and the
:class:`~memfit.runtime.events.MemoryEvent` s reported by guards and cleanup policies go to a
JSON-lines file (CSV on request) that ``memfit report`` turns into a figure.

Leaks and fragmentation are judged by the pure functions of :mod:`memfit.monitor._leaks`
(:func:`detect_leak`, :func:`check_fragmentation`), re-exported here; the file format by
:mod:`memfit.monitor._records`; the evidence of an out-of-memory by
:mod:`memfit.monitor._oom_dump`.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import tempfile
import threading
import time
import types
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from memfit._checks import require, require_count, require_iterable
from memfit.backends.live import (
    HostReader,
    LiveReader,
    NoReader,
    ProbeReader,
    active_reader,
    torch_cuda_available,
)
from memfit.errors import ConfigError, MemfitError, OutOfMemory
from memfit.monitor._leaks import (
    Leak,
    UnusedReserve,
    check_fragmentation,
    detect_leak,
    theil_sen,
)
from memfit.monitor._oom_dump import write_oom_dump
from memfit.monitor._ranks import DEFAULT_IMBALANCE, rank_imbalance
from memfit.monitor._records import SAMPLE_FIELDS, RecordWriter, sample_fields
from memfit.monitor.sinks import as_sink
from memfit.runtime.events import MemoryEvent
from memfit.units import format_bytes, parse_bytes

__all__ = [
    "SAMPLE_FIELDS",
    "Leak",
    "Recorder",
    "UnusedReserve",
    "check_fragmentation",
    "detect_leak",
    "theil_sen",
]

logger = logging.getLogger("memfit")

_SOURCES = ("auto", "torch", "jax", "simulated", "probe", "host")

#: The sample series a leak is looked for in, first one present wins.
_LEAK_METRICS = ("allocated_bytes", "device_used_bytes", "resident_bytes")


# -- where the numbers come from ------------------------------------------------------------


def _torch_cuda() -> Any | None:
    """The torch module when it is imported and has CUDA, else ``None`` (never imports it)."""
    return torch_cuda_available()


def _history_without_cuda() -> str:
    """What ``memory_history`` does where torch has no CUDA: under a CPU ``simulate_gpu``
    the simulated GPU's own history makes the OOM snapshot; elsewhere nothing records one."""
    from memfit.runtime import simulate

    gpu = simulate.active()
    if gpu is not None and gpu.device_kind == "cpu":
        if gpu.snapshot_history:
            return (
                "memory_history: the simulated GPU keeps its own allocation history "
                f"(the last {gpu.snapshot_history:,} events); an OOM snapshot is made of it"
            )
        return (
            "memory_history: this simulated GPU keeps no history (simulate_gpu(history=0)), "
            "so an OOM writes no snapshot"
        )
    return (
        "memory_history needs torch with CUDA, or memfit.simulate_gpu (which keeps its own "
        "allocation history for the OOM snapshot); none here, so none is recorded now"
    )


def _default_probe() -> Any | None:
    """The local NVML probe (:func:`memfit.backends.local_probe`), or ``None`` without one.

    torch is not tried here: where torch sees CUDA, the in-process source already reads it.
    """
    from memfit.backends import local_probe

    try:
        probe, _reasons = local_probe(try_torch=False)
    except MemfitError:
        return None
    return probe


def _is_oom(exc: BaseException) -> bool:
    """Is ``exc`` an out-of-memory error (through :func:`memfit.runtime.oom.is_oom`)?"""
    try:
        from memfit.runtime.oom import is_oom
    except ImportError:
        return isinstance(exc, OutOfMemory) or type(exc).__name__ == "OutOfMemoryError"
    return bool(is_oom(exc))


# -- the recorder ---------------------------------------------------------------------------


class Recorder:
    """Record a run's memory per step, find leaks, and keep the evidence of an OOM.

    Use it as a context manager around the loop, calling :meth:`step` once per step::

        with memfit.Recorder("run.jsonl") as rec:
            for batch in loader:
                train_step(batch)
                rec.step()

    or pass it where a callback is wanted (``rec(step)`` is ``rec.step(step=step)``), and as
    ``on_event=rec.on_event`` to guards and cleanup policies.

    Args:
        path: JSON-lines file the samples and events are appended to (CSV with ``csv=True``),
            or ``None`` to keep them in memory only.
        every: Sample every ``every``-th step.
        device: A :class:`~memfit.backends.base.DeviceProbe` for the background sampler,
            and the source of step samples when no framework device is active.
        log: Write short lines through ``logging.getLogger("memfit")``.
        csv: Write CSV instead of JSON lines.
        interval: Seconds between background samples (a daemon thread); ``None`` for none.
            The background thread samples ``device`` (default: the local NVML probe, else
            the same source as the steps).
        source: ``"auto"``, or force ``"torch"``, ``"jax"``, ``"simulated"``, ``"probe"`` or
            ``"host"``. With ``"auto"`` and no device to read (a job on the CPU), the
            process's resident host memory is recorded (``"host"``, ``resident_bytes``).
        budget: Budget the run must stay under (bytes or size text); ``None`` takes the
            simulated GPU's budget or JAX's ``bytes_limit`` where there is one.
        log_every: Log a line (and look for fragmentation) every this many steps.
        leak_check_seconds: Look for leaks (and warn) at most this often during the run, at a
            log point; and once more at :meth:`close`. A check costs a few milliseconds.
        history: Samples kept in memory (the oldest go first).
        oom_dir: Where OOM dumps go; default: next to ``path``, else the system's temporary
            directory (``tempfile.gettempdir()``); the log line names the files.
        oom_samples: Last samples written in an OOM dump.
        memory_history: On CUDA, record allocation history with this ``max_entries`` for the
            OOM snapshot (costs time per allocation); ``None`` leaves it off (the snapshot
            then shows segments and blocks without stack traces).
        max_oom_dumps: Most OOM dumps written by one recorder (0: none).
        ranks_every: Under ``torch.distributed``: every this many sampled steps, share each
            rank's peak (one small all-reduce) and report a ``"rank_imbalance"`` warning
            event when a rank's peak is more than ``imbalance`` above the median of the
            others', with the step of the check that first saw it (once, until it falls
            back). Every rank must call :meth:`step` at the same steps. ``None``: off.
        imbalance: The threshold, a fraction (0.2: 20% above the others).
        sinks: Where samples and events also go (:mod:`memfit.monitor.sinks`): a
            TensorBoard ``SummaryWriter``, a W&B run, a
            :class:`memfit.integrations.prometheus.PrometheusSink`, or any object with
            ``sample(record)`` and ``event(event)``. A sink that raises is logged once and
            then left out.

    Raises:
        ConfigError: When a setting is out of range (``every`` < 1, ``interval`` <= 0, an
            unknown ``source``, ...).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        every: int = 1,
        device: Any | None = None,
        log: bool = True,
        csv: bool = False,
        interval: float | None = None,
        source: str = "auto",
        budget: int | str | None = None,
        log_every: int = 100,
        leak_check_seconds: float = 30.0,
        history: int = 10_000,
        oom_dir: str | os.PathLike[str] | None = None,
        oom_samples: int = 200,
        memory_history: int | None = None,
        max_oom_dumps: int = 1,
        ranks_every: int | None = None,
        imbalance: float = DEFAULT_IMBALANCE,
        sinks: Iterable[Any] = (),
    ) -> None:
        require("path", path, "path", optional=True)
        require("log", log, "bool")
        require("csv", csv, "bool")
        require("interval", interval, "number", optional=True)
        require("budget", budget, "size", optional=True)
        require("leak_check_seconds", leak_check_seconds, "number")
        require("oom_dir", oom_dir, "path", optional=True)
        require("memory_history", memory_history, "int", optional=True)
        require("imbalance", imbalance, "number")
        sinks = require_iterable("sinks", sinks)
        require_count(
            "every",
            every,
            lo=1,
            what="a whole number of steps",
            key_path="Recorder.every",
            hint="use every=1 to sample each step, every=10 for every tenth",
        )
        if interval is not None and (not math.isfinite(interval) or interval <= 0):
            raise ConfigError(
                f"interval must be a positive number of seconds, not {interval!r}",
                key_path="Recorder.interval",
                hint="use interval=0.1 for 10 samples a second",
            )
        if source not in _SOURCES:
            raise ConfigError(
                f"unknown source {source!r}",
                key_path="Recorder.source",
                hint="use one of " + ", ".join(_SOURCES),
            )
        for key, value in (
            ("log_every", log_every),
            ("history", history),
            ("oom_samples", oom_samples),
        ):
            require_count(key, value, lo=1, key_path=f"Recorder.{key}")
        require_count(
            "max_oom_dumps",
            max_oom_dumps,
            key_path="Recorder.max_oom_dumps",
            hint="use 0 to write no OOM dumps",
        )
        if ranks_every is not None:
            require_count(
                "ranks_every",
                ranks_every,
                lo=1,
                what="a whole number of sampled steps",
                key_path="Recorder.ranks_every",
                hint="use ranks_every=10 to compare the ranks every tenth sample, None for never",
            )
        if not math.isfinite(imbalance) or imbalance <= 0:
            raise ConfigError(
                f"imbalance must be a positive fraction, not {imbalance!r}",
                key_path="Recorder.imbalance",
                hint="use imbalance=0.2 to flag a rank 20% above the others",
            )
        if not math.isfinite(leak_check_seconds) or leak_check_seconds < 0:
            raise ConfigError(
                f"leak_check_seconds must be >= 0, not {leak_check_seconds!r}",
                key_path="Recorder.leak_check_seconds",
            )
        if memory_history is not None and memory_history < 1:
            raise ConfigError(
                f"memory_history must be a positive number of entries, not {memory_history!r}",
                key_path="Recorder.memory_history",
                hint="use memory_history=100_000, or None to leave history recording off",
            )
        if device is not None and not callable(getattr(device, "snapshot", None)):
            raise ConfigError(
                f"device must be a DeviceProbe (with .snapshot()), not {type(device).__name__}",
                key_path="Recorder.device",
            )
        self.path = Path(path) if path is not None else None
        self.every = every
        self.device = device
        self.log = log
        self.csv = csv
        self.interval = interval
        self.source_kind = source
        self.budget_bytes = parse_bytes(budget) if budget is not None else None
        self.log_every = log_every
        self.leak_check_seconds = leak_check_seconds
        self.oom_dir = Path(oom_dir) if oom_dir is not None else None
        self.oom_samples = oom_samples
        self.memory_history = memory_history
        self.max_oom_dumps = max_oom_dumps
        self.ranks_every = ranks_every
        self.imbalance = imbalance
        self._sampled = 0
        self._imbalanced: dict[int, int] = {}

        self._samples: deque[dict[str, Any]] = deque(maxlen=history)
        self._background: deque[dict[str, Any]] = deque(maxlen=history)
        self._events: list[MemoryEvent] = []
        self._lock = threading.RLock()
        self._writer: RecordWriter | None = None
        self._source: LiveReader | None = None
        self._started = False
        self._closed = False
        self._count = 0
        self._last_step: int | None = None
        self._last_sample_step: int | None = None
        self._last_sample_clock: float | None = None
        self._last_check_step: int | None = None
        self._last_leak_check = time.monotonic()
        self._warned_leaks: set[str] = set()
        self._warned_fragmentation = False
        self._oom_dumps = 0
        self._history_enabled = False
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._background_cpu = 0.0
        self._background_count = 0
        self._previous_hook: Callable[..., Any] | None = None
        self._hook: Callable[..., Any] | None = None
        self.oom_files: list[Path] = []
        self.sinks: list[Any] = [as_sink(sink) for sink in sinks]
        self._broken_sinks: set[int] = set()

    # -- lifecycle --------------------------------------------------------------------------

    @property
    def source(self) -> str:
        """Name of the source of step samples (``"torch.cuda"``, ``"jax"``, ``"simulated"``,
        a probe's name, or ``"none"``); resolved at :meth:`start`."""
        return self._source.name if self._source is not None else "unresolved"

    def start(self) -> Recorder:
        """Open the file, pick the source, start the background thread; log one line.

        Called by :meth:`step` and ``with`` when needed; calling it again does nothing.

        Returns:
            The recorder.

        Raises:
            ConfigError: When the file cannot be opened, or the recorder was closed.
            BackendUnavailable: When a forced ``source`` is not there.
        """
        if self._closed:
            raise ConfigError(
                "this Recorder is closed", key_path="Recorder", hint="create a new Recorder"
            )
        if self._started:
            return self
        self._source = self._pick_source()
        if self.path is not None:
            self._open_file(self.path)
        self._started = True
        # the budget the run starts with: the one given, else the source's own (a simulated
        # GPU's limit, under memfit.simulate_gpu)
        first = self._source.read()
        self._write(
            {
                "type": "start",
                "time": time.time(),
                "source": self._source.name,
                "every": self.every,
                "interval": self.interval,
                "budget_bytes": self.budget_bytes or first.budget_bytes,
                "pid": os.getpid(),
            }
        )
        if self.memory_history is not None:
            self._enable_memory_history()
        if self.interval is not None:
            self._start_background()
        if self.log:
            where = f" to {self.path}" if self.path is not None else ""
            reading = first
            total = reading.total_bytes
            size = f", device {format_bytes(total)}" if total is not None else ""
            budget = self.budget_bytes or reading.budget_bytes
            size += f", budget {format_bytes(budget)}" if budget is not None else ""
            back = f", background every {self.interval:g} s" if self.interval else ""
            note = ""
            if self._source.name == "none":
                note = " (no memory source: recording step times only; leaks cannot be told)"
            elif self._source.name == "host":
                note = " (no GPU memory source: recording the process's resident host memory)"
            logger.info(
                "memfit: recording %s%s every %s%s%s%s",
                self._source.name,
                size,
                "step" if self.every == 1 else f"{self.every} steps",
                back,
                where,
                note,
            )
        return self

    def _pick_source(self) -> LiveReader:
        if self.source_kind == "host":
            return HostReader()
        reader = active_reader(self.source_kind, self.device, allow_cuda_init=True)
        if isinstance(reader, NoReader) and HostReader.available():
            return HostReader()
        return reader

    def _require_source(self) -> LiveReader:
        if self._source is None:
            self.start()
        if self._source is None:  # start() always sets it; this keeps the type exact
            raise ConfigError("the Recorder has no source", key_path="Recorder.source")
        return self._source

    def _open_file(self, path: Path) -> None:
        self._writer = RecordWriter(path, csv=self.csv)

    def close(self) -> None:
        """Stop the background thread, log the last leak check, and close the file.

        Calling it again does nothing.
        """
        if self._closed:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, 2 * (self.interval or 0.0)))
            self._thread = None
        self.uninstall_excepthook()
        if self._history_enabled:
            torch_module = _torch_cuda()
            if torch_module is not None:
                torch_module.cuda.memory._record_memory_history(enabled=None)
            self._history_enabled = False
        if self._started:
            self._check(final=True)
            self._write({"type": "end", "time": time.time(), "samples": self._count})
        with self._lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
        for sink in self.sinks:
            close = getattr(sink, "close", None)
            if callable(close) and id(sink) not in self._broken_sinks:
                self._call_sink(sink, close)
        self._closed = True

    def _to_sinks(self, kind: str, payload: Any) -> None:
        """Send a sample (``kind="sample"``) or an event to every working sink."""
        for sink in self.sinks:
            if id(sink) not in self._broken_sinks:
                self._call_sink(sink, getattr(sink, kind), payload)

    def _call_sink(self, sink: Any, method: Callable[..., Any], *args: Any) -> None:
        try:
            method(*args)
        except Exception as exc:  # a dashboard must not stop the run
            self._broken_sinks.add(id(sink))
            logger.warning(
                "memfit: Recorder sink %s failed (%s: %s); it gets nothing more",
                type(sink).__name__,
                type(exc).__name__,
                exc,
            )

    def __enter__(self) -> Recorder:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        try:
            if exc is not None and _is_oom(exc):
                self.on_oom(exc)
        finally:
            self.close()

    # -- sampling ---------------------------------------------------------------------------

    def step(self, step: int | None = None) -> dict[str, Any] | None:
        """Mark the end of a step; take a sample when it is the ``every``-th.

        Args:
            step: The step number; ``None`` counts the calls (0, 1, 2, ...).

        Returns:
            The sample taken, or ``None`` when this step was not sampled.

        Raises:
            ConfigError: When ``step`` is not a whole number, or the recorder was closed.
        """
        require("step", step, "int", optional=True)
        if not self._started:
            self.start()
        n = self._count if step is None else step
        self._count += 1
        self._last_step = n
        if n % self.every != 0:
            return None
        source = self._require_source()
        clock = time.perf_counter()
        reading = sample_fields(source.read())
        step_seconds: float | None = None
        if (
            self._last_sample_clock is not None
            and self._last_sample_step is not None
            and n > self._last_sample_step
        ):
            step_seconds = (clock - self._last_sample_clock) / (n - self._last_sample_step)
        self._last_sample_clock = clock
        self._last_sample_step = n
        if self.budget_bytes is not None:
            reading["budget_bytes"] = self.budget_bytes
        sample: dict[str, Any] = {
            "step": n,
            "time": time.time(),
            "step_seconds": step_seconds,
            **reading,
            "source": source.name,
        }
        with self._lock:
            self._samples.append(sample)
            self._write({"type": "sample", "mode": "step", **sample})
        self._sampled += 1
        if self.ranks_every is not None and self._sampled % self.ranks_every == 0:
            self._check_ranks(n, sample.get("peak_allocated_bytes"))
        self._to_sinks("sample", {"type": "sample", "mode": "step", **sample})
        if self._last_check_step is None or n - self._last_check_step >= self.log_every:
            self._last_check_step = n
            self._check(final=False)
        return sample

    def _check_ranks(self, step: int, peak: int | None) -> None:
        """Share the peaks with the other ranks and flag one well above the others."""
        if "torch.distributed" not in sys.modules:
            return
        from memfit.runtime import _distributed

        if not _distributed.is_distributed():
            return
        peaks = [p[0] if p[0] >= 0 else None for p in _distributed.gather_ints([
            peak if peak is not None else -1
        ])]  # fmt: skip
        flagged = {i.rank: i for i in rank_imbalance(peaks, self.imbalance)}
        for rank in [r for r in self._imbalanced if r not in flagged]:
            del self._imbalanced[rank]
        for rank, found in flagged.items():
            if rank in self._imbalanced:
                continue
            self._imbalanced[rank] = step
            self.on_event(
                MemoryEvent(
                    kind="rank_imbalance",
                    step=step,
                    source="Recorder",
                    message=(
                        f"rank {rank}'s peak {format_bytes(found.peak_bytes)} is "
                        f"{100 * found.excess:.0f}% above the other ranks' "
                        f"({format_bytes(found.others_bytes)}, median) since step {step}"
                    ),
                    data={
                        "rank": rank,
                        "peak_bytes": found.peak_bytes,
                        "others_bytes": found.others_bytes,
                        "excess": round(found.excess, 4),
                        "started_step": step,
                        "peaks": peaks,
                        "severity": "warning",
                    },
                )
            )

    def __call__(self, step: int | None = None, *args: object, **kwargs: object) -> None:
        """Callback form: ``rec(step)`` records the step; other arguments are ignored.

        A first argument that is not an ``int`` (a trainer state, a metrics dict) is taken
        as "no step number" and the calls are counted instead.
        """
        number = step if isinstance(step, int) and not isinstance(step, bool) else None
        self.step(step=number)

    def _write_event(self, event: MemoryEvent) -> None:
        record: dict[str, Any] = {"type": "event", **event.to_dict()}
        if self.csv:  # CSV has no nested data; "kind" goes to its own column
            record = {
                "type": "event",
                "step": event.step,
                "time": event.time,
                "event_kind": event.kind,
                "event_source": event.source,
                "message": event.message,
            }
        self._write(record)

    def _write(self, record: dict[str, Any]) -> None:
        if self._writer is not None:
            self._writer.write(record)

    # -- background sampling ----------------------------------------------------------------

    def _start_background(self) -> None:
        probe = self.device if self.device is not None else _default_probe()
        background: LiveReader
        if probe is not None:
            background = ProbeReader(probe)
            read_all = True
        else:
            background = self._require_source()
            read_all = False
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._background_loop,
            args=(background, read_all),
            name="memfit-recorder",
            daemon=True,
        )
        self._thread.start()

    def _background_loop(self, source: LiveReader, read_all: bool) -> None:
        interval = float(self.interval or 1.0)
        cpu_start = time.thread_time()
        next_tick = time.monotonic()
        failures = 0
        while not self._stop.is_set():
            try:
                records = self._background_records(source, read_all)
            except MemfitError as exc:
                failures += 1
                if failures == 1 and self.log:
                    logger.warning("memfit: background sampling failed: %s", exc.message)
                records = []
            with self._lock:
                for record in records:
                    self._background.append(record)
                    self._write({"type": "sample", "mode": "background", **record})
            for record in records:
                self._to_sinks("sample", {"type": "sample", "mode": "background", **record})
            with self._lock:
                self._background_count += 1
                self._background_cpu = time.thread_time() - cpu_start
            next_tick += interval
            delay = next_tick - time.monotonic()
            if delay < 0:  # fell behind (a slow probe): skip the missed ticks
                next_tick = time.monotonic()
                delay = 0.0
            self._stop.wait(delay)

    def _background_records(self, source: LiveReader, read_all: bool) -> list[dict[str, Any]]:
        now = time.time()
        if read_all and isinstance(source, ProbeReader):
            snapshot = source.probe.snapshot()
            records = []
            for dev in snapshot.devices:
                records.append(
                    {
                        "step": self._last_step,
                        "time": now,
                        "step_seconds": None,
                        "allocated_bytes": dev.allocated_bytes,
                        "reserved_bytes": dev.allocator_reserved_bytes,
                        "peak_allocated_bytes": dev.peak_allocated_bytes,
                        "device_used_bytes": dev.device_used_bytes,
                        "total_bytes": dev.total_bytes,
                        "budget_bytes": self.budget_bytes or dev.limit_bytes,
                        "source": snapshot.source,
                        "device_index": dev.index,
                    }
                )
            return records
        reading = sample_fields(source.read())
        if self.budget_bytes is not None:
            reading["budget_bytes"] = self.budget_bytes
        return [
            {
                "step": self._last_step,
                "time": now,
                "step_seconds": None,
                **reading,
                "source": source.name,
                "device_index": None,
            }
        ]

    @property
    def background_cpu_seconds(self) -> float:
        """CPU time the background thread has used so far (``time.thread_time``)."""
        with self._lock:
            return self._background_cpu

    @property
    def background_ticks(self) -> int:
        """How many times the background thread has sampled."""
        with self._lock:
            return self._background_count

    # -- what was recorded ------------------------------------------------------------------

    @property
    def samples(self) -> list[dict[str, Any]]:
        """The step samples kept in memory, oldest first (copies)."""
        with self._lock:
            return [dict(s) for s in self._samples]

    @property
    def background_samples(self) -> list[dict[str, Any]]:
        """The background samples kept in memory, oldest first (copies)."""
        with self._lock:
            return [dict(s) for s in self._background]

    @property
    def events(self) -> list[MemoryEvent]:
        """The events received through :meth:`on_event`, in order."""
        with self._lock:
            return list(self._events)

    # -- events -----------------------------------------------------------------------------

    def on_event(self, event: MemoryEvent) -> None:
        """Record a guard's or cleanup policy's event (pass as ``on_event=rec.on_event``).

        After a ``"cleanup"`` event a line with the memory after the cleanup is logged; an
        ``"oom"`` event writes an OOM dump (see :meth:`on_oom`).

        Args:
            event: The event.
        """
        if not self._started and not self._closed:
            self.start()
        with self._lock:
            self._events.append(event)
            self._write_event(event)
        self._to_sinks("event", event)
        if event.kind == "cleanup" and self.log:
            reading = sample_fields(
                self._source.read() if self._source is not None else NoReader().read()
            )
            logger.info(
                "memfit: %s at step %s: %s; now allocated %s, reserved %s",
                event.source,
                event.step,
                event.message,
                _fmt(reading.get("allocated_bytes")),
                _fmt(reading.get("reserved_bytes")),
            )
        elif event.kind == "oom":
            written = self.on_oom(None, event=event)
            if not written and self.log:
                logger.info(
                    "memfit: %s oom at step %s: %s", event.source, event.step, event.message
                )
        elif self.log:
            logger.info(
                "memfit: %s %s at step %s: %s", event.source, event.kind, event.step, event.message
            )

    def on_oom(
        self, exc: BaseException | None = None, *, event: MemoryEvent | None = None
    ) -> list[Path]:
        """Dump the evidence of an out-of-memory error: the last samples, a CUDA snapshot.

        Writes ``<name>.oom<N>.samples.jsonl`` (the last ``oom_samples`` samples and the
        events) and, on CUDA or under ``memfit.simulate_gpu``, ``<name>.oom<N>.snapshot.pickle``
        (a ``torch.cuda.memory`` snapshot, bounded by ``memory_history`` entries on CUDA; the
        simulated GPU's allocations in the same format), which ``memfit explain`` reads (the
        log line names the command). At most ``max_oom_dumps`` dumps are written.

        Args:
            exc: The out-of-memory exception, if there is one (its message is recorded).
            event: The event that reported it, when called from :meth:`on_event`.

        Returns:
            The files written (empty once ``max_oom_dumps`` is reached).

        Raises:
            ConfigError: When the dump directory cannot be written.
        """
        if event is None:
            from memfit.runtime.oom import first_line

            message = first_line(str(exc))[:500] if exc is not None else "out of memory"
            event = MemoryEvent(
                kind="oom", step=self._last_step, source="Recorder", message=message
            )
            with self._lock:
                self._events.append(event)
                self._write_event(event)
        if self._oom_dumps >= self.max_oom_dumps:
            return []
        self._oom_dumps += 1
        directory = self.oom_dir or (
            self.path.parent if self.path is not None else Path(tempfile.gettempdir())
        )
        stem = self.path.stem if self.path is not None else f"memfit-{os.getpid()}"
        with self._lock:
            tail = list(self._samples)[-self.oom_samples :]
            events = [e.to_dict() for e in self._events]
        written = write_oom_dump(directory, f"{stem}.oom{self._oom_dumps}", tail, events, exc)
        self.oom_files.extend(written)
        if self.log:
            snapshot = next((p for p in written if p.suffix == ".pickle"), None)
            logger.warning(
                "memfit: out of memory at step %s (%s); wrote %s%s",
                event.step,
                event.message,
                ", ".join(str(p) for p in written),
                f"; run `memfit explain {snapshot}` to see where the memory went and what "
                "would help"
                if snapshot is not None
                else "",
            )
        return written

    def _enable_memory_history(self) -> None:
        torch_module = _torch_cuda()
        if torch_module is None:
            if self.log:
                logger.info("memfit: %s", _history_without_cuda())
            return
        torch_module.cuda.memory._record_memory_history(max_entries=self.memory_history)
        self._history_enabled = True

    def install_excepthook(self) -> Recorder:
        """Make an uncaught out-of-memory error write an OOM dump before Python exits.

        The previous ``sys.excepthook`` still runs afterwards; :meth:`close` puts it back.

        Returns:
            The recorder.
        """
        if self._hook is not None:
            return self
        previous = sys.excepthook

        def hook(
            exc_type: type[BaseException],
            exc: BaseException,
            tb: types.TracebackType | None,
        ) -> None:
            try:
                if _is_oom(exc):
                    self.on_oom(exc)
            finally:
                previous(exc_type, exc, tb)

        self._previous_hook = previous
        self._hook = hook
        sys.excepthook = hook
        return self

    def uninstall_excepthook(self) -> None:
        """Put back the ``sys.excepthook`` that was there before :meth:`install_excepthook`."""
        if self._hook is not None and sys.excepthook is self._hook:
            sys.excepthook = self._previous_hook or sys.__excepthook__
        self._hook = None
        self._previous_hook = None

    # -- analysis ---------------------------------------------------------------------------

    def leaks(self, **options: Any) -> list[Leak]:
        """Steady growth in the recorded step samples (see :func:`detect_leak`).

        Looks at ``allocated_bytes`` where the source gives it, else ``device_used_bytes``,
        else the host's ``resident_bytes`` (a run on the CPU). Where no sample carries any
        memory figure nothing can be told: a warning says so once, and :meth:`leak_verdict`
        is ``"cannot tell"``.

        Args:
            **options: Passed to :func:`detect_leak` (``confidence``, ``min_growth_bytes``,
                ``min_samples``, ...).

        Returns:
            The :class:`Leak` of the series looked at, or an empty list when it does not
            grow steadily.

        Raises:
            ConfigError: When an option is out of range.
        """
        samples = self.samples
        metric = _leak_metric(samples)
        if metric is None:
            if samples and "none" not in self._warned_leaks:
                self._warned_leaks.add("none")
                logger.warning(
                    "memfit: cannot tell whether memory leaks: no sample carries a memory "
                    "figure (source %s)",
                    self.source,
                )
            return []
        leak = detect_leak(
            [s["step"] for s in samples],
            [s.get(metric) for s in samples],
            metric=metric,
            limit_bytes=_limit(samples),
            **options,
        )
        return [leak] if leak is not None else []

    def leak_verdict(self) -> str:
        """In words: ``"leak"`` (steady growth found), ``"no leak"`` (memory was read and
        does not grow steadily), or ``"cannot tell"`` (no sample carries a memory figure,
        or there is no sample yet)."""
        samples = self.samples
        if _leak_metric(samples) is None:
            return "cannot tell"
        return "leak" if self.leaks() else "no leak"

    def fragmentation(self) -> UnusedReserve | None:
        """Fragmentation seen in the latest step sample, or ``None``."""
        with self._lock:
            last = self._samples[-1] if self._samples else None
        return check_fragmentation(last) if last is not None else None

    def _check(self, *, final: bool) -> None:
        with self._lock:
            last = self._samples[-1] if self._samples else None
        if last is None:
            return
        if self.log:
            ms = last.get("step_seconds")
            timing = f", {ms * 1000:.1f} ms/step" if ms is not None else ""
            if last.get("source") == "host":
                figures = f"resident host memory {_fmt(last.get('resident_bytes'))}"
            else:
                figures = (
                    f"allocated {_fmt(last.get('allocated_bytes'))}, "
                    f"reserved {_fmt(last.get('reserved_bytes'))}, "
                    f"peak {_fmt(last.get('peak_allocated_bytes'))}"
                )
            logger.info(
                "memfit: %sstep %s: %s%s", "last " if final else "", last["step"], figures, timing
            )
        now = time.monotonic()
        if self.log and (final or now - self._last_leak_check >= self.leak_check_seconds):
            self._last_leak_check = now
            for leak in self.leaks():
                if leak.metric not in self._warned_leaks:
                    self._warned_leaks.add(leak.metric)
                    logger.warning("memfit: %s", leak.describe())
        frag = check_fragmentation(last)
        if frag is not None and not self._warned_fragmentation:
            self._warned_fragmentation = True
            if self.log:
                logger.warning("memfit: %s", frag.describe())

    def __repr__(self) -> str:
        return (
            f"Recorder(path={str(self.path) if self.path else None!r}, every={self.every}, "
            f"source={self.source!r}, samples={len(self._samples)})"
        )


def _leak_metric(samples: Iterable[dict[str, Any]]) -> str | None:
    """The first of :data:`_LEAK_METRICS` some sample carries, or ``None``."""
    rows = list(samples)
    for metric in _LEAK_METRICS:
        if any(s.get(metric) is not None for s in rows):
            return metric
    return None


def _limit(samples: Iterable[dict[str, Any]]) -> int | None:
    """The budget of the latest sample that has one, else its device total, else ``None``."""
    budget: int | None = None
    total: int | None = None
    for sample in samples:
        if sample.get("budget_bytes") is not None:
            budget = int(sample["budget_bytes"])
        if sample.get("total_bytes") is not None:
            total = int(sample["total_bytes"])
    return budget if budget is not None else total


def _fmt(value: int | None) -> str:
    return format_bytes(value) if value is not None else "n/a"
