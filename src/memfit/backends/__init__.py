"""Hardware and frameworks, each behind the small :class:`DeviceProbe` protocol.

:func:`local_probe` picks the best probe this machine has: NVML (it sees every process and
creates no CUDA context), else PyTorch (where NVML is missing but CUDA works, as on Jetson),
else JAX's allocator statistics (only where this process has already imported jax: starting
JAX's GPU backend preallocates most of the device), else none. :func:`probe_all` returns its
snapshot, or an empty one whose notes say why no backend could look.

Importing this package imports neither torch, jax nor pynvml; the probes import them when
they run.
"""

from __future__ import annotations

import ctypes.util
import os
import sys
from pathlib import Path

from memfit.backends.base import DeviceProbe, DeviceSnapshot, ProcessSnapshot, SystemSnapshot
from memfit.backends.simulated import SimulatedDevice
from memfit.errors import BackendUnavailable

__all__ = [
    "DeviceProbe",
    "DeviceSnapshot",
    "ProcessSnapshot",
    "SimulatedDevice",
    "SystemSnapshot",
    "cuda_driver_present",
    "local_probe",
    "probe_all",
]


def cuda_driver_present() -> bool:
    """Whether this machine shows signs of a CUDA driver (a ``libcuda`` or a device node).

    Used to decide whether importing torch to look for CUDA is worth its cost.
    """
    if "torch" in sys.modules:
        return True
    if ctypes.util.find_library("cuda") is not None:
        return True
    dev = Path("/dev")
    return (dev / "nvidiactl").exists() or (dev / "nvhost-ctrl").exists() or os.name == "nt"


def _select(
    try_torch: bool | None,
) -> tuple[DeviceProbe | None, SystemSnapshot | None, list[str]]:
    from memfit.backends.nvml import NvmlProbe

    reasons: list[str] = []
    nvml = NvmlProbe()
    try:
        nvml.gate.init()
        return nvml, None, reasons
    except BackendUnavailable as exc:
        reasons.append(exc.message)
    want_torch = cuda_driver_present() if try_torch is None else try_torch
    if not want_torch:
        reasons.append("no CUDA driver found (no libcuda, no /dev/nvidiactl): torch not tried")
        return _jax_if_imported(reasons)
    from memfit.backends.torch_cuda import TorchProbe

    torch_probe = TorchProbe()
    try:
        snap = torch_probe.snapshot()
    except BackendUnavailable as exc:
        reasons.append(exc.message)
        return _jax_if_imported(reasons)
    if snap.devices:
        return torch_probe, snap, reasons
    reasons.extend(snap.notes)
    return _jax_if_imported(reasons)


def _jax_if_imported(
    reasons: list[str],
) -> tuple[DeviceProbe | None, SystemSnapshot | None, list[str]]:
    """JAX's GPU devices, where this process has already imported jax (never imported here:
    JAX's GPU backend would preallocate the device)."""
    if "jax" not in sys.modules:
        return None, None, reasons
    from memfit.backends.jax_device import JaxProbe

    jax_probe = JaxProbe()
    try:
        snap = jax_probe.snapshot()
    except (BackendUnavailable, RuntimeError) as exc:
        reasons.append(f"JAX could not list its devices: {exc}")
        return None, None, reasons
    if snap.devices:
        return jax_probe, snap, reasons
    reasons.extend(snap.notes)
    return None, None, reasons


def local_probe(*, try_torch: bool | None = None) -> tuple[DeviceProbe | None, list[str]]:
    """The best available probe here, and why the better ones were passed over.

    Args:
        try_torch: Try PyTorch when NVML is unavailable: ``True`` always, ``False`` never,
            ``None`` only where :func:`cuda_driver_present` (importing torch costs seconds).

    Returns:
        ``(probe, reasons)``: the NVML probe when NVML starts; else the torch probe when
        torch sees a CUDA device; else ``None``. ``reasons`` has one line per backend that
        was passed over.
    """
    probe, _, reasons = _select(try_torch)
    return probe, reasons


def probe_all(*, try_torch: bool | None = None) -> SystemSnapshot:
    """A snapshot of this machine's GPUs from the best available probe.

    With no GPU or no driver this is a snapshot of source ``"none"`` with zero devices and
    notes saying why; it never raises for a missing GPU.

    Raises:
        BackendUnavailable: Only when a backend that started fails while reading (NVML
            lost the driver between the start and the read).
    """
    probe, snap, reasons = _select(try_torch)
    if probe is None:
        return SystemSnapshot(
            source="none", devices=(), notes=("no NVIDIA GPU or driver found", *reasons)
        )
    if snap is None:
        snap = probe.snapshot()
    if not reasons:
        return snap
    return SystemSnapshot(
        source=snap.source,
        taken_at=snap.taken_at,
        driver_version=snap.driver_version,
        devices=snap.devices,
        notes=(*snap.notes, *reasons),
        cuda_version=snap.cuda_version,
        hostname=snap.hostname,
    )
