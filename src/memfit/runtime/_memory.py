"""The running process's device memory, as the guards report it in their events.

Everything here reads through :func:`memfit.backends.live.active_reader`.
"""

from __future__ import annotations

import gc

from memfit.backends.live import Reading, active_reader, torch_cuda
from memfit.errors import OutOfMemory

__all__ = [
    "device_name",
    "free_device_bytes",
    "free_memory",
    "memory_figures",
    "out_of_memory",
    "reading",
]


def reading() -> Reading:
    """The active device's figures now (every field ``None`` without a device)."""
    return active_reader().read()


def memory_figures(now: Reading | None = None) -> dict[str, int | None]:
    """The figures a guard's event carries: allocated and peak bytes, the budget when one is
    set (a simulated GPU's, JAX's limit), and the device's total, ``None`` where unknown."""
    now = now if now is not None else reading()
    return {
        "allocated_bytes": now.allocated_bytes,
        "peak_bytes": now.peak_allocated_bytes,
        "budget_bytes": now.budget_bytes,
        "total_bytes": now.total_bytes,
    }


def free_memory() -> None:
    """Collect young garbage cycles and return cached CUDA blocks (after an out-of-memory).

    The failed attempt's objects are young: a collection of generations 0 and 1 finds any
    cycle among them in microseconds, where a full ``gc.collect()`` can take a quarter of a
    second in a process that has imported torch.
    """
    gc.collect(1)
    torch = torch_cuda()
    if torch is not None:
        torch.cuda.empty_cache()


def device_name() -> str | None:
    """The active device's name, or ``None``."""
    return reading().device


def free_device_bytes() -> int | None:
    """What this process can still get on its device (see ``Reading.free_bytes``)."""
    return reading().free_bytes


def out_of_memory(message: str, *, tried: list[str], hint: str) -> OutOfMemory:
    """A guard's final :class:`~memfit.errors.OutOfMemory`, with the device's figures now."""
    now = reading()
    return OutOfMemory(
        message,
        device=now.device,
        peak_bytes=now.peak_allocated_bytes,
        budget_bytes=now.budget_bytes,
        free_bytes=now.free_bytes,
        tried=tried,
        hint=hint,
    )
