"""Device probe through JAX: ``device.memory_stats()`` of each device.

JAX reports its allocator's view: ``bytes_in_use`` (allocated), ``peak_bytes_in_use``,
``bytes_reserved``, ``bytes_limit`` (what the allocator may take: 75% of the GPU by default).
It gives no device total or free memory and no processes. ``memory_stats()`` is ``None`` on
the CPU backend, so CPU devices carry ``None`` everywhere with a note.

Calling it starts JAX's backends; with JAX's defaults a GPU backend preallocates 75% of the
GPU in this process. Set ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` first (``memfit env``) or
probe through NVML instead.
"""

from __future__ import annotations

from typing import Any

from memfit.backends.base import DeviceSnapshot, SystemSnapshot, import_framework
from memfit.backends.live import jax_memory_stats

__all__ = ["JaxProbe", "device_from_stats"]


def _stat(stats: dict[str, Any], key: str) -> int | None:
    value = stats.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return int(value)


def device_from_stats(
    index: int, name: str, stats: dict[str, Any] | None, *, platform: str
) -> DeviceSnapshot:
    """A :class:`DeviceSnapshot` from a JAX ``memory_stats()`` dict (or ``None``).

    >>> d = device_from_stats(0, "NVIDIA H100", {"bytes_in_use": 10, "bytes_limit": 100},
    ...                       platform="gpu")
    >>> d.allocated_bytes, d.limit_bytes, d.total_bytes
    (10, 100, None)
    """
    if stats is None:
        return DeviceSnapshot(
            index=index,
            name=name,
            notes=(f"memory_stats() is None on the {platform} backend",),
            backend="jax",
        )
    return DeviceSnapshot(
        index=index,
        name=name,
        allocated_bytes=_stat(stats, "bytes_in_use"),
        peak_allocated_bytes=_stat(stats, "peak_bytes_in_use"),
        allocator_reserved_bytes=_stat(stats, "bytes_reserved"),
        peak_reserved_bytes=_stat(stats, "peak_bytes_reserved"),
        limit_bytes=_stat(stats, "bytes_limit"),
        notes=("JAX reports its allocator only: no device total, free memory or processes",),
        backend="jax",
    )


class JaxProbe:
    """A :class:`~memfit.backends.base.DeviceProbe` over ``jax.devices()``.

    Args:
        include_cpu: Also list CPU devices (their memory fields are ``None``).
        module: A module to use in place of ``jax`` (tests pass a fake).
    """

    name = "jax"

    def __init__(self, *, include_cpu: bool = False, module: Any | None = None) -> None:
        self.include_cpu = include_cpu
        self._module = module

    def _jax(self) -> Any:
        return import_framework(self._module, "jax", "JAX")

    def snapshot(self) -> SystemSnapshot:
        """JAX's devices with their allocator statistics.

        Raises:
            BackendUnavailable: When JAX is not installed.
        """
        jax = self._jax()
        devices: list[DeviceSnapshot] = []
        notes: list[str] = []
        for dev in jax.devices():
            platform = str(getattr(dev, "platform", "unknown"))
            if platform == "cpu" and not self.include_cpu:
                continue
            stats = jax_memory_stats(dev)
            name = str(getattr(dev, "device_kind", platform))
            index = int(getattr(dev, "id", len(devices)))
            devices.append(device_from_stats(index, name, stats, platform=platform))
        if not devices:
            backend = jax.default_backend() if hasattr(jax, "default_backend") else "unknown"
            notes.append(f"JAX has no GPU device (default backend: {backend})")
        version = getattr(jax, "__version__", None)
        if version:
            notes.append(f"jax {version}")
        return SystemSnapshot(source="jax", devices=tuple(devices), notes=tuple(notes))
