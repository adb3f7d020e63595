"""Prometheus: GPU memory per device and per process, and memfit's events, as metrics.

Names follow Prometheus' conventions (base unit in the name, ``_bytes``; counters end in
``_total``) and the GPU exporters' vocabulary (nvitop-exporter, DCGM): a label ``gpu`` with
the device index, ``name`` and ``uuid`` where known.

========================================  =====  ==================================================
metric                                    type   labels
========================================  =====  ==================================================
``gpu_memory_total_bytes``                gauge  ``gpu``, ``name``, ``uuid``
``gpu_memory_used_bytes``                 gauge  (as ``nvidia-smi`` shows, the context included)
``gpu_memory_free_bytes``                 gauge
``gpu_memory_reserved_bytes``             gauge  (kept by the driver, NVML v2)
``gpu_utilization_percent``               gauge
``gpu_process_memory_used_bytes``         gauge  ``gpu``, ``pid``, ``process`` (gone ones removed)
``memfit_allocated_bytes``                gauge  ``gpu``: the Recorder's live tensors
``memfit_reserved_bytes``                 gauge  held by the framework's allocator
``memfit_peak_allocated_bytes``           gauge
``memfit_budget_bytes``                   gauge
``memfit_step``                           gauge  the last sampled step
``memfit_step_seconds``                   gauge
``memfit_events_total``                   count  ``kind`` (oom, retry, split, ...), ``source``
========================================  =====  ==================================================

A value the driver or source cannot give is not set (an unknown never shows as 0).

* ``memfit watch --prometheus :9400`` serves the device and process metrics (each frame);
* ``Recorder(..., sinks=[PrometheusSink(":9400")])`` serves the run's own figures and
  events from inside the job (and the devices', with the Recorder's background sampler).

Addresses: ``:9400`` listens on every interface (as exporters do), ``127.0.0.1:9400`` on
one; port 0 takes a free port (:attr:`PrometheusSink.port` says which).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memfit._lazy import require
from memfit.backends.base import SystemSnapshot
from memfit.errors import ConfigError
from memfit.runtime.events import MemoryEvent

__all__ = ["PrometheusSink", "parse_address"]

_GPU = ("gpu", "name", "uuid")


def parse_address(address: str | int) -> tuple[str, int]:
    """``(host, port)`` of ``":9400"``, ``"127.0.0.1:9400"``, ``"9400"`` or ``9400``
    (no host: every interface).

    Raises:
        ConfigError: When the port is not a number in 0..65535.

    >>> parse_address(":9400"), parse_address("127.0.0.1:0")
    (('', 9400), ('127.0.0.1', 0))
    """
    text = str(address).strip()
    host, sep, port_text = text.rpartition(":")
    if not sep:
        host, port_text = "", text
    host = host.strip("[]")
    try:
        port = int(port_text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535 or isinstance(address, bool):
        raise ConfigError(
            f"not a listen address: {address!r}",
            key_path="--prometheus",
            hint="give :PORT (every interface) or HOST:PORT, e.g. :9400 or 127.0.0.1:9400",
        )
    return host, port


class PrometheusSink:
    """Prometheus metrics of devices, processes and a Recorder's samples and events.

    Args:
        address: Where to serve ``/metrics`` (``":9400"``, ``"127.0.0.1:0"``); ``None``
            serves nothing (read :attr:`registry` yourself, or push it).
        registry: The ``CollectorRegistry`` (default: a new one, so two sinks never clash
            and the process's default registry stays the caller's).

    Raises:
        BackendUnavailable: When prometheus-client is not installed.
        ConfigError: When the address is not one, or cannot be listened on.
    """

    def __init__(self, address: str | int | None = None, *, registry: Any | None = None) -> None:
        prom: Any = require("prometheus_client")
        self._prom = prom
        self.registry = registry if registry is not None else prom.CollectorRegistry()
        r = self.registry

        def gauge(name: str, doc: str, labels: tuple[str, ...]) -> Any:
            return prom.Gauge(name, doc, labels, registry=r)

        self.total = gauge("gpu_memory_total_bytes", "GPU memory total (bytes).", _GPU)
        self.used = gauge(
            "gpu_memory_used_bytes", "GPU memory used, as nvidia-smi shows it (bytes).", _GPU
        )
        self.free = gauge("gpu_memory_free_bytes", "GPU memory free (bytes).", _GPU)
        self.driver_reserved = gauge(
            "gpu_memory_reserved_bytes", "GPU memory the driver keeps (bytes).", _GPU
        )
        self.utilization = gauge("gpu_utilization_percent", "GPU utilization (%).", _GPU)
        self.process_used = gauge(
            "gpu_process_memory_used_bytes",
            "GPU memory used by one process (bytes).",
            ("gpu", "pid", "process"),
        )
        self.allocated = gauge(
            "memfit_allocated_bytes", "Live tensors of the recorded job (bytes).", ("gpu",)
        )
        self.reserved = gauge(
            "memfit_reserved_bytes", "Held by the job's framework allocator (bytes).", ("gpu",)
        )
        self.peak = gauge("memfit_peak_allocated_bytes", "Peak live tensors (bytes).", ("gpu",))
        self.budget = gauge("memfit_budget_bytes", "The job's memory budget (bytes).", ("gpu",))
        self.step = gauge("memfit_step", "Last sampled training step.", ())
        self.step_seconds = gauge("memfit_step_seconds", "Seconds per step, last sample.", ())
        self.events = prom.Counter(
            "memfit_events",
            "memfit guard and cleanup events.",
            ("kind", "source"),
            registry=r,
        )
        self._processes: set[tuple[str, str, str]] = set()
        self._server: Any | None = None
        self._thread: Any | None = None
        self.host: str | None = None
        self.port: int | None = None
        if address is not None:
            self.serve(address)

    # -- serving -------------------------------------------------------------------------

    def serve(self, address: str | int) -> int:
        """Serve ``/metrics`` at ``address`` in a daemon thread.

        Returns:
            The port listened on (the one chosen for port 0).

        Raises:
            ConfigError: When the address is not one, cannot be listened on, or this sink
                serves already.
        """
        if self._server is not None:
            raise ConfigError(
                f"this sink serves already on port {self.port}", key_path="--prometheus"
            )
        host, port = parse_address(address)
        try:
            server, thread = self._prom.start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise ConfigError(
                f"cannot listen on {host or '*'}:{port}: {exc.strerror or exc}",
                key_path="--prometheus",
                hint="pick a free port (port 0 takes any), or stop what listens there",
            ) from exc
        self._server, self._thread = server, thread
        self.host = host
        self.port = int(server.server_address[1])
        return self.port

    def close(self) -> None:
        """Stop serving (the metrics stay in :attr:`registry`). Calling it again does
        nothing."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None

    def __enter__(self) -> PrometheusSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what goes in --------------------------------------------------------------------

    def snapshot(self, snap: SystemSnapshot) -> None:
        """Set the device and process metrics from one snapshot (``memfit watch``'s frame,
        a probe's ``snapshot()``); processes gone since the last one are removed."""
        seen: set[tuple[str, str, str]] = set()
        for dev in snap.devices:
            labels = (str(dev.index), dev.name or "", getattr(dev, "uuid", None) or "")
            for gauge, value in (
                (self.total, dev.total_bytes),
                (self.used, dev.device_used_bytes),
                (self.free, dev.free_bytes),
                (self.driver_reserved, dev.driver_reserved_bytes),
                (self.utilization, dev.utilization_percent),
            ):
                if value is not None:
                    gauge.labels(*labels).set(value)
            for proc in dev.processes:
                if proc.pid is None or proc.used_bytes is None:
                    continue
                key = (str(dev.index), str(proc.pid), proc.name or "")
                seen.add(key)
                self.process_used.labels(*key).set(proc.used_bytes)
        for gone in self._processes - seen:
            self.process_used.remove(*gone)
        self._processes = seen

    def sample(self, record: Mapping[str, Any]) -> None:
        """Set the job's figures from one Recorder sample (a Recorder sink)."""
        index = record.get("device_index")
        gpu = str(index) if index is not None else ""
        for gauge, field in (
            (self.allocated, "allocated_bytes"),
            (self.reserved, "reserved_bytes"),
            (self.peak, "peak_allocated_bytes"),
            (self.budget, "budget_bytes"),
        ):
            value = record.get(field)
            if value is not None:
                gauge.labels(gpu).set(value)
        if record.get("mode", "step") == "step":
            if record.get("step") is not None:
                self.step.set(record["step"])
            if record.get("step_seconds") is not None:
                self.step_seconds.set(record["step_seconds"])

    def event(self, event: MemoryEvent) -> None:
        """Count one event by kind and source (a Recorder sink)."""
        self.events.labels(event.kind, event.source).inc()

    def text(self) -> str:
        """The metrics as Prometheus' text format (what ``/metrics`` answers)."""
        data: bytes = self._prom.generate_latest(self.registry)
        return data.decode("utf-8")
