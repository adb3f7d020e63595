"""The one reader of the running process's device memory.

Guards, cleanup policies, the Recorder and ``fit`` all ask the same question: how much memory
is this process using on its device now, and how much is left? :func:`active_reader` answers
it once, with the first of:

* the innermost active :func:`memfit.simulate_gpu` (on the CPU), registered here by
  :mod:`memfit.runtime.simulate` when it starts (this module never imports the runtime);
* the current CUDA device, when torch is imported and has CUDA (``torch.cuda`` allocator
  statistics, one statistics call per read, and ``mem_get_info`` for the device);
* a JAX GPU device with ``memory_stats()``, when jax is imported;
* a :class:`~memfit.backends.base.DeviceProbe` (NVML, or a simulated device) when given;
* nothing: every figure ``None``.

A job that runs on the CPU has no device memory to read; :class:`HostReader` reads the
process's resident memory instead (the Recorder falls back to it, so a CPU run's growth is
still seen).

Each reader is one small class with ``read() -> Reading`` and ``reset_peak()``; a ROCm or
another framework's allocator is one more class here. No framework is imported by this
module: torch and jax are looked up among the modules already imported.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, NamedTuple, Protocol

from memfit._plain import plain_fields
from memfit.errors import BackendUnavailable

__all__ = [
    "AllocatorCounts",
    "HostReader",
    "JaxReader",
    "LiveReader",
    "NoReader",
    "ProbeReader",
    "Reading",
    "SimulatedReader",
    "TorchCudaReader",
    "active_reader",
    "allocator_counts",
    "jax_memory_stats",
    "register_simulated",
    "simulated_gpu",
    "torch_device_memory",
    "torch_reset_peak",
]


@dataclass(frozen=True)
class Reading:
    """The running process's memory on one device; ``None`` where the source cannot say.

    Attributes:
        source: Which reader (``"simulated"``, ``"torch.cuda"``, ``"jax"``, a probe's name,
            ``"none"``).
        device: The device's name (``"cuda:0"``, the simulated GPU's name...).
        allocated_bytes: Held by live tensors (buffers).
        reserved_bytes: Held by the framework's allocator (allocated plus its cache).
        peak_allocated_bytes: The largest ``allocated_bytes`` since the last peak reset.
        peak_reserved_bytes: The largest ``reserved_bytes`` since the last peak reset.
        device_used_bytes: What the device has in use, all processes and the context
            included (``nvidia-smi``'s figure).
        total_bytes: The device's capacity.
        budget_bytes: A limit this process must stay under, when one is set
            (a simulated GPU's budget, JAX's ``bytes_limit``); ``None`` when there is none.
        free_bytes: What this process can still get: under a budget, the budget less what
            it holds; on a device, its free memory plus the allocator's unused cache.
        resident_bytes: The process's resident host memory (RSS), read by
            :class:`HostReader` on a run with no device to read.
    """

    source: str
    device: str | None = None
    allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    device_used_bytes: int | None = None
    total_bytes: int | None = None
    budget_bytes: int | None = None
    free_bytes: int | None = None
    resident_bytes: int | None = None

    @property
    def capacity_bytes(self) -> int | None:
        """The most this process may hold: the budget where one is set, else the device's
        total; ``None`` when neither is known."""
        return self.budget_bytes if self.budget_bytes is not None else self.total_bytes

    def to_dict(self) -> dict[str, Any]:
        """The figures as a plain dict (the Recorder's sample fields)."""
        return plain_fields(self)


class LiveReader(Protocol):
    """Reads one device's memory as the running process sees it."""

    name: str

    def read(self) -> Reading:
        """The figures now."""
        ...

    def reset_peak(self) -> None:
        """Start a new peak (``peak_allocated_bytes``) from what is allocated now."""
        ...


# -- simulated GPU ----------------------------------------------------------------------------

_SIMULATED: list[Callable[[], Any]] = []


def register_simulated(active: Callable[[], Any]) -> None:
    """Tell the reader how to find the active simulated GPU (called by ``simulate_gpu``)."""
    if active not in _SIMULATED:
        _SIMULATED.append(active)


def simulated_gpu() -> Any | None:
    """The innermost active :func:`memfit.simulate_gpu`, or ``None``."""
    for active in _SIMULATED:
        gpu = active()
        if gpu is not None:
            return gpu
    return None


class SimulatedReader:
    """The innermost active :func:`memfit.simulate_gpu`, looked up at each read."""

    name = "simulated"

    def read(self) -> Reading:
        gpu = simulated_gpu()
        if gpu is None:
            return Reading(self.name)
        budget = int(gpu.budget_bytes)
        kind = str(getattr(gpu, "device_kind", "cpu"))
        if kind != "cpu":
            # simulate_gpu(device="cuda"): the real allocator, capped at the budget.
            torch = torch_cuda()
            if torch is not None:
                index = int(torch.device(kind).index or 0)
                real = TorchCudaReader(torch, index).read()
                allocated = real.allocated_bytes or 0
                return replace(
                    real,
                    source=self.name,
                    budget_bytes=budget,
                    free_bytes=max(0, budget - allocated),
                )
        allocated = int(gpu.allocated_bytes)
        device = getattr(gpu, "device", None)
        total = getattr(device, "total_bytes", None)
        return Reading(
            self.name,
            device=getattr(device, "name", None) if kind == "cpu" else kind,
            allocated_bytes=allocated,
            peak_allocated_bytes=int(gpu.peak_allocated_bytes),
            total_bytes=int(total) if total is not None else None,
            budget_bytes=budget,
            free_bytes=max(0, budget - allocated),
        )

    def reset_peak(self) -> None:
        gpu = simulated_gpu()
        if gpu is not None:
            gpu.reset_peak()


# -- the framework calls: the only place memfit asks torch or JAX how much memory there is --


class AllocatorCounts(NamedTuple):
    """The caching allocator's counters of one device, read at once (bytes)."""

    allocated: int
    reserved: int
    peak_allocated: int
    peak_reserved: int


def allocator_counts(torch: Any, index: int | str) -> AllocatorCounts:
    """Allocated, reserved and their peaks on ``cuda:index``, from one statistics call.

    ``torch.cuda.memory_allocated()`` and its siblings each build and flatten the whole
    statistics dictionary (about a hundred entries): four of them cost four times that. This
    reads the nested dictionary once (``torch._C._cuda_memoryStats``), falling back to the
    public flat ``torch.cuda.memory_stats()`` where the private call is missing or changed.
    """
    index = cuda_index(torch, index)
    nested = _nested_counts(torch, index)
    if nested is not None:
        return nested
    flat = torch.cuda.memory_stats(index)
    return AllocatorCounts(
        int(flat.get("allocated_bytes.all.current", 0)),
        int(flat.get("reserved_bytes.all.current", 0)),
        int(flat.get("allocated_bytes.all.peak", 0)),
        int(flat.get("reserved_bytes.all.peak", 0)),
    )


def _nested_counts(torch: Any, index: int) -> AllocatorCounts | None:
    """The counters from ``torch._C._cuda_memoryStats``; ``None`` where it is missing or its
    layout is not the one known (a future torch)."""
    raw = getattr(getattr(torch, "_C", None), "_cuda_memoryStats", None)
    if raw is None:
        return None
    try:
        stats = raw(index)
        allocated = stats["allocated_bytes"]["all"]
        reserved = stats["reserved_bytes"]["all"]
        return AllocatorCounts(
            int(allocated["current"]),
            int(reserved["current"]),
            int(allocated["peak"]),
            int(reserved["peak"]),
        )
    except (KeyError, TypeError, RuntimeError):
        return None


def cuda_index(torch: Any, device: int | str) -> int:
    """The index of a CUDA device given as an index or as ``"cuda"`` / ``"cuda:N"``."""
    if isinstance(device, int):
        return device
    index = torch.device(device).index
    return int(torch.cuda.current_device()) if index is None else int(index)


def torch_device_memory(torch: Any, device: int | str) -> tuple[int, int]:
    """``(free, total)`` bytes of a CUDA device as the driver reports them
    (``cudaMemGetInfo``: every process and context included)."""
    free, total = torch.cuda.mem_get_info(cuda_index(torch, device))
    return int(free), int(total)


def torch_reset_peak(torch: Any, device: int | str | None = None) -> None:
    """Start the caching allocator's peaks again from what is live now (the current device
    when ``device`` is ``None``)."""
    if device is None:
        torch.cuda.reset_peak_memory_stats()
    else:
        torch.cuda.reset_peak_memory_stats(cuda_index(torch, device))


def jax_memory_stats(device: Any) -> dict[str, Any] | None:
    """A JAX device's ``memory_stats()`` (``None`` where the backend keeps none, or the
    device has no such call)."""
    stats_fn = getattr(device, "memory_stats", None)
    if stats_fn is None:
        return None
    stats = stats_fn()
    return dict(stats) if stats is not None else None


# -- torch.cuda ---------------------------------------------------------------------------------


def _imported_torch_if(question: str) -> Any | None:
    """The torch module when it is already imported and ``torch.cuda.<question>()`` is true;
    never imports torch, never raises."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return torch if getattr(torch.cuda, question)() else None
    except (AttributeError, RuntimeError):
        return None


def torch_cuda() -> Any | None:
    """The torch module when it is imported and CUDA is initialised, else ``None``."""
    return _imported_torch_if("is_initialized")


def torch_cuda_available() -> Any | None:
    """The torch module when it is imported and has a CUDA device (initialised or not)."""
    return _imported_torch_if("is_available")


class TorchCudaReader:
    """``torch.cuda`` figures of one device: allocator statistics and the driver's free."""

    name = "torch.cuda"

    def __init__(self, torch_module: Any, index: int | None = None) -> None:
        self._torch = torch_module
        self.index = int(torch_module.cuda.current_device()) if index is None else index
        self.total = int(torch_module.cuda.get_device_properties(self.index).total_memory)

    def read(self) -> Reading:
        counts = allocator_counts(self._torch, self.index)
        free, total = torch_device_memory(self._torch, self.index)
        return Reading(
            self.name,
            device=f"cuda:{self.index}",
            allocated_bytes=counts.allocated,
            reserved_bytes=counts.reserved,
            peak_allocated_bytes=counts.peak_allocated,
            peak_reserved_bytes=counts.peak_reserved,
            device_used_bytes=int(total) - int(free),
            total_bytes=self.total,
            free_bytes=int(free) + counts.reserved - counts.allocated,
        )

    def reset_peak(self) -> None:
        torch_reset_peak(self._torch, self.index)


# -- JAX ----------------------------------------------------------------------------------------


def jax_gpu() -> Any | None:
    """A JAX accelerator (GPU, TPU) with memory statistics, when jax is imported, else
    ``None``."""
    jax = sys.modules.get("jax")
    if jax is None:
        return None
    try:
        for dev in jax.devices():
            if getattr(dev, "platform", "cpu") != "cpu" and jax_memory_stats(dev) is not None:
                return dev
    except RuntimeError:
        return None
    return None


class JaxReader:
    """JAX ``memory_stats()`` of one device."""

    name = "jax"

    def __init__(self, device: Any) -> None:
        self._device = device

    def read(self) -> Reading:
        stats = jax_memory_stats(self._device) or {}

        def get(key: str) -> int | None:
            value = stats.get(key)
            return int(value) if value is not None else None

        in_use, limit = get("bytes_in_use"), get("bytes_limit")
        return Reading(
            self.name,
            device=str(self._device),
            allocated_bytes=in_use,
            reserved_bytes=get("bytes_reserved"),
            peak_allocated_bytes=get("peak_bytes_in_use"),
            peak_reserved_bytes=get("peak_bytes_reserved"),
            budget_bytes=limit,
            free_bytes=limit - in_use if limit is not None and in_use is not None else None,
        )

    def reset_peak(self) -> None:
        """JAX has no peak reset: the peak stays the process's."""


# -- a device probe -------------------------------------------------------------------------------


class ProbeReader:
    """One device of a :class:`~memfit.backends.base.DeviceProbe` (NVML, a simulated one)."""

    def __init__(self, probe: Any, index: int = 0) -> None:
        self.probe = probe
        self.index = index
        self.name = str(getattr(probe, "name", "probe"))

    def read(self) -> Reading:
        for dev in self.probe.snapshot().devices:
            if dev.index == self.index:
                return Reading(
                    self.name,
                    device=dev.name,
                    allocated_bytes=dev.allocated_bytes,
                    reserved_bytes=dev.allocator_reserved_bytes,
                    peak_allocated_bytes=dev.peak_allocated_bytes,
                    device_used_bytes=dev.device_used_bytes,
                    total_bytes=dev.total_bytes,
                    budget_bytes=dev.limit_bytes,
                    free_bytes=dev.free_bytes,
                )
        return Reading(self.name)

    def reset_peak(self) -> None:
        reset = getattr(self.probe, "reset_peak", None)
        if callable(reset):
            reset()


def _statm_resident() -> int | None:
    """Resident bytes from ``/proc/self/statm`` (Linux); ``None`` where there is none."""
    import os

    try:
        with open("/proc/self/statm", "rb") as handle:
            fields = handle.read().split()
        return int(fields[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def resident_bytes() -> int | None:
    """This process's resident host memory (RSS) now, or ``None`` where it cannot be read.

    Read from ``/proc/self/statm`` (Linux), else from ``psutil`` when it is installed.
    """
    statm = _statm_resident()
    if statm is not None:
        return statm
    try:
        import importlib

        psutil = importlib.import_module("psutil")
    except ImportError:
        return None
    try:
        return int(psutil.Process().memory_info().rss)
    except Exception:  # any failure of an optional reader is "cannot read"
        return None


class HostReader:
    """The process's resident host memory (RSS): what a job on the CPU grows.

    Its readings carry only ``resident_bytes`` (and ``device="host"``); the device figures
    stay ``None``, since no device is read.
    """

    name = "host"

    def read(self) -> Reading:
        return Reading(self.name, device="host", resident_bytes=resident_bytes())

    def reset_peak(self) -> None:
        """The resident memory has no peak to reset."""

    @staticmethod
    def available() -> bool:
        """Whether this platform lets the resident memory be read."""
        return resident_bytes() is not None


class NoReader:
    """No device: every figure unknown."""

    name = "none"

    def read(self) -> Reading:
        return Reading(self.name)

    def reset_peak(self) -> None:
        """Nothing to reset."""


def active_reader(
    kind: str = "auto", probe: Any | None = None, *, allow_cuda_init: bool = False
) -> LiveReader:
    """The reader of the device this process uses now.

    Args:
        kind: ``"auto"`` (simulated GPU, then CUDA, then JAX, then ``probe``), or one of
            ``"simulated"``, ``"torch"``, ``"jax"``, ``"probe"`` to insist on it.
        probe: A device probe to fall back to (or to use, with ``kind="probe"``).
        allow_cuda_init: With ``"auto"``, read CUDA also when torch has not initialised it
            yet (reading initialises it): a Recorder started before the model moved to the
            GPU still records the GPU. Guards leave it off, so a CPU job never starts CUDA.

    Returns:
        The reader; :class:`NoReader` when ``kind="auto"`` finds nothing.

    Raises:
        BackendUnavailable: When the source named by ``kind`` is not there.
    """
    if kind in ("auto", "simulated") and simulated_gpu() is not None:
        return SimulatedReader()
    if kind == "simulated":
        raise BackendUnavailable(
            "no memfit.simulate_gpu is active",
            hint="read inside `with memfit.simulate_gpu(...)`",
        )
    if kind in ("auto", "torch"):
        wants_init = kind == "torch" or allow_cuda_init
        torch = torch_cuda_available() if wants_init else torch_cuda()
        if torch is not None:
            return TorchCudaReader(torch)
        if kind == "torch":
            raise BackendUnavailable(
                "torch with CUDA is not there to read from",
                hint="import torch with CUDA first, or use kind='auto'",
            )
    if kind in ("auto", "jax"):
        device = jax_gpu()
        if device is not None:
            return JaxReader(device)
        if kind == "jax":
            raise BackendUnavailable(
                "no JAX GPU device with memory statistics",
                hint="import jax with a GPU backend first, or use kind='auto'",
            )
    if probe is not None:
        return ProbeReader(probe)
    if kind == "probe":
        raise BackendUnavailable(
            "kind='probe' needs a DeviceProbe",
            hint="pass probe=memfit.backends.simulated.SimulatedDevice(...) or an NVML probe",
        )
    return NoReader()
