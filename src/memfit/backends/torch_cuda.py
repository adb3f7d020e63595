"""Device probe through PyTorch: ``torch.cuda.mem_get_info`` plus the caching allocator's stats.

It sees what this process's PyTorch sees: per device the free and total memory from the
driver (``cudaMemGetInfo``), and the caching allocator's ``memory_allocated``,
``memory_reserved`` and their peaks. It cannot list other processes (NVML can).

Reading a device through torch initialises CUDA on it, which creates a CUDA context (a few
hundred MiB) in this process; prefer :class:`memfit.backends.nvml.NvmlProbe` to look from
outside. On a CPU-only torch the probe reports no device and a note; it does not fail.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memfit.backends.base import DeviceSnapshot, SystemSnapshot, import_framework
from memfit.backends.live import AllocatorCounts, allocator_counts, torch_device_memory
from memfit.errors import BackendUnavailable

__all__ = ["AllocatorCounts", "TorchProbe", "allocator_counts"]


class TorchProbe:
    """A :class:`~memfit.backends.base.DeviceProbe` over ``torch.cuda``.

    Args:
        devices: Device indices to read; all visible devices when ``None``.
        module: A module to use in place of ``torch`` (tests pass a fake).
    """

    name = "torch"

    def __init__(self, devices: Sequence[int] | None = None, *, module: Any | None = None) -> None:
        self.devices = None if devices is None else tuple(devices)
        self._module = module

    def _torch(self) -> Any:
        return import_framework(self._module, "torch", "PyTorch")

    def snapshot(self) -> SystemSnapshot:
        """Every CUDA device torch sees, with free/total memory and allocator statistics.

        Raises:
            BackendUnavailable: When torch is not installed.
        """
        torch = self._torch()
        version = getattr(torch, "__version__", "unknown")
        cuda_version = getattr(getattr(torch, "version", None), "cuda", None)
        if not torch.cuda.is_available():
            if cuda_version is None:
                note = f"torch {version} is built without CUDA (CPU-only): no CUDA device"
            else:
                note = (
                    f"torch {version} (CUDA {cuda_version}) sees no CUDA device: no GPU, no "
                    "driver, or CUDA_VISIBLE_DEVICES hides them"
                )
            return SystemSnapshot(
                source="torch", cuda_version=cuda_version, devices=(), notes=(note,)
            )
        count = int(torch.cuda.device_count())
        indices = self.devices if self.devices is not None else tuple(range(count))
        devices: list[DeviceSnapshot] = []
        for index in indices:
            if not 0 <= index < count:
                raise BackendUnavailable(
                    f"torch sees {count} CUDA device(s); there is no device {index}",
                    hint="check CUDA_VISIBLE_DEVICES",
                )
            devices.append(self._device(torch, index))
        return SystemSnapshot(
            source="torch",
            cuda_version=cuda_version,
            devices=tuple(devices),
            notes=(
                "probed through torch: this process's CUDA context is included in the "
                "used memory; other processes are not listed",
            ),
        )

    @staticmethod
    def _device(torch: Any, index: int) -> DeviceSnapshot:
        cuda = torch.cuda
        free, total = torch_device_memory(torch, index)
        props = cuda.get_device_properties(index)
        uuid_raw = getattr(props, "uuid", None)
        uuid = None
        if uuid_raw is not None:
            text = str(uuid_raw)
            uuid = text if text.startswith("GPU-") else f"GPU-{text}"
        major, minor = getattr(props, "major", None), getattr(props, "minor", None)
        cc = (int(major), int(minor)) if isinstance(major, int) and isinstance(minor, int) else None
        counts = allocator_counts(torch, index)
        return DeviceSnapshot(
            index=index,
            name=str(cuda.get_device_name(index)),
            uuid=uuid,
            total_bytes=int(total),
            device_used_bytes=int(total) - int(free),
            free_bytes=int(free),
            allocated_bytes=counts.allocated,
            allocator_reserved_bytes=counts.reserved,
            peak_allocated_bytes=counts.peak_allocated,
            peak_reserved_bytes=counts.peak_reserved,
            compute_capability=cc,
            notes=(
                "reserved_bytes (driver-reserved) and utilization are not available through torch",
            ),
            backend="torch",
        )
