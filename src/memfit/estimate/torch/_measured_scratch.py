"""Memory that kernels take inside one op, which no dispatcher-level trace sees.

A fake-tensor trace records every op's outputs. Some kernels also allocate scratch memory
while they run and give it back before they return; it counts in the real peak (it is live
at the same time as everything else) but never appears as an output:

* **CPU** (the ``exact_peak`` of a CPU trace): oneDNN convolutions reorder their input,
  weight and output between PyTorch's layout and a blocked one (channels padded to the vector
  width), in the forward pass and in both halves of the backward pass; the CPU flash
  attention kernel of ``scaled_dot_product_attention`` keeps per-thread buffers. How much
  depends on the implementation oneDNN picks for the shapes, the instruction set and the
  thread count, which no formula here could follow across oneDNN releases. So it is
  measured: after the trace, each distinct call of such an op (the same shapes, strides and
  arguments) runs once for real on this machine, alone, under ``torch.profiler``'s memory
  events (the C++ allocator's own reports), and its scratch, the peak inside the op above
  what was live before it plus its outputs, is put back into the traced sequence as a
  transient at that op. Calls whose real tensors would exceed a memory cap run at smaller
  batches and are extrapolated linearly (the result says so); measured figures are cached for
  the process.
* **Both devices**: losses with a reduction (``mse_loss``, ``smooth_l1_loss``,
  ``huber_loss``, ``binary_cross_entropy[_with_logits]``, ``soft_margin_loss``) compute the
  unreduced loss into a buffer of the input's size inside the op (``aten/src/ATen/native/
  Loss.cpp``, the same code on every device), then reduce it. They are measured the same way
  on the CPU and count for the CUDA figures too, except one CPU-only part: with the mean
  reduction and a float16 or bfloat16 loss, ``mean_out`` (``ReduceOps.cpp``) on the CPU only
  casts the unreduced buffer to float32 before summing ("cast_fp32 -> sum -> div ->
  cast_bf16_or_fp16", under ``if (self.device().is_cpu())``); CUDA's ``mean_stub`` reduces
  the half buffer in the kernel. That float32 copy (4 bytes an element of the broadcast
  inputs) counts for the CPU figures only.
* **CUDA** (``allocated_peak``/``reserved_peak``): the cuBLAS workspace, one per (handle,
  stream), is modelled by the tracer itself; see :mod:`memfit.estimate.torch.trace`.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

__all__ = ["CPU_SCRATCH_OPS", "DEFAULT_SCRATCH_CAP", "GENERIC_SCRATCH_OPS", "ScratchRecorder"]

#: Most bytes of real tensors one measured call may hold (inputs and outputs); larger calls
#: are measured at smaller batches and extrapolated.
DEFAULT_SCRATCH_CAP = 256 * 2**20

#: CPU ops whose kernels take scratch memory, by name, with the positions of the arguments
#: whose first dimension is the batch.
CPU_SCRATCH_OPS: dict[str, tuple[int, ...]] = {
    "aten.convolution.default": (0,),
    "aten.convolution_backward.default": (0, 1),
    "aten._scaled_dot_product_flash_attention_for_cpu.default": (0, 1, 2),
    "aten._scaled_dot_product_flash_attention_for_cpu_backward.default": (0, 1, 2, 3, 4, 5),
}

#: Ops whose scratch comes from device-generic code (measured on the CPU, counted for every
#: device), with the positions of their batch arguments.
GENERIC_SCRATCH_OPS: dict[str, tuple[int, ...]] = {
    f"aten.{name}.default": batch
    for name, batch in (
        ("mse_loss", (0, 1)),
        ("mse_loss_backward", (0, 1, 2)),
        ("smooth_l1_loss", (0, 1)),
        ("smooth_l1_loss_backward", (0, 1, 2)),
        ("huber_loss", (0, 1)),
        ("huber_loss_backward", (0, 1, 2)),
        ("binary_cross_entropy", (0, 1, 2)),
        ("binary_cross_entropy_backward", (0, 1, 2, 3)),
        ("binary_cross_entropy_with_logits", (0, 1, 2, 3)),
        ("soft_margin_loss", (0, 1)),
        ("soft_margin_loss_backward", (0, 1, 2)),
    )
}

#: ``at::Reduction::Mean``, the value of a loss's ``reduction`` argument for the mean.
_REDUCTION_MEAN = 1
_REDUCED_FLOATS = (torch.float16, torch.bfloat16)


def cpu_mean_cast_bytes(func: Any, args: Sequence[Any]) -> int:
    """The float32 copy of the unreduced loss that a reduced-precision loss's ``mean`` makes
    on the CPU only (see the module docstring): 4 bytes an element of the broadcast shape of
    the first two tensor arguments, for a loss's forward op with the mean reduction on
    float16 or bfloat16 inputs; 0 otherwise (other reductions, other dtypes, backward ops,
    which do not reduce)."""
    schema = getattr(func, "_schema", None)
    if schema is None or str(schema.name).endswith("_backward"):
        return 0
    names = [a.name for a in schema.arguments]
    if "reduction" not in names:
        return 0
    at = names.index("reduction")
    reduction = args[at] if at < len(args) else schema.arguments[at].default_value
    if reduction != _REDUCTION_MEAN:
        return 0
    tensors = [a for a in args if isinstance(a, torch.Tensor)][:2]
    if not tensors or tensors[0].dtype not in _REDUCED_FLOATS:
        return 0
    ndim = max(t.dim() for t in tensors)
    sizes = [(1,) * (ndim - t.dim()) + tuple(int(n) for n in t.shape) for t in tensors]
    return 4 * int(math.prod(max(dims) for dims in zip(*sizes, strict=True)))


# (op, argument descriptors, threads) -> (scratch bytes, bytes of the outputs' storages), for
# every estimate in this process. A kernel may return a result that keeps a larger storage
# alive than its shape needs (a loss reduced into a view of its unreduced buffer): the outputs'
# real storage bytes let the trace count that too.
_MEASURED: dict[tuple[Any, ...], tuple[int, int]] = {}


@dataclass(frozen=True)
class _TensorSpec:
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype

    def nbytes(self) -> int:
        if any(s == 0 for s in self.shape):
            return 0
        span = 1 + sum((n - 1) * st for n, st in zip(self.shape, self.stride, strict=True))
        return span * self.dtype.itemsize

    def scaled(self, batch: int) -> _TensorSpec:
        """The same tensor with ``batch`` rows (a contiguous batch dimension keeps its stride
        pattern: rows further apart by the same step)."""
        return _TensorSpec((batch, *self.shape[1:]), self.stride, self.dtype)

    def make(self) -> torch.Tensor:
        t = torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device="cpu")
        if self.dtype.is_floating_point or self.dtype.is_complex:
            t.normal_()
        else:
            t.zero_()
        return t


def _describe(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return _TensorSpec(tuple(value.shape), tuple(value.stride()), value.dtype)
    if isinstance(value, (list, tuple)):
        return tuple(_describe(v) for v in value)
    if isinstance(value, (int, float, bool, str, type(None), torch.dtype, torch.device)):
        return value
    if isinstance(value, torch.memory_format):
        return value
    return repr(value)


def _realise(desc: Any, as_list: bool = False) -> Any:
    if isinstance(desc, _TensorSpec):
        return desc.make()
    if isinstance(desc, tuple):
        items = [_realise(d) for d in desc]
        return items if as_list else tuple(items)
    return desc


@dataclass(eq=False)
class _Call:
    op: Any
    name: str
    args: tuple[Any, ...]  # descriptors
    batch_args: tuple[int, ...]
    target: str  # "all" (device-generic code) or "cpu"
    # per call in the trace: (the transient's record, the records of the outputs' storages)
    records: list[tuple[Any, list[Any]]] = field(default_factory=list)
    # per call in the trace with a CPU-only part (:func:`cpu_mean_cast_bytes`): (the CPU's
    # transient, the CUDA's transient, the CPU-only bytes); ``records`` holds no entry for it
    split_records: list[tuple[Any, Any, int]] = field(default_factory=list)

    @property
    def key(self) -> tuple[Any, ...]:
        return (self.name, self.args, torch.get_num_threads())

    def batch(self) -> int | None:
        sizes = {
            self.args[i].shape[0]
            for i in self.batch_args
            if i < len(self.args) and isinstance(self.args[i], _TensorSpec) and self.args[i].shape
        }
        return sizes.pop() if len(sizes) == 1 else None

    def at_batch(self, batch: int) -> tuple[Any, ...]:
        full = self.batch()
        args = list(self.args)
        for i in self.batch_args:
            spec = args[i] if i < len(args) else None
            if isinstance(spec, _TensorSpec) and spec.shape and spec.shape[0] == full:
                args[i] = spec.scaled(batch)
        return tuple(args)

    def real_bytes(self, args: tuple[Any, ...]) -> int:
        specs = [a for a in tree_flatten(list(args))[0] if isinstance(a, _TensorSpec)]
        inputs = sum(s.nbytes() for s in specs)
        return 2 * inputs  # outputs and gradients of these ops are about the inputs' size


class ScratchRecorder:
    """Collects, during a CPU trace, the calls whose kernels take scratch memory; measures
    them afterwards (see the module docstring).

    Args:
        cap_bytes: Most bytes of real tensors one measured call may hold (default
            :data:`DEFAULT_SCRATCH_CAP`).
    """

    def __init__(self, cap_bytes: int | None = None) -> None:
        self.cap_bytes = DEFAULT_SCRATCH_CAP if cap_bytes is None else cap_bytes
        self.calls: dict[tuple[Any, ...], _Call] = {}
        self.extrapolated: set[str] = set()
        self.failed: set[str] = set()

    def on_op(self, trace: Any, func: Any, args: tuple[Any, ...], out: Any) -> None:
        """Called by the tracer after each op: a transient of yet unknown size for the ops
        that take scratch."""
        name = str(func)
        target = "all"
        batch_args = GENERIC_SCRATCH_OPS.get(name)
        if batch_args is None and trace.device_type == "cpu":
            batch_args = CPU_SCRATCH_OPS.get(name)
            target = "cpu"
        if batch_args is None:
            return
        outputs = []
        for item in tree_flatten(out)[0]:
            if isinstance(item, torch.Tensor) and item.device.type == trace.device_type:
                found = trace.live.get(id(item.untyped_storage()))
                if found is not None and found not in outputs:
                    outputs.append(found)
        cpu_only = cpu_mean_cast_bytes(func, args) if target == "all" else 0
        call = _Call(func, name, tuple(_describe(a) for a in args), batch_args, target)
        known = self.calls.setdefault(call.key, call)
        if cpu_only:
            # one figure per device: the CPU's with its float32 copy, CUDA's without
            on_cpu = trace.add_transient(0, "kernel_workspace", "cpu")
            on_cuda = trace.add_transient(0, "kernel_workspace", "cuda")
            known.split_records.append((on_cpu, on_cuda, cpu_only))
            known.records.append((None, outputs))
            return
        record = trace.add_transient(0, "kernel_workspace", target)
        known.records.append((record, outputs))

    def measure(self) -> None:
        """Run each distinct call for real; give its transients their scratch bytes, and its
        outputs' records the bytes their real storages hold."""
        todo = [c for c in self.calls.values() if c.key not in _MEASURED]
        plans: list[tuple[_Call, list[int]]] = []
        for call in todo:
            full = call.batch()
            if full is None or call.real_bytes(call.args) <= self.cap_bytes:
                plans.append((call, [full or 0]))
                continue
            per_item = max(1, call.real_bytes(call.at_batch(1)))
            top = max(1, min(full, self.cap_bytes // per_item))
            plans.append((call, sorted({max(1, top // 2), top})))
        runs = [(call, b) for call, batches in plans for b in batches]
        measured = _profile_scratch(runs)
        for call, batches in plans:
            figures = [measured.get((id(call), b)) for b in batches]
            if any(f is None for f in figures):
                self.failed.add(call.name)
                _MEASURED[call.key] = (0, 0)
                continue
            values = [f for f in figures if f is not None]
            full = call.batch()
            if len(batches) == 1 and (full is None or batches[0] in (0, full)):
                _MEASURED[call.key] = values[0]
                continue
            self.extrapolated.add(call.name)
            assert full is not None
            if len(batches) == 1:  # one row fits the cap: scale it
                b1 = max(1, batches[0])
                _MEASURED[call.key] = (values[0][0] * full // b1, values[0][1] * full // b1)
            else:
                (b1, b2), (v1, v2) = batches, values
                _MEASURED[call.key] = (
                    _extrapolate(b1, v1[0], b2, v2[0], full),
                    _extrapolate(b1, v1[1], b2, v2[1], full),
                )
        for call in self.calls.values():
            scratch, real_out = _MEASURED.get(call.key, (0, 0))
            for on_cpu, on_cuda, cpu_only in call.split_records:
                on_cpu.nbytes = scratch
                on_cuda.nbytes = max(0, scratch - cpu_only)
            for record, outputs in call.records:
                if record is not None:
                    record.nbytes = scratch
                traced_out = sum(r.nbytes for r in outputs)
                # only device-generic code keeps the same storages on every device
                if call.target == "all" and outputs and real_out > traced_out:
                    outputs[0].nbytes += real_out - traced_out

    def notes(self) -> list[str]:
        """What the result should say about these figures."""
        out: list[str] = []
        if self.calls:
            out.append(
                "scratch memory kernels take inside an op (oneDNN convolution reorders and "
                "CPU flash attention: exact_peak of a CPU trace only; the unreduced buffer of "
                f"losses: every figure) measured by running {len(self.calls)} distinct op "
                "call(s) once for real on this machine's CPU"
            )
        if self.extrapolated:
            out.append(
                "scratch of " + ", ".join(sorted(self.extrapolated)) + " was measured at "
                f"smaller batches (real tensors over {self.cap_bytes // 2**20} MiB) and "
                "extrapolated linearly"
            )
        if self.failed:
            out.append(
                "scratch of " + ", ".join(sorted(self.failed)) + " could not be measured "
                "(the op failed on real tensors) and is not counted"
            )
        return out


@contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 (the profiler prints a line at every start and stop)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real stderr (embedded interpreters)
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _extrapolate(b1: int, v1: int, b2: int, v2: int, full: int) -> int:
    slope = max(0.0, (v2 - v1) / (b2 - b1))
    return round(v2 + slope * (full - b2))


def _profile_scratch(
    runs: Sequence[tuple[_Call, int]],
) -> dict[tuple[int, int], tuple[int, int]]:
    """(scratch bytes, outputs' storage bytes) of each (call, batch): one profiler session,
    one marked window each."""
    if not runs:
        return {}
    from torch.profiler import ProfilerActivity, profile, record_function

    outputs: dict[str, int] = {}
    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _quiet_stderr():
        prof.__enter__()  # type: ignore[no-untyped-call]
    try:
        for index, (call, batch) in enumerate(runs):
            args = call.at_batch(batch) if batch else call.args
            real = tuple(_realise(a, as_list=True) for a in args)
            marker = f"memfit_scratch_{index}"
            out = None
            try:
                with torch.no_grad(), record_function(marker):
                    out = call.op(*real)
            except Exception:  # the op refuses real tensors made this way: not measured
                continue
            storages = {
                id(t.untyped_storage()): int(t.untyped_storage().nbytes())
                for t in tree_flatten(out)[0]
                if isinstance(t, torch.Tensor)
            }
            outputs[marker] = sum(storages.values())
            del out, real
    finally:
        with _quiet_stderr():
            prof.__exit__(None, None, None)  # type: ignore[no-untyped-call]
    results = prof.profiler.kineto_results if prof.profiler is not None else None
    events: list[Any] = list(results.events()) if results is not None else []
    windows = {
        e.name(): (e.start_ns(), e.start_ns() + e.duration_ns())
        for e in events
        if e.name().startswith("memfit_scratch_")
    }
    memory = sorted((e for e in events if e.name() == "[memory]"), key=lambda e: e.start_ns())
    result: dict[tuple[int, int], tuple[int, int]] = {}
    for index, (call, batch) in enumerate(runs):
        marker = f"memfit_scratch_{index}"
        if marker not in windows or marker not in outputs:
            continue
        start, end = windows[marker]
        live = peak = 0
        for event in memory:
            if start <= event.start_ns() <= end:
                live += event.nbytes()
                peak = max(peak, live)
        result[(id(call), batch)] = (max(0, peak - outputs[marker]), outputs[marker])
    return result
