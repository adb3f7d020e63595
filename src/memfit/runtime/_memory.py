"""The running process's device memory, as the guards report it in their events."""

from __future__ import annotations

import gc
import sys

__all__ = ["device_name", "free_device_bytes", "free_memory", "memory_figures"]


def memory_figures() -> dict[str, int | None]:
    """Allocated, peak and budget bytes of the device in use, ``None`` where unknown.

    The innermost :func:`memfit.simulate_gpu` when one is active, else the current CUDA
    device when torch has initialised CUDA, else unknown.
    """
    from memfit.runtime.simulate import active

    gpu = active()
    if gpu is not None:
        return {
            "allocated_bytes": gpu.allocated_bytes,
            "peak_bytes": gpu.peak_allocated_bytes,
            "budget_bytes": gpu.budget_bytes,
        }
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        index = torch.cuda.current_device()
        return {
            "allocated_bytes": int(torch.cuda.memory_allocated(index)),
            "peak_bytes": int(torch.cuda.max_memory_allocated(index)),
            "budget_bytes": int(torch.cuda.get_device_properties(index).total_memory),
        }
    return {"allocated_bytes": None, "peak_bytes": None, "budget_bytes": None}


def free_memory() -> None:
    """Collect young garbage cycles and return cached CUDA blocks (after an out-of-memory).

    The failed attempt's objects are young: a collection of generations 0 and 1 finds any
    cycle among them in microseconds, where a full ``gc.collect()`` can take a quarter of a
    second in a process that has imported torch.
    """
    gc.collect(1)
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def device_name() -> str | None:
    from memfit.runtime.simulate import active

    gpu = active()
    if gpu is not None:
        return gpu.device.name if gpu.device_kind == "cpu" else gpu.device_kind
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return f"cuda:{torch.cuda.current_device()}"
    return None


def free_device_bytes() -> int | None:
    """Free bytes of the simulated GPU, or of the CUDA device (free plus cached), or None."""
    from memfit.runtime.simulate import active

    gpu = active()
    if gpu is not None:
        return gpu.free_bytes
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        from memfit.backends.torch_cuda import allocator_counts

        index = torch.cuda.current_device()
        free, _ = torch.cuda.mem_get_info(index)
        counts = allocator_counts(torch, index)
        return int(free) + counts.reserved - counts.allocated
    return None
