"""The traced allocation sequence replayed through the allocator model: one estimate point.

:func:`summarise` replays a :class:`memfit.estimate.torch._tracer.TracedRun` through
:class:`memfit.allocator.model.AllocatorModel` to get what ``torch.cuda.max_memory_allocated``
and ``max_memory_reserved`` would read, and puts each storage in one category
(:data:`CATEGORIES`) at the allocated peak. When the last traced step repeats the one before
it, the replay runs that step on (:data:`STEADY_REPEATS`) to the steady state a long run
reaches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from memfit._plain import plain_fields
from memfit.allocator.model import AllocatorModel, round_size
from memfit.estimate.torch._steady import STEADY_REPEATS, Program, run_steady
from memfit.estimate.torch._steady import steady_program as _steady_program
from memfit.estimate.torch._tracer import TracedRun

__all__ = [
    "CATEGORIES",
    "FIXED_CATEGORIES",
    "STEADY_REPEATS",
    "EstimatePoint",
    "gpu_events",
    "steady_program",
    "summarise",
]

#: Breakdown keys, in the order reports show them.
CATEGORIES: tuple[str, ...] = (
    "parameters",
    "buffers",
    "gradients",
    "optimizer_state",
    "activations",
    "temporaries",
    "inputs",
    "cublas_workspace",
    "kernel_workspace",
    "other",
)

#: Categories that do not grow with the batch.
FIXED_CATEGORIES: tuple[str, ...] = (
    "parameters",
    "buffers",
    "gradients",
    "optimizer_state",
    "cublas_workspace",
)


@dataclass(frozen=True)
class EstimatePoint:
    """Predicted memory of one step at one batch size (bytes).

    Attributes:
        batch_size: The batch size traced.
        allocated_peak: Peak of ``torch.cuda.memory_allocated`` (blocks as the caching
            allocator rounds and splits them).
        reserved_peak: Peak of ``torch.cuda.memory_reserved`` from the allocator replay.
        device_used_peak: ``reserved_peak`` plus the CUDA context (and the cuBLAS workspace
            where the trace could not see it): what ``nvidia-smi`` would show for the process.
        breakdown: Allocated bytes by category (:data:`CATEGORIES`) at the allocated peak.
        top_modules: ``(module name, bytes)`` of the modules whose forward made the most
            activation memory still alive at the peak, largest first.
        exact_peak: Peak of the sum of exact storage sizes (no rounding), for comparison with
            allocators that do not round (the CPU allocator).
        num_allocations: Storages allocated in the whole trace.
        tensor_peak: Peak of the tensors' storages alone, each rounded to 512 B, without the
            memory libraries take inside kernels (cuBLAS workspace) or block slack: what
            :func:`memfit.simulate_gpu` counts.
    """

    batch_size: int
    allocated_peak: int
    reserved_peak: int
    device_used_peak: int | None
    breakdown: dict[str, int]
    top_modules: list[tuple[str, int]]
    exact_peak: int
    num_allocations: int
    tensor_peak: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The point as plain data."""
        return plain_fields(
            self,
            breakdown=dict(self.breakdown),
            top_modules=[{"module": name, "bytes": n} for name, n in self.top_modules],
        )


def steady_program(trace: TracedRun) -> Program | None:
    """The last step as a program, if it repeats the step before it
    (:func:`memfit.estimate.torch._steady.steady_program`: three steps suffice)."""
    return _steady_program(trace.events, trace.step_starts, trace.done_index)


def summarise(
    trace: TracedRun,
    batch_size: int,
    allocator: Callable[[], AllocatorModel],
    context_bytes: int | None,
) -> EstimatePoint:
    """Replay the trace through the allocator model and read the peaks and the breakdown.

    The CUDA allocator replay takes every tensor storage and what CUDA kernels take inside
    (``target`` ``"all"`` and ``"cuda"``); the exact peak of the traced device takes the
    storages and what that device's kernels take (``"all"`` and the device type).
    """
    model = allocator()
    handles: dict[int, int] = {}
    peak_index = -1
    exact = exact_peak = tensors = tensor_peak = 0
    program = steady_program(trace)
    for index, (record, is_alloc) in enumerate(trace.events):
        if program is not None and index == trace.done_index:
            # The teardown only frees; in its place the last step runs on to steady state.
            # the last step's allocations still live (the ones the next step frees)
            live = [handles.get(id(r), -1) for r in program.last_allocs]
            run_steady(model, program, live)
            break
        on_gpu = record.target in ("all", "cuda")
        on_device = record.target in ("all", trace.device_type)
        if record.target == "all" and record.category != "kernel_workspace" and record.nbytes:
            tensors += round_size(record.nbytes) if is_alloc else -round_size(record.nbytes)
            tensor_peak = max(tensor_peak, tensors)
        if is_alloc:
            if on_gpu:
                handles[id(record)] = model.malloc(record.nbytes)
                if model.allocated_bytes == model.peak_allocated_bytes:
                    peak_index = index
            if on_device:
                exact += record.nbytes
                exact_peak = max(exact_peak, exact)
        else:
            if on_gpu:
                model.free(handles.pop(id(record)))
            if on_device:
                exact -= record.nbytes
    breakdown = dict.fromkeys(CATEGORIES, 0)
    by_module: dict[str, int] = {}
    for record in trace.records:
        alive = record.alloc_index <= peak_index and (
            record.free_index is None or record.free_index > peak_index
        )
        if not alive or record.target not in ("all", "cuda") or not record.nbytes:
            continue
        size = round_size(record.nbytes)
        breakdown[record.category] = breakdown.get(record.category, 0) + size
        if record.category == "activations" and record.module is not None:
            by_module[record.module] = by_module.get(record.module, 0) + size
    # Slack of unsplit blocks counts as allocated too; keep the breakdown adding up.
    slack = model.peak_allocated_bytes - sum(breakdown.values())
    if slack > 0:
        breakdown["other"] += slack
    top = sorted(by_module.items(), key=lambda kv: kv[1], reverse=True)[:5]
    device_used = None if context_bytes is None else model.peak_reserved_bytes + context_bytes
    return EstimatePoint(
        batch_size=batch_size,
        allocated_peak=model.peak_allocated_bytes,
        reserved_peak=model.peak_reserved_bytes,
        device_used_peak=device_used,
        breakdown=breakdown,
        top_modules=top,
        exact_peak=exact_peak,
        num_allocations=sum(1 for r in trace.records if r.target == "all"),
        tensor_peak=tensor_peak,
    )


def gpu_events(trace: TracedRun) -> list[tuple[bool, int, int]]:
    """The trace's CUDA-side events as ``(is_alloc, record index, bytes)``."""
    index = {id(r): i for i, r in enumerate(trace.records)}
    return [
        (is_alloc, index[id(r)], r.nbytes)
        for r, is_alloc in trace.events
        if r.target in ("all", "cuda")
    ]
