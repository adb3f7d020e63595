"""The device-probe protocol and the frozen snapshots every backend returns.

A probe (NVML, torch, JAX, the simulated device) looks at the hardware once and hands back a
:class:`SystemSnapshot`: plain, frozen data that the planner can use, that saves to JSON and
loads back (``memfit devices --save`` / ``--from-json``), so a user can attach theirs to a bug
report and a plan can be reproduced on another machine.

Vocabulary (``torch.cuda``'s, see DESIGN.md): ``device_used`` is what ``nvidia-smi`` shows as
used (CUDA contexts included); ``allocated`` is memory in live tensors; ``allocator_reserved``
is what a framework's caching allocator holds; ``reserved`` on a device is what the *driver*
keeps for itself (NVML's v2 memory call). A figure a backend cannot give is ``None`` and a line
in ``notes`` says why; it is never 0, -1 or NaN.

>>> dev = DeviceSnapshot(index=0, name="simulated", total_bytes=8 * 2**30,
...                      device_used_bytes=2**30, free_bytes=7 * 2**30)
>>> snap = SystemSnapshot(source="simulated", devices=(dev,))
>>> SystemSnapshot.from_dict(snap.to_dict()) == snap
True
"""

from __future__ import annotations

import datetime as _dt
import importlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from memfit._checks import require_instance
from memfit._plain import plain_fields
from memfit._userfiles import file_error, read_user_text
from memfit.errors import BackendUnavailable, ConfigError

__all__ = [
    "SNAPSHOT_FORMAT",
    "DeviceProbe",
    "DeviceSnapshot",
    "ProcessSnapshot",
    "SystemSnapshot",
    "import_framework",
    "utc_now",
]

#: Version of the JSON layout written by :meth:`SystemSnapshot.to_dict`.
SNAPSHOT_FORMAT = 2


def utc_now() -> str:
    """The current time as ISO 8601 in UTC, to the second (``"2026-01-31T12:00:00Z"``)."""
    now = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0)
    return now.isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class ProcessSnapshot:
    """One process holding memory on a device.

    Attributes:
        pid: Process id as the driver reports it (a *host* PID inside a container), or
            ``None`` where there is no process id (a simulated "other processes" entry).
        name: Short process name (``"python"``), or ``None`` when it cannot be read (for
            instance a host PID not visible from inside a container's PID namespace).
        command: Full command line, or ``None``.
        user: Owner's user name, or ``None``.
        used_bytes: Device memory the process uses, or ``None`` where the driver cannot say
            (Windows WDDM / WSL).
        kind: ``"compute"``, ``"graphics"`` or ``"compute+graphics"``, or ``None``.
        note: Why a field is ``None``, or another remark.
    """

    pid: int | None
    name: str | None = None
    command: str | None = None
    user: str | None = None
    used_bytes: int | None = None
    kind: str | None = None
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The process as plain JSON data."""
        return plain_fields(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, where: str = "process") -> ProcessSnapshot:
        """Build a process from :meth:`to_dict` output.

        Raises:
            ConfigError: When a field has the wrong type (``key_path`` names it).
        """
        _require_mapping(data, where)
        return cls(
            pid=_opt_int(data, "pid", where),
            name=_opt_str(data, "name", where),
            command=_opt_str(data, "command", where),
            user=_opt_str(data, "user", where),
            used_bytes=_opt_int(data, "used_bytes", where),
            kind=_opt_str(data, "kind", where),
            note=_opt_str(data, "note", where),
        )


@dataclass(frozen=True)
class DeviceSnapshot:
    """One GPU (or simulated device) at one moment. Sizes in bytes; unknown is ``None``.

    Attributes:
        index: Device index as the backend numbers it.
        name: Device name as the driver reports it (``"NVIDIA GeForce RTX 4090"``).
        uuid: Device UUID, or ``None``.
        total_bytes: Total memory as the driver reports it, or ``None``.
        device_used_bytes: Used memory as ``nvidia-smi`` shows it (contexts included).
        free_bytes: Free memory.
        driver_reserved_bytes: Memory the driver reserves for itself (NVML v2
            ``reserved``); ``None`` when only the v1 call was available (then it is counted
            in used). Not the framework allocator's reserve: that is
            ``allocator_reserved_bytes``.
        utilization_percent: GPU utilisation over the driver's last sample, 0-100.
        processes: Processes holding memory on the device; empty when none or unknown
            (``notes`` says which).
        notes: Why fields are ``None``, and other remarks, one line each.
        allocated_bytes: Bytes in live tensors of *this* process's framework, if probed
            through one (``torch.cuda.memory_allocated``, JAX ``bytes_in_use``).
        allocator_reserved_bytes: Bytes the framework's caching allocator holds
            (``torch.cuda.memory_reserved``, JAX ``bytes_reserved``).
        peak_allocated_bytes: Peak of ``allocated_bytes`` since the last reset.
        peak_reserved_bytes: Peak of ``allocator_reserved_bytes`` since the last reset.
        limit_bytes: The most the framework's allocator may take (JAX ``bytes_limit``).
        compute_capability: ``(major, minor)``, or ``None``.
        backend: The probe that produced it (``"nvml"``, ``"torch"``, ``"jax"``,
            ``"simulated"``).
    """

    index: int
    name: str
    uuid: str | None = None
    total_bytes: int | None = None
    device_used_bytes: int | None = None
    free_bytes: int | None = None
    driver_reserved_bytes: int | None = None
    utilization_percent: int | None = None
    processes: tuple[ProcessSnapshot, ...] = ()
    notes: tuple[str, ...] = ()
    allocated_bytes: int | None = None
    allocator_reserved_bytes: int | None = None
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    limit_bytes: int | None = None
    compute_capability: tuple[int, int] | None = None
    backend: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The device as plain JSON data (tuples become lists)."""
        return plain_fields(
            self,
            processes=[p.to_dict() for p in self.processes],
            notes=list(self.notes),
            compute_capability=(
                list(self.compute_capability) if self.compute_capability is not None else None
            ),
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, where: str = "device") -> DeviceSnapshot:
        """Build a device from :meth:`to_dict` output.

        Raises:
            ConfigError: When a field is missing or has the wrong type (``key_path`` names it).
        """
        _require_mapping(data, where)
        index = _opt_int(data, "index", where)
        name = _opt_str(data, "name", where)
        if index is None or name is None:
            raise ConfigError(
                "a device needs an 'index' and a 'name'",
                key_path=where,
                hint=_SNAPSHOT_HINT,
            )
        cc_raw = data.get("compute_capability")
        compute_capability: tuple[int, int] | None = None
        if cc_raw is not None:
            if (
                not isinstance(cc_raw, (list, tuple))
                or len(cc_raw) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in cc_raw)
            ):
                raise ConfigError(
                    f"compute_capability must be [major, minor], not {cc_raw!r}",
                    key_path=f"{where}.compute_capability",
                    hint=_SNAPSHOT_HINT,
                )
            compute_capability = (int(cc_raw[0]), int(cc_raw[1]))
        procs_raw = data.get("processes", [])
        if not isinstance(procs_raw, list):
            raise ConfigError(
                "processes must be a list", key_path=f"{where}.processes", hint=_SNAPSHOT_HINT
            )
        return cls(
            index=index,
            name=name,
            uuid=_opt_str(data, "uuid", where),
            total_bytes=_opt_int(data, "total_bytes", where),
            device_used_bytes=_opt_int(data, "device_used_bytes", where),
            free_bytes=_opt_int(data, "free_bytes", where),
            # Format 1 called it reserved_bytes.
            driver_reserved_bytes=_opt_int(
                data,
                "driver_reserved_bytes" if "driver_reserved_bytes" in data else "reserved_bytes",
                where,
            ),
            utilization_percent=_opt_int(data, "utilization_percent", where),
            processes=tuple(
                ProcessSnapshot.from_dict(p, where=f"{where}.processes[{i}]")
                for i, p in enumerate(procs_raw)
            ),
            notes=_str_tuple(data, "notes", where),
            allocated_bytes=_opt_int(data, "allocated_bytes", where),
            allocator_reserved_bytes=_opt_int(data, "allocator_reserved_bytes", where),
            peak_allocated_bytes=_opt_int(data, "peak_allocated_bytes", where),
            peak_reserved_bytes=_opt_int(data, "peak_reserved_bytes", where),
            limit_bytes=_opt_int(data, "limit_bytes", where),
            compute_capability=compute_capability,
            backend=_opt_str(data, "backend", where),
        )


@dataclass(frozen=True)
class SystemSnapshot:
    """All devices one probe saw at one moment.

    Attributes:
        source: The probe (``"nvml"``, ``"torch"``, ``"jax"``, ``"simulated"``, ``"none"``).
        taken_at: When, ISO 8601 UTC (``"2026-01-31T12:00:00Z"``).
        driver_version: NVIDIA driver version, or ``None``.
        devices: The devices, in index order; empty when there is none.
        notes: Remarks about the whole system (why no device was found, which backend was
            missing), one line each.
        cuda_version: CUDA version the driver supports (NVML) or the framework was built
            with (torch), or ``None``.
        hostname: Machine name, or ``None`` (left out unless a probe fills it).
    """

    source: str
    taken_at: str = field(default_factory=utc_now)
    driver_version: str | None = None
    devices: tuple[DeviceSnapshot, ...] = ()
    notes: tuple[str, ...] = ()
    cuda_version: str | None = None
    hostname: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The snapshot as plain JSON data, with a ``format`` version number."""
        return {
            "format": SNAPSHOT_FORMAT,
            **plain_fields(
                self, devices=[d.to_dict() for d in self.devices], notes=list(self.notes)
            ),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SystemSnapshot:
        """Build a snapshot from :meth:`to_dict` output.

        Raises:
            ConfigError: When the data is not a snapshot, is of a newer format, or a field
                has the wrong type (``key_path`` names it).
        """
        _require_mapping(data, "snapshot")
        fmt = data.get("format", SNAPSHOT_FORMAT)
        if not isinstance(fmt, int) or isinstance(fmt, bool) or fmt > SNAPSHOT_FORMAT:
            raise ConfigError(
                f"unsupported snapshot format {fmt!r} (this memfit reads up to {SNAPSHOT_FORMAT})",
                key_path="snapshot.format",
                hint="upgrade memfit, or save the snapshot again with this version",
            )
        source = _opt_str(data, "source", "snapshot")
        if source is None:
            raise ConfigError(
                "a snapshot needs a 'source'",
                key_path="snapshot.source",
                hint=_SNAPSHOT_HINT,
            )
        taken_at = _opt_str(data, "taken_at", "snapshot")
        devices_raw = data.get("devices", [])
        if not isinstance(devices_raw, list):
            raise ConfigError(
                "devices must be a list", key_path="snapshot.devices", hint=_SNAPSHOT_HINT
            )
        return cls(
            source=source,
            taken_at=taken_at if taken_at is not None else utc_now(),
            driver_version=_opt_str(data, "driver_version", "snapshot"),
            devices=tuple(
                DeviceSnapshot.from_dict(d, where=f"devices[{i}]")
                for i, d in enumerate(devices_raw)
            ),
            notes=_str_tuple(data, "notes", "snapshot"),
            cuda_version=_opt_str(data, "cuda_version", "snapshot"),
            hostname=_opt_str(data, "hostname", "snapshot"),
        )

    def save(self, path: str | Path) -> Path:
        """Write the snapshot as JSON to ``path`` and return the path.

        Raises:
            ConfigError: When the file cannot be written.
        """
        target = Path(path)
        try:
            target.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
        except OSError as exc:
            raise file_error(exc, target, action="write snapshot") from exc
        return target

    @classmethod
    def load(cls, path: str | Path) -> SystemSnapshot:
        """Read a snapshot written by :meth:`save` (or by ``memfit devices --json``).

        Raises:
            ConfigError: When the file is missing, not JSON, or not a snapshot.
        """
        source = Path(path)
        text = read_user_text(
            source, what="snapshot", hint="pass a file written by `memfit devices --save FILE`"
        )
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
                key_path=str(source),
                hint="pass a file written by `memfit devices --save FILE`",
            ) from exc
        return cls.from_dict(data)

    def total_bytes(self, index: int = 0) -> int | None:
        """Total memory of the device with ``index``, or ``None`` if unknown or absent."""
        for dev in self.devices:
            if dev.index == index:
                return dev.total_bytes
        return None

    def sized_device(self, index: int, *, by_name_hint: str) -> tuple[DeviceSnapshot, int]:
        """The local device with ``index`` and its total memory, to plan for it.

        Args:
            index: The device's index.
            by_name_hint: How to plan without this device (the error's hint).

        Raises:
            BackendUnavailable: When there is no device, none with ``index``, or it does not
                say how much memory it has.
        """
        if not self.devices:
            raise BackendUnavailable(
                "no local GPU to plan for: " + "; ".join(self.notes), hint=by_name_hint
            )
        matches = [d for d in self.devices if d.index == index]
        if not matches:
            raise BackendUnavailable(
                f"no local GPU with index {index} ({len(self.devices)} found by {self.source})",
                hint="pick an index that memfit devices lists",
            )
        dev = matches[0]
        if dev.total_bytes is None:
            raise BackendUnavailable(
                f"{dev.name} does not report its total memory ({'; '.join(dev.notes)})",
                hint=by_name_hint,
            )
        return dev, dev.total_bytes


@runtime_checkable
class DeviceProbe(Protocol):
    """Anything that can look at GPUs and return a :class:`SystemSnapshot`.

    Attributes:
        name: The backend's name (``"nvml"``, ``"torch"``, ``"jax"``, ``"simulated"``).
    """

    name: str

    def snapshot(self) -> SystemSnapshot:
        """Look at the devices now.

        Raises:
            BackendUnavailable: When the backend cannot run here (no driver, no library,
                no CUDA).
        """
        ...


# -- validation helpers for from_dict ------------------------------------------------------


def _require_mapping(data: object, where: str) -> None:
    require_instance(where, data, Mapping, what="an object", hint=_SNAPSHOT_HINT)


def import_framework(module: Any | None, name: str, label: str) -> Any:
    """The framework a probe reads: ``module`` when given (tests pass a fake), else ``name``.

    Raises:
        BackendUnavailable: When the framework is not installed (the hint names the extra).
    """
    if module is not None:
        return module
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise BackendUnavailable(
            f"{label} is not installed", hint=f"pip install 'memfit[{name}]'"
        ) from exc


_SNAPSHOT_HINT = "use a file written by `memfit devices --save` or `--json`"


def _opt_int(data: Mapping[str, Any], key: str, where: str) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(
            f"expected a whole number >= 0 or null, got {value!r}",
            key_path=f"{where}.{key}",
            hint=_SNAPSHOT_HINT,
        )
    return value


def _opt_str(data: Mapping[str, Any], key: str, where: str) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigError(
            f"expected a string or null, got {value!r}",
            key_path=f"{where}.{key}",
            hint=_SNAPSHOT_HINT,
        )
    return value


def _str_tuple(data: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = data.get(key, [])
    if value is None:
        return ()
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise ConfigError(
            f"expected a list of strings, got {value!r}",
            key_path=f"{where}.{key}",
            hint=_SNAPSHOT_HINT,
        )
    if not all(isinstance(v, str) for v in value):
        raise ConfigError(
            "expected a list of strings", key_path=f"{where}.{key}", hint=_SNAPSHOT_HINT
        )
    return tuple(value)
