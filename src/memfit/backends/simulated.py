"""A simulated GPU of a given size: a real :class:`~memfit.backends.base.DeviceProbe`.

It is a byte counter with a budget. Tests use it instead of a GPU, the examples use it on a
CPU, and users use it to rehearse "what if this ran on an 8 GB card". ``allocate`` past the
free memory raises :class:`memfit.OutOfMemory`, as a real device would refuse.

>>> dev = SimulatedDevice("8GiB", used_by_others="512MiB")
>>> dev.allocate(2 * 2**30)
>>> dev.free_bytes == 8 * 2**30 - 512 * 2**20 - 2 * 2**30
True
>>> dev.release(2**30); dev.allocated_bytes, dev.peak_allocated_bytes
(1073741824, 2147483648)
>>> snap = dev.snapshot()
>>> snap.devices[0].device_used_bytes == 512 * 2**20 + 2**30
True
"""

from __future__ import annotations

import threading

from memfit.backends.base import DeviceSnapshot, ProcessSnapshot, SystemSnapshot
from memfit.errors import ConfigError, OutOfMemory
from memfit.units import format_bytes, parse_bytes

__all__ = ["SimulatedDevice"]


class SimulatedDevice:
    """A budgeted fake GPU: ``total_bytes`` of memory, part of it used by other processes.

    Thread-safe: ``allocate`` and ``release`` take a lock.

    Args:
        total_bytes: Device size, bytes or a size text (``"8GiB"``).
        name: Device name shown in snapshots.
        used_by_others: Memory other processes (and the CUDA context) already hold.
        index: Device index in snapshots.

    Raises:
        ConfigError: When a size is not a size, the total is zero, or ``used_by_others``
            is more than the total.
    """

    name: str

    def __init__(
        self,
        total_bytes: int | str,
        name: str = "simulated",
        used_by_others: int | str = 0,
        *,
        index: int = 0,
    ) -> None:
        total = parse_bytes(total_bytes)
        others = parse_bytes(used_by_others)
        if total <= 0:
            raise ConfigError(
                f"a simulated device needs a positive size, not {total_bytes!r}",
                key_path="total_bytes",
                hint="give a size such as 8GiB",
            )
        if others > total:
            raise ConfigError(
                f"used_by_others ({format_bytes(others)}) is more than the device "
                f"({format_bytes(total)})",
                key_path="used_by_others",
                hint="give used_by_others smaller than total_bytes",
            )
        self.name = name
        self.index = index
        self._total = total
        self._others = others
        self._allocated = 0
        self._peak = 0
        self._lock = threading.Lock()

    @classmethod
    def from_gpu(cls, name_or_size: str | int, *, used_by_others: int | str = 0) -> SimulatedDevice:
        """A simulated device the size of a catalog GPU (``"4090"``) or of a size (``"12GiB"``).

        Raises:
            ConfigError: When the name is unknown or the size is not a size.
        """
        from memfit.hardware.catalog import gpu

        spec = gpu(name_or_size)
        return cls(spec.total_bytes, name=spec.name, used_by_others=used_by_others)

    @property
    def total_bytes(self) -> int:
        """Device size in bytes."""
        return self._total

    @property
    def used_by_others(self) -> int:
        """Bytes other processes hold."""
        return self._others

    @property
    def allocated_bytes(self) -> int:
        """Bytes allocated through :meth:`allocate` and not yet released."""
        return self._allocated

    @property
    def peak_allocated_bytes(self) -> int:
        """Largest ``allocated_bytes`` since creation or the last :meth:`reset_peak`."""
        return self._peak

    @property
    def free_bytes(self) -> int:
        """Bytes still free on the device."""
        return self._total - self._others - self._allocated

    def allocate(self, nbytes: int) -> None:
        """Take ``nbytes`` of the device.

        Raises:
            ConfigError: When ``nbytes`` is negative.
            OutOfMemory: When fewer than ``nbytes`` are free; nothing is taken then.
        """
        if nbytes < 0:
            raise ConfigError(f"cannot allocate a negative size: {nbytes}", key_path="nbytes")
        with self._lock:
            free = self._total - self._others - self._allocated
            if nbytes > free:
                raise OutOfMemory(
                    f"simulated device {self.name!r} is out of memory: tried to allocate "
                    f"{format_bytes(nbytes)} with {format_bytes(free)} free",
                    device=self.name,
                    requested_bytes=nbytes,
                    free_bytes=free,
                    peak_bytes=self._peak,
                    budget_bytes=self._total - self._others,
                    hint="allocate less, or simulate a bigger device",
                )
            self._allocated += nbytes
            self._peak = max(self._peak, self._allocated)

    def release(self, nbytes: int) -> None:
        """Give back ``nbytes`` taken by :meth:`allocate`.

        Raises:
            ConfigError: When ``nbytes`` is negative or more than is allocated.
        """
        if nbytes < 0:
            raise ConfigError(f"cannot release a negative size: {nbytes}", key_path="nbytes")
        with self._lock:
            if nbytes > self._allocated:
                raise ConfigError(
                    f"cannot release {format_bytes(nbytes)}: only "
                    f"{format_bytes(self._allocated)} is allocated",
                    key_path="nbytes",
                )
            self._allocated -= nbytes

    def reset_peak(self) -> None:
        """Start the peak again from the bytes allocated now."""
        with self._lock:
            self._peak = self._allocated

    def snapshot(self) -> SystemSnapshot:
        """The device now, as a :class:`SystemSnapshot` from source ``"simulated"``."""
        with self._lock:
            allocated, peak = self._allocated, self._peak
        processes: tuple[ProcessSnapshot, ...] = ()
        if self._others:
            processes = (
                ProcessSnapshot(
                    pid=None,
                    name="other processes",
                    used_bytes=self._others,
                    note="simulated: memory held by other processes and contexts",
                ),
            )
        device = DeviceSnapshot(
            index=self.index,
            name=self.name,
            total_bytes=self._total,
            device_used_bytes=self._others + allocated,
            free_bytes=self._total - self._others - allocated,
            processes=processes,
            notes=("simulated device: a byte counter, no CUDA context or allocator modelled",),
            allocated_bytes=allocated,
            peak_allocated_bytes=peak,
            backend="simulated",
        )
        return SystemSnapshot(source="simulated", devices=(device,))

    def __repr__(self) -> str:
        return (
            f"SimulatedDevice(total_bytes={self._total}, name={self.name!r}, "
            f"used_by_others={self._others}, allocated_bytes={self._allocated})"
        )
