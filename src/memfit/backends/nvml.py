"""The one gate to NVML (``nvidia-ml-py``, imported as ``pynvml``).

Everything memfit asks the NVIDIA driver goes through :class:`NvmlGate`, in the manner of
nvitop's ``libnvml.py``:

* ``pynvml`` is imported and ``nvmlInit`` called lazily, on first use, under a lock; an
  ``atexit`` hook calls ``nvmlShutdown`` once;
* memory comes from the v2 call (``nvmlDeviceGetMemoryInfo_v2``: total, reserved, free,
  used, matching ``nvidia-smi`` on driver 515+) with a fallback to v1 (where reserved
  memory is counted in used);
* every ``NVMLError`` is translated in one function, :func:`translate_error`, into either
  :class:`memfit.BackendUnavailable` (no driver, no library: NVML cannot run at all) or a
  ``None`` value with a one-line reason (``NotSupported`` under Windows WDDM / WSL,
  ``NoPermission`` on a MIG parent, a driver too old for a call, ...).

Per-process memory comes from ``nvmlDeviceGetComputeRunningProcesses`` and
``nvmlDeviceGetGraphicsRunningProcesses``. NVML reports *host* PIDs; inside a container's PID
namespace they are not in ``/proc``, so the process name and user stay ``None`` with a note.

The gate takes an injected module in place of ``pynvml`` (``NvmlGate(module=fake)``), so the
tests exercise every error path without a GPU.
"""

from __future__ import annotations

import atexit
import importlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from memfit.backends.base import DeviceSnapshot, ProcessSnapshot, SystemSnapshot
from memfit.errors import BackendUnavailable

__all__ = [
    "FATAL_KINDS",
    "NvmlGate",
    "NvmlProbe",
    "NvmlResult",
    "default_gate",
    "error_kind",
    "translate_error",
]

T = TypeVar("T")

# NVML return codes (nvml.h). Read from the module when it defines them; these are the values
# the header fixes, used when an injected module leaves some out.
_CODES: dict[str, int] = {
    "NVML_ERROR_UNINITIALIZED": 1,
    "NVML_ERROR_INVALID_ARGUMENT": 2,
    "NVML_ERROR_NOT_SUPPORTED": 3,
    "NVML_ERROR_NO_PERMISSION": 4,
    "NVML_ERROR_NOT_FOUND": 6,
    "NVML_ERROR_INSUFFICIENT_SIZE": 7,
    "NVML_ERROR_DRIVER_NOT_LOADED": 9,
    "NVML_ERROR_TIMEOUT": 10,
    "NVML_ERROR_LIBRARY_NOT_FOUND": 12,
    "NVML_ERROR_FUNCTION_NOT_FOUND": 13,
    "NVML_ERROR_GPU_IS_LOST": 15,
    "NVML_ERROR_RESET_REQUIRED": 16,
    "NVML_ERROR_OPERATING_SYSTEM": 17,
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": 18,
    "NVML_ERROR_ARGUMENT_VERSION_MISMATCH": 25,
    "NVML_ERROR_DEPRECATED": 26,
    "NVML_ERROR_UNKNOWN": 999,
}

_KIND_BY_CODE_NAME: dict[str, str] = {
    "NVML_ERROR_UNINITIALIZED": "uninitialized",
    "NVML_ERROR_INVALID_ARGUMENT": "invalid_argument",
    "NVML_ERROR_NOT_SUPPORTED": "not_supported",
    "NVML_ERROR_NO_PERMISSION": "no_permission",
    "NVML_ERROR_NOT_FOUND": "not_found",
    "NVML_ERROR_INSUFFICIENT_SIZE": "insufficient_size",
    "NVML_ERROR_DRIVER_NOT_LOADED": "driver_not_loaded",
    "NVML_ERROR_TIMEOUT": "timeout",
    "NVML_ERROR_LIBRARY_NOT_FOUND": "library_not_found",
    "NVML_ERROR_FUNCTION_NOT_FOUND": "function_not_found",
    "NVML_ERROR_GPU_IS_LOST": "gpu_is_lost",
    "NVML_ERROR_RESET_REQUIRED": "reset_required",
    "NVML_ERROR_OPERATING_SYSTEM": "operating_system",
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": "driver_library_mismatch",
    "NVML_ERROR_ARGUMENT_VERSION_MISMATCH": "version_mismatch",
    "NVML_ERROR_DEPRECATED": "deprecated",
    "NVML_ERROR_UNKNOWN": "unknown",
}

#: Error kinds after which NVML cannot run at all (they raise ``BackendUnavailable``).
FATAL_KINDS: frozenset[str] = frozenset(
    {"driver_not_loaded", "library_not_found", "driver_library_mismatch", "uninitialized"}
)

_REASONS: dict[str, str] = {
    "not_supported": "not supported by this GPU or driver model (Windows WDDM / WSL give no "
    "per-process memory)",
    "no_permission": "permission denied (on a MIG-enabled GPU the parent device needs root "
    "for this)",
    "function_not_found": "the driver is too old for this NVML call",
    "version_mismatch": "the driver does not know this version of the call",
    "driver_not_loaded": "the NVIDIA driver is not loaded",
    "library_not_found": "the NVML library (libnvidia-ml) was not found",
    "driver_library_mismatch": "the NVML library does not match the loaded kernel driver "
    "(reboot after a driver update)",
    "uninitialized": "NVML is not initialised",
    "gpu_is_lost": "the GPU has fallen off the bus",
    "reset_required": "the GPU needs a reset",
    "timeout": "the driver timed out",
    "not_found": "not found",
    "invalid_argument": "invalid argument",
    "insufficient_size": "buffer too small",
    "operating_system": "the operating system blocked the request",
    "deprecated": "the call is deprecated in this driver",
    "unknown": "unknown NVML error",
}


def error_kind(exc: BaseException, module: Any) -> str:
    """The kind of an NVML error (``"not_supported"``, ``"no_permission"``, ...).

    Args:
        exc: An exception raised by a ``pynvml`` call.
        module: The ``pynvml`` module (or a fake) whose codes to compare against.

    Returns:
        One of the kinds in this module, or ``"unknown"``.
    """
    value = getattr(exc, "value", None)
    if not isinstance(value, int):
        return "unknown"
    for code_name, kind in _KIND_BY_CODE_NAME.items():
        code = getattr(module, code_name, _CODES[code_name])
        if value == code:
            return kind
    return "unknown"


def translate_error(exc: BaseException, module: Any, what: str) -> str:
    """Turn an NVML error into a one-line reason, or raise when NVML cannot run at all.

    This is the only place memfit interprets NVML errors.

    Args:
        exc: The ``NVMLError`` raised.
        module: The ``pynvml`` module (or fake) that raised it.
        what: What was asked (``"per-process memory"``), for the reason text.

    Returns:
        ``"<what>: <reason> (NVML: <message>)"``, to go with a ``None`` value.

    Raises:
        BackendUnavailable: For the kinds in :data:`FATAL_KINDS` (driver not loaded, library
            not found, driver/library mismatch, NVML not initialised).
    """
    kind = error_kind(exc, module)
    reason = _REASONS.get(kind, _REASONS["unknown"])
    text = f"{what}: {reason} (NVML: {exc})"
    if kind in FATAL_KINDS:
        raise BackendUnavailable(
            f"NVML unavailable: {reason}",
            hint="install the NVIDIA driver (and nvidia-ml-py); inside a container run it "
            "with the GPU exposed (docker run --gpus all)",
        ) from exc
    return text


@dataclass(frozen=True)
class NvmlResult:
    """A value from NVML, or ``None`` with the reason it could not be had."""

    value: Any
    reason: str | None = None
    kind: str | None = None


class NvmlGate:
    """Lazy, locked, translated access to NVML.

    Args:
        module: A module to use in place of ``pynvml`` (tests pass a fake); ``None`` imports
            ``pynvml`` on first use.

    Example:
        >>> gate = NvmlGate()          # nothing imported or initialised yet
        >>> gate.initialized
        False
    """

    def __init__(self, module: Any | None = None) -> None:
        self._module = module
        self._lock = threading.RLock()
        self._initialized = False
        self._atexit_registered = False
        self.generation = 0  # successful nvmlInit calls: handles from an older one are stale

    @property
    def initialized(self) -> bool:
        """Whether ``nvmlInit`` has succeeded and no shutdown happened since."""
        return self._initialized

    @property
    def module(self) -> Any:
        """The ``pynvml`` module (imported on first access).

        Raises:
            BackendUnavailable: When ``nvidia-ml-py`` is not installed.
        """
        with self._lock:
            if self._module is None:
                try:
                    self._module = importlib.import_module("pynvml")
                except ImportError as exc:
                    raise BackendUnavailable(
                        "NVML unavailable: the nvidia-ml-py package is not installed",
                        hint="pip install 'memfit[nvml]' (or nvidia-ml-py)",
                    ) from exc
            return self._module

    def init(self) -> None:
        """Call ``nvmlInit`` once (thread-safe) and register the shutdown at exit.

        Raises:
            BackendUnavailable: When the package, library or driver is missing, or NVML
                refuses to start.
        """
        with self._lock:
            if self._initialized:
                return
            nvml = self.module
            error_type = self._error_type()
            try:
                nvml.nvmlInit()
            except error_type as exc:
                kind = error_kind(exc, nvml)
                reason = _REASONS.get(kind, _REASONS["unknown"])
                raise BackendUnavailable(
                    f"NVML unavailable: {reason}",
                    hint="install the NVIDIA driver; inside a container expose the GPU "
                    "(docker run --gpus all); on a machine without an NVIDIA GPU there is "
                    "nothing to probe",
                ) from exc
            except OSError as exc:
                raise BackendUnavailable(
                    f"NVML unavailable: cannot load libnvidia-ml ({exc})",
                    hint="install the NVIDIA driver",
                ) from exc
            self._initialized = True
            self.generation += 1
            if not self._atexit_registered:
                atexit.register(self.shutdown)
                self._atexit_registered = True

    def shutdown(self) -> None:
        """Call ``nvmlShutdown`` if initialised; errors at shutdown are ignored."""
        with self._lock:
            if not self._initialized:
                return
            self._initialized = False
            nvml = self._module
            if nvml is None:
                return
            try:
                nvml.nvmlShutdown()
            except self._error_type():
                return

    def _error_type(self) -> type[BaseException]:
        err = getattr(self._module, "NVMLError", None)
        if isinstance(err, type) and issubclass(err, BaseException):
            return err
        return Exception

    def call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> NvmlResult:
        """Call ``fn(*args, **kwargs)`` and translate any NVML error.

        Args:
            what: What is asked, for the reason text (``"utilization"``).
            fn: A function of the NVML module.

        Returns:
            :class:`NvmlResult` with the value, or ``None`` and the reason.

        Raises:
            BackendUnavailable: When the error means NVML cannot run (see
                :func:`translate_error`).
        """
        self.init()
        try:
            return NvmlResult(fn(*args, **kwargs))
        except self._error_type() as exc:
            kind = error_kind(exc, self.module)
            return NvmlResult(None, translate_error(exc, self.module, what), kind)

    def get(self, what: str, name: str, *args: Any, **kwargs: Any) -> NvmlResult:
        """Like :meth:`call`, for the NVML function called ``name``.

        A function the installed ``pynvml`` lacks gives ``None`` and a reason.
        """
        fn = getattr(self.module, name, None)
        if fn is None:
            return NvmlResult(
                None, f"{what}: this nvidia-ml-py has no {name}", "function_not_found"
            )
        return self.call(what, fn, *args, **kwargs)


# -- process details from /proc -----------------------------------------------------------------


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _process_details(
    pid: int, proc_root: Path
) -> tuple[str | None, str | None, str | None, str | None]:
    """Name, command line, user and a note for a host PID, from ``proc_root``."""
    if not proc_root.is_dir():
        return None, None, None, f"no {proc_root} on this system: process details unavailable"
    base = proc_root / str(pid)
    if not base.exists():
        return (
            None,
            None,
            None,
            "PID not visible here (a container's PID namespace hides host PIDs)",
        )
    name = _read_text(base / "comm")
    cmdline = _read_text(base / "cmdline")
    command = " ".join(part for part in cmdline.split("\0") if part) if cmdline else None
    user: str | None = None
    try:
        uid = base.stat().st_uid
        import pwd

        user = pwd.getpwuid(uid).pw_name
    except (OSError, KeyError, ImportError):
        user = None
    return (name.strip() if name else None), (command or None), user, None


def _to_str(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _cuda_version_text(value: Any) -> str | None:
    if not isinstance(value, int) or value <= 0:
        return None
    return f"{value // 1000}.{(value % 1000) // 10}"


class NvmlProbe:
    """A :class:`~memfit.backends.base.DeviceProbe` over NVML.

    Args:
        gate: The NVML gate; the shared default gate when ``None``.
        proc_root: Where to read process details (``/proc``); tests point it elsewhere.
    """

    name = "nvml"

    def __init__(self, gate: NvmlGate | None = None, *, proc_root: str | Path = "/proc") -> None:
        self.gate = gate if gate is not None else default_gate()
        self.proc_root = Path(proc_root)
        # What does not change while the driver is loaded is read once (a snapshot is taken
        # ten times a second by a background Recorder; the MIG mode call alone costs 80 us on
        # an H100): the driver and CUDA versions, the device count, and per device its
        # handle, name, UUID, compute capability and MIG mode (a change needs a GPU reset);
        # per process its name, command line and user, while the PID stays listed.
        self._system: tuple[NvmlResult, NvmlResult, NvmlResult] | None = None
        self._static: dict[int, tuple[NvmlResult, ...]] = {}
        self._details: dict[int, tuple[str | None, str | None, str | None, str | None]] = {}
        self._generation = -1

    def snapshot(self) -> SystemSnapshot:
        """Every GPU NVML sees, with memory, utilisation and processes.

        Raises:
            BackendUnavailable: When NVML cannot run (no package, library or driver).
        """
        gate = self.gate
        gate.init()
        notes: list[str] = []
        if gate.generation != self._generation:  # NVML restarted: read everything again
            self._system = None
            self._static.clear()
            self._details.clear()
            self._generation = gate.generation
        if self._system is None:
            driver = gate.get("driver version", "nvmlSystemGetDriverVersion")
            cuda = gate.get("CUDA version", "nvmlSystemGetCudaDriverVersion_v2")
            if cuda.value is None:
                cuda = gate.get("CUDA version", "nvmlSystemGetCudaDriverVersion")
            count = gate.get("device count", "nvmlDeviceGetCount")
            if count.value is not None:
                self._system = (driver, cuda, count)
        else:
            driver, cuda, count = self._system
        if count.value is None:
            notes.append(count.reason or "device count unknown")
        devices = tuple(self._device(i) for i in range(int(count.value or 0)))
        if not devices:
            notes.append("NVML found no GPU")
        return SystemSnapshot(
            source="nvml",
            driver_version=_to_str(driver.value) if driver.value is not None else None,
            cuda_version=_cuda_version_text(cuda.value),
            devices=devices,
            notes=tuple(notes),
        )

    def _memory(self, handle: Any, notes: list[str]) -> tuple[Any, bool]:
        gate = self.gate
        version = getattr(gate.module, "nvmlMemory_v2", None)
        if version is not None:
            v2 = gate.get("memory (v2)", "nvmlDeviceGetMemoryInfo", handle, version=version)
            if v2.value is not None:
                return v2.value, True
            notes.append(f"{v2.reason}; fell back to the v1 call (reserved counted in used)")
        v1 = gate.get("memory", "nvmlDeviceGetMemoryInfo", handle)
        if v1.value is None and v1.reason:
            notes.append(v1.reason)
        return v1.value, False

    def _processes(self, handle: Any, notes: list[str]) -> tuple[ProcessSnapshot, ...]:
        gate = self.gate
        seen: dict[int, tuple[set[str], int | None, bool]] = {}
        for kind, fn_name in (
            ("compute", "nvmlDeviceGetComputeRunningProcesses"),
            ("graphics", "nvmlDeviceGetGraphicsRunningProcesses"),
        ):
            result = gate.get(f"{kind} processes", fn_name, handle)
            if result.value is None:
                if result.reason:
                    notes.append(result.reason)
                continue
            for proc in result.value:
                pid = int(proc.pid)
                used_raw = getattr(proc, "usedGpuMemory", None)
                used = int(used_raw) if isinstance(used_raw, int) else None
                kinds, prev_used, unknown = seen.get(pid, (set(), None, False))
                kinds.add(kind)
                if used is None:
                    unknown = True
                elif prev_used is None or used > prev_used:
                    prev_used = used
                seen[pid] = (kinds, prev_used, unknown)
        processes = []
        me = os.getpid()
        for gone in [pid for pid in self._details if pid not in seen]:
            del self._details[gone]
        for pid, (kinds, used, unknown) in sorted(seen.items()):
            details = self._details.get(pid)
            if details is None:
                details = _process_details(pid, self.proc_root)
                self._details[pid] = details
            name, command, user, note = details
            if used is None and unknown:
                extra = (
                    "per-process memory not available (Windows WDDM / WSL driver model, "
                    "or not reported for this process)"
                )
                note = f"{note}; {extra}" if note else extra
            if pid == me:
                note = f"{note}; this process" if note else "this process"
            processes.append(
                ProcessSnapshot(
                    pid=pid,
                    name=name,
                    command=command,
                    user=user,
                    used_bytes=used,
                    kind="+".join(k for k in ("compute", "graphics") if k in kinds),
                    note=note,
                )
            )
        hidden = sum(1 for p in processes if p.note and "namespace" in p.note)
        if hidden:
            notes.append(
                f"{hidden} process(es) not visible from this PID namespace: NVML reports host "
                "PIDs (running in a container?)"
            )
        return tuple(processes)

    def _device(self, index: int) -> DeviceSnapshot:
        gate = self.gate
        notes: list[str] = []
        static = self._static.get(index)
        if static is None:
            handle_r = gate.get("device handle", "nvmlDeviceGetHandleByIndex", index)
            if handle_r.value is None:
                return DeviceSnapshot(
                    index=index,
                    name="unknown",
                    notes=(handle_r.reason or "device handle unavailable",),
                    backend="nvml",
                )
            handle = handle_r.value
            static = (
                handle_r,
                gate.get("name", "nvmlDeviceGetName", handle),
                gate.get("uuid", "nvmlDeviceGetUUID", handle),
                gate.get("compute capability", "nvmlDeviceGetCudaComputeCapability", handle),
                gate.get("MIG mode", "nvmlDeviceGetMigMode", handle),
            )
            self._static[index] = static
        handle_r, name_r, uuid_r, cc_r, mig_r = static
        handle = handle_r.value
        memory, is_v2 = self._memory(handle, notes)
        util_r = gate.get("utilization", "nvmlDeviceGetUtilizationRates", handle)
        if util_r.value is None and util_r.reason:
            notes.append(util_r.reason)
        mig_on = False
        if isinstance(mig_r.value, (list, tuple)) and mig_r.value:
            mig_on = bool(mig_r.value[0])
        if mig_on:
            notes.append(
                "MIG is enabled: memory and processes of the whole GPU are shown; each MIG "
                "instance has its own share"
            )
        processes = self._processes(handle, notes)
        total = _opt_int(getattr(memory, "total", None)) if memory is not None else None
        used = _opt_int(getattr(memory, "used", None)) if memory is not None else None
        free = _opt_int(getattr(memory, "free", None)) if memory is not None else None
        reserved = (
            _opt_int(getattr(memory, "reserved", None)) if memory is not None and is_v2 else None
        )
        cc: tuple[int, int] | None = None
        if isinstance(cc_r.value, (list, tuple)) and len(cc_r.value) == 2:
            cc = (int(cc_r.value[0]), int(cc_r.value[1]))
        return DeviceSnapshot(
            index=index,
            name=_to_str(name_r.value) if name_r.value is not None else "unknown",
            uuid=_to_str(uuid_r.value) if uuid_r.value is not None else None,
            total_bytes=total,
            device_used_bytes=used,
            free_bytes=free,
            driver_reserved_bytes=reserved,
            utilization_percent=_opt_int(getattr(util_r.value, "gpu", None)),
            processes=processes,
            notes=tuple(notes),
            compute_capability=cc,
            backend="nvml",
        )


def _opt_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return int(value)


_DEFAULT: list[NvmlGate] = []
_DEFAULT_LOCK = threading.Lock()


def default_gate() -> NvmlGate:
    """The process-wide gate over the real ``pynvml`` (created on first use)."""
    with _DEFAULT_LOCK:
        if not _DEFAULT:
            _DEFAULT.append(NvmlGate())
        return _DEFAULT[0]
