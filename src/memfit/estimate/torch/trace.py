"""Fake-tensor trace of a real PyTorch step: peak GPU memory without a GPU.

:func:`estimate_torch` builds the user's model and optimizer and runs their step (three
times: the second sees the optimizer state, the third tells whether steps repeat) under
:class:`torch._subclasses.fake_tensor.FakeTensorMode`, so every tensor has its real shape,
dtype and device but no data: nothing is allocated, and a model of any size traces in the
memory of its metadata. The modules around this one each do one job:

* :mod:`memfit.estimate.torch._tracer` records every storage the step allocates and frees, and
  what kernels take inside an op, in order;
* :mod:`memfit.estimate.torch._summary` replays that sequence through
  :class:`memfit.allocator.model.AllocatorModel` to get what ``torch.cuda.max_memory_allocated``
  and ``max_memory_reserved`` would read, with a breakdown by category at the peak;
* :mod:`memfit.estimate.torch._fake_compat` makes ordinary model code that fake tensors refuse as
  such trace (``module.to(device)``, initialisers that read values, logging inside a
  library, an explicit ``"cuda"`` on a machine without one), and
  :mod:`memfit.estimate.torch._refusal` says why a step cannot be traced (phase, line, hint);
* for a CUDA target traced on the CPU, the choices CUDA makes by device:
  :mod:`memfit.estimate.torch._autocast` (autocast's casts),
  :mod:`memfit.estimate.torch._cuda_defaults`
  (optimizers' implementation, autocast's device), :mod:`memfit.estimate.torch._cuda_kernels`
  (the kernel each op runs: dropout's mask, the attention backend, cuDNN's workspace) and
  :mod:`memfit.estimate.torch._cuda_blas` (cuBLAS and cuBLASLt workspaces by torch version);
* :mod:`memfit.estimate.torch._measured_scratch` measures the scratch CPU kernels take inside an op.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from memfit._checks import require
from memfit.allocator.model import AllocatorModel
from memfit.core.measured import MeasuredTerms
from memfit.errors import ConfigError, EstimateError
from memfit.estimate._devices import Collectives, collectives, split_gpu
from memfit.estimate.affine import AffineFit, check_batch_sizes, fit_affine
from memfit.estimate.torch._cuda_kernels import KernelUse
from memfit.estimate.torch._cuda_target import CudaTarget, parse_version
from memfit.estimate.torch._sequence import Fit, SequenceModel
from memfit.estimate.torch._summary import (
    CATEGORIES,
    FIXED_CATEGORIES,
    STEADY_REPEATS,
    EstimatePoint,
    gpu_events,
    steady_program,
    summarise,
)
from memfit.estimate.torch._tracer import run_trace
from memfit.hardware.runtime import ContextEstimate, Runtime
from memfit.units import format_bytes

__all__ = [
    "CATEGORIES",
    "AffineFit",
    "AllocationRequest",
    "EstimatePoint",
    "KernelUse",
    "TorchEstimate",
    "estimate_torch",
    "fit_affine",
    "trace_requests",
]


@dataclass(frozen=True)
class TorchEstimate:
    """What :func:`estimate_torch` measured.

    Attributes:
        points: One :class:`EstimatePoint` per batch size, in the order given.
        fit: Affine fit of ``allocated_peak`` over the batch sizes (``None`` with fewer than
            two distinct batch sizes).
        reserved_fit: The same for ``reserved_peak``.
        device: The device the step was traced on: ``"cuda"`` (fake) or ``"cpu"``.
        gpu: Name of the GPU the device-level figures are for, or ``None`` (defaults).
        deviations: Known ways this trace differs from a real run on the GPU.
        batch_knob: The knob the batch size stands for.
        sequence: The GPU-side allocation sequence as a function of the batch size, from
            the two largest sizes traced, or ``None`` (see :meth:`largest_fitting`).
        expandable_segments: The allocator setting the replays use.
        max_split_size: Likewise (bytes), or ``None``.
        tensor_fit: Affine fit of ``tensor_peak`` (what :func:`memfit.simulate_gpu`
            counts), or ``None`` with fewer than two distinct batch sizes.
        context: The CUDA context ``device_used_peak`` adds: its bytes, the runtime it
            assumed and its source (:class:`memfit.hardware.runtime.ContextEstimate`).
        kernels: For a CUDA target traced on the CPU, each op for which the trace followed
            a CUDA kernel that differs from the CPU's, with the kernel (or attention
            backend) chosen and its bytes (:class:`KernelUse`: what it keeps for backward,
            what it takes inside), from the trace of the largest batch size; empty
            otherwise.
    """

    points: list[EstimatePoint]
    fit: AffineFit | None
    reserved_fit: AffineFit | None
    device: str
    gpu: str | None
    deviations: list[str]
    batch_knob: str = "batch_size"
    sequence: SequenceModel | None = field(default=None, repr=False, compare=False)
    expandable_segments: bool = False
    max_split_size: int | None = None
    tensor_fit: AffineFit | None = None
    context: ContextEstimate | None = None
    kernels: dict[str, tuple[KernelUse, ...]] = field(default_factory=dict)
    # distinct ATen operators of a CUDA target's trace (largest size): {"followed": ops whose
    # CUDA kernel's memory is followed from its source, "assumed": outputs only assumed}
    kernel_coverage: dict[str, int] = field(default_factory=dict)
    # gpu="4xRTX 4090": what the other cards add to each device's device_used_peak
    collectives: Collectives | None = None

    #: The figures :meth:`band` knows, on each point.
    FIGURES = ("allocated_peak", "reserved_peak", "device_used_peak", "exact_peak", "tensor_peak")

    def band_family(self, name: str) -> str | None:
        """The family of the band figure ``name`` takes (:func:`memfit.core.bands.traced_family`):
        what it counts (``allocated`` for the tensor-level figures, ``reserved`` for the
        allocator's and the device's) and whether the step runs cuDNN convolutions, for a
        CUDA target; ``None`` without one (the ``traced`` band).

        >>> TorchEstimate([], None, None, "cpu", "RTX 4070", []).band_family("reserved_peak")
        'reserved/other'
        """
        from memfit.core.bands import traced_family

        if self.gpu is None:
            return None
        quantity = "reserved" if name in ("reserved_peak", "device_used_peak") else "allocated"
        return traced_family(quantity, self.kernels)

    @property
    def assumed_share(self) -> float:
        """The share of the distinct operators of a CUDA target's trace whose kernels are
        assumed to take their outputs only (:attr:`kernel_coverage`; 0 without one)."""
        followed = self.kernel_coverage.get("followed", 0)
        assumed = self.kernel_coverage.get("assumed", 0)
        return assumed / (followed + assumed) if followed + assumed else 0.0

    def band(self, name: str, batch_size: int | None = None) -> tuple[int, int]:
        """``(low, high)`` bytes around one figure (``"reserved_peak"``, ...) of the point
        at ``batch_size`` (default: the largest traced): how far a trace has been off on the
        project's GPU truth (:mod:`memfit.core.bands`, basis ``traced``, the band of the
        figure's family: :meth:`band_family`); the CUDA context in ``device_used_peak``
        takes the context's own band. The traced part's high side widens with
        :attr:`assumed_share`: by that share of its own width (twice the width when every
        operator's kernel is assumed), since a kernel assumed to take its outputs only can
        take more, never less.

        Raises:
            ConfigError: When ``name`` is not one of :attr:`FIGURES`, the point has no such
                figure, or ``batch_size`` was not traced.
        """
        from memfit.core.bands import figure_band, load_bands

        if name not in self.FIGURES:
            raise ConfigError(
                f"name must be one of {', '.join(self.FIGURES)}, not {name!r}", key_path="name"
            )
        points = [p for p in self.points if batch_size is None or p.batch_size == batch_size]
        if not points:
            raise ConfigError(
                f"batch_size {batch_size} was not traced: "
                + ", ".join(str(p.batch_size) for p in self.points),
                key_path="batch_size",
            )
        point = max(points, key=lambda p: p.batch_size)
        value = getattr(point, name)
        if value is None:
            raise ConfigError(f"this estimate has no {name} (no GPU to size it for)",
                              key_path="name")  # fmt: skip
        context = self.context.bytes if name == "device_used_peak" and self.context else 0
        family = self.band_family(name)
        context_basis = self.context.basis if self.context else "fitted"
        low, high = figure_band(
            int(value), "traced", context, family=family, context_basis=context_basis
        )
        traced = max(0, int(value) - min(context, int(value)))
        _, traced_high = load_bands().interval(traced, "traced", family)
        return low, high + round(max(0, traced_high - traced) * self.assumed_share)

    def replay(
        self,
        value: int,
        *,
        limit_bytes: int | None = None,
        target_bytes: int | None = None,
        extra_bytes: float = 0.0,
    ) -> Fit | None:
        """Replay the traced GPU-side allocations at ``value`` through the allocator model
        (see :meth:`memfit.estimate.torch._sequence.SequenceModel.replay`); ``None`` without a
        sequence model."""
        if self.sequence is None:
            return None
        return self.sequence.replay(
            value,
            limit_bytes=limit_bytes,
            target_bytes=target_bytes,
            expandable_segments=self.expandable_segments,
            max_split_size=self.max_split_size,
            extra_bytes=extra_bytes,
        )

    def largest_fitting(
        self,
        limit_bytes: int,
        *,
        low: int,
        high: int,
        target_bytes: int | None = None,
    ) -> Fit | None:
        """The largest batch whose traced allocations fit under ``limit_bytes`` in the
        allocator model (and keep its reserved peak within ``target_bytes``), from the two
        largest batch sizes traced (:class:`memfit.estimate.torch._sequence.SequenceModel`).

        Returns:
            The replay at that batch, or ``None`` when the traces cannot be interpolated
            (fewer than two sizes, or a step whose allocations change with the batch size)
            or ``low`` does not fit.
        """
        if self.sequence is None:
            return None
        return self.sequence.largest_fitting(
            low,
            high,
            limit_bytes=limit_bytes,
            target_bytes=target_bytes,
            expandable_segments=self.expandable_segments,
            max_split_size=self.max_split_size,
        )

    def to_dict(self) -> dict[str, Any]:
        """The estimate as plain data (for ``--json``)."""
        return {
            "framework": "torch",
            "device": self.device,
            "gpu": self.gpu,
            "batch_knob": self.batch_knob,
            "points": [p.to_dict() for p in self.points],
            "fit": None if self.fit is None else self.fit.to_dict(),
            "reserved_fit": None if self.reserved_fit is None else self.reserved_fit.to_dict(),
            "context": None if self.context is None else self.context.to_dict(),
            "kernels": {op: [use.to_dict() for use in uses] for op, uses in self.kernels.items()},
            "kernel_coverage": dict(self.kernel_coverage),
            "collectives": None if self.collectives is None else self.collectives.to_dict(),
            "deviations": list(self.deviations),
        }

    def to_measured(self) -> MeasuredTerms:
        """The estimate as the planner's :class:`MeasuredTerms` (allocated level).

        The batch-independent categories measured at the largest batch size become named
        fixed terms; the rest of the fitted intercept is ``activations_fixed``, so the terms
        add up to the fitted line.

        Raises:
            EstimateError: When there is no fit (fewer than two distinct batch sizes).
        """
        if self.fit is None:
            raise EstimateError(
                "a measured model needs at least two distinct batch sizes",
                hint="trace at two or more batch sizes, e.g. 16, 32, 64",
            )
        largest = max(self.points, key=lambda p: p.batch_size)
        fixed = {k: largest.breakdown.get(k, 0) for k in FIXED_CATEGORIES}
        fixed = {k: v for k, v in fixed.items() if v}
        fixed["activations_fixed"] = round(self.fit.intercept) - sum(fixed.values())
        return MeasuredTerms(
            knob=self.batch_knob,
            fixed_bytes=fixed,
            per_item_bytes=self.fit.slope,
            residual_bytes=math.ceil(self.fit.residual),
            source=f"torch fake-tensor trace on {self.device}",
            notes=tuple(self.deviations),
            family=self.band_family("allocated_peak"),
        )


@dataclass(frozen=True)
class AllocationRequest:
    """One allocation of a traced run, as the GPU truth corpus's traces list them.

    Attributes:
        nbytes: Bytes requested (exact, before the allocator rounds them).
        op: The ATen op whose output or kernel took it (``"aten.mm.default"``), or ``None``.
        target: ``"all"`` (a tensor), ``"cuda"`` or ``"cpu"`` (memory a library takes inside a
            kernel on that device only: cuBLAS workspace, CPU convolution scratch).
        transient: Given back inside the same op (scratch).
    """

    nbytes: int
    op: str | None
    target: str
    transient: bool


def trace_requests(
    build: Callable[[], tuple[Any, Any]],
    step: Callable[[Any, Any, Any], Any],
    make_batch: Callable[[int], Any],
    batch_size: int,
    *,
    device: str = "cpu",
    gpu: str | None = None,
    steps: int = 2,
    kernel_scratch: bool = True,
) -> list[AllocationRequest]:
    """The allocation requests of one traced run (build and ``steps`` steps), in order.

    What :func:`estimate_torch` replays, for a diff against a real run's allocator trace
    (``truth_corpus.diff_requests``).

    Raises:
        ConfigError: When the GPU name is unknown or ``build`` returns the wrong thing.
        EstimateError: When the step cannot be traced.
    """
    cuda = _cuda_target(gpu, None)
    recorder = None
    if kernel_scratch:
        from memfit.estimate.torch._measured_scratch import ScratchRecorder

        recorder = ScratchRecorder()
    trace = run_trace(
        build,
        step,
        make_batch,
        batch_size,
        device,
        steps,
        kernel_scratch=recorder,
        cuda=cuda,
        cuda_target=device == "cuda" or gpu is not None,
    )
    if recorder is not None:
        recorder.measure()
    return [
        AllocationRequest(
            r.nbytes,
            r.op,
            r.target,
            r.free_index is not None and r.free_index == r.alloc_index + 1,
        )
        for r, is_alloc in trace.events
        if is_alloc
    ]


def estimate_torch(
    build: Callable[[], tuple[Any, Any]],
    step: Callable[[Any, Any, Any], Any],
    make_batch: Callable[[int], Any],
    batch_sizes: Sequence[int],
    *,
    gpu: str | None = None,
    device: str | None = None,
    expandable_segments: bool = False,
    max_split_size: int | None = None,
    steps: int = 3,
    batch_knob: str = "batch_size",
    kernel_scratch: bool | None = None,
    runtime: Runtime | Mapping[str, str] | str | None = None,
    progress: Callable[[str], None] | None = None,
    devices: Mapping[str, Any] | None = None,
) -> TorchEstimate:
    """Predict the peak GPU memory of a PyTorch step by tracing it with fake tensors.

    Args:
        build: ``build() -> (model, optimizer)``; called under fake tensors with the traced
            device as the default device.
        step: ``step(model, optimizer, batch)``: one full training (or inference) step.
        make_batch: ``make_batch(batch_size) -> batch``.
        batch_sizes: Batch sizes to trace (each traced from a fresh build).
        gpu: GPU name or size for the device-level figures (CUDA context, cuBLAS workspace
            by architecture), looked up in :mod:`memfit.hardware.catalog`; ``None`` for defaults.
            With a count (``"4xRTX 4090"``) the step is one process's of a job on that many
            cards (DDP by default): each point's ``device_used_peak`` adds the collective
            terms every device holds (NCCL's communicator), listed with their basis in
            :attr:`TorchEstimate.collectives` and the deviations.
        device: ``"cuda"`` or ``"cpu"``; by default ``"cuda"`` where torch has CUDA, else
            ``"cpu"`` (with the deviations listed in the result).
        expandable_segments: Replay the allocator with ``expandable_segments:True``.
        max_split_size: Replay it with ``max_split_size_mb`` (given here in bytes).
        steps: Steps to run per batch size (3: the second sees the optimizer state; when the
            third repeats the second, the allocator replay runs it on to the steady state a
            long run reaches).
        batch_knob: The workload knob the batch size stands for.
        kernel_scratch: Measure the scratch memory kernels take inside an op by running each
            distinct call of such an op once for real on this machine's CPU (see
            :mod:`memfit.estimate.torch._measured_scratch`): oneDNN convolutions and CPU flash
            attention
            (``exact_peak`` of a CPU trace only) and the unreduced buffer of losses (every
            figure). ``None`` (default) or ``True``: measure; ``False``: skip (faster; those
            buffers are then not counted).
        runtime: The target's software, which sizes the CUDA context in
            ``device_used_peak``: ``{"torch": "1.10.0", "cuda": "11.2", "driver":
            "460.91.03", "module_loading": "eager"}`` (every key optional) or the same as
            ``"torch=1.10.0,cuda=11.2"``; ``None``: the installed torch's versions and its
            default loading mode (:func:`memfit.backends.software.target_runtime`).
        progress: Called with a short sentence as each batch size's trace starts, for a
            status line; ``None``: silent.
        devices: With a count in ``gpu``: a workload's ``devices:`` keys (``strategy``,
            ``topology``, ``nccl``, ``nccl_env``, ``communicators``, ``set_device``,
            ``all_to_all``).

    Returns:
        A :class:`TorchEstimate` with one point per batch size and the affine fit.

    Raises:
        ConfigError: When the batch sizes, the device, ``steps``, ``max_split_size`` or
            ``build``'s return value are invalid, or the GPU name is unknown.
        EstimateError: When the step calls an op fake tensors cannot run (data-dependent
            output, no fake kernel; the message names the op), or the user's code raises.
    """
    for name, fn in (("build", build), ("step", step), ("make_batch", make_batch)):
        require(name, fn, "callable")
    require("gpu", gpu, "str", optional=True)
    require("device", device, "str", optional=True)
    require("expandable_segments", expandable_segments, "bool")
    require("max_split_size", max_split_size, "int", optional=True)
    require("steps", steps, "int")
    require("batch_knob", batch_knob, "str")
    require("kernel_scratch", kernel_scratch, "bool", optional=True)
    require("progress", progress, "callable", optional=True)
    sizes = check_batch_sizes(batch_sizes)

    def allocator() -> AllocatorModel:
        return AllocatorModel(expandable_segments, max_split_size)

    allocator()  # an invalid max_split_size fails here, before any tracing
    if steps < 1:
        raise ConfigError(f"steps must be at least 1, got {steps}", key_path="steps")
    has_cuda = bool(torch.cuda.is_available())
    if device is None:
        device = "cuda" if has_cuda else "cpu"
    if device not in ("cuda", "cpu"):
        raise ConfigError(
            f"unknown trace device {device!r}", key_path="device", hint="use 'cuda' or 'cpu'"
        )
    if device == "cuda" and not torch.backends.cuda.is_built():  # type: ignore[no-untyped-call]
        raise ConfigError(
            "this torch is built without CUDA, so it cannot make fake CUDA tensors",
            key_path="device",
            hint="trace on 'cpu' (the default here), or install a CUDA build of torch",
        )
    from memfit.backends.software import target_runtime
    from memfit.hardware.runtime import cuda_context

    target = target_runtime(runtime)
    several = collectives(gpu, framework="torch", devices=devices, runtime=target)
    gpu = split_gpu(gpu)[0]
    cuda = _cuda_target(gpu, target)
    context_estimate = cuda_context(cuda.spec, target)
    context = context_estimate.bytes
    on_cuda = device == "cuda"
    # The figures are for a CUDA GPU whenever one is named (a GPU, a runtime) or traced on.
    cuda_target = on_cuda or gpu is not None or runtime is not None
    measure_scratch = kernel_scratch is not False
    deviations: list[str] = [
        cuda.blas_workspaces(device).describe(),
        "workspaces NCCL takes inside its kernels are not modelled",
        "the allocator replay models one stream; memory held for other streams "
        "(record_stream, side streams) is not modelled",
        f"device_used_peak adds a {context_estimate.describe()}; "
        + "; ".join(context_estimate.unknowns),
    ]
    if not on_cuda and not cuda_target:
        deviations[:0] = [
            "traced on CPU for no named CUDA target (no gpu= or runtime=): the kernels each op "
            "runs (dropout's mask, the attention backend, cuDNN's convolution workspace) are "
            "the CPU's; name the GPU to trace CUDA's"
        ]
    elif not on_cuda:
        deviations[:0] = [
            "traced on CPU because this torch has no CUDA, following CUDA's choices where "
            "torch makes them by device (listed below)",
            "optimizers built without foreach= step with their multi-tensor (foreach) "
            "implementation, as torch chooses on CUDA, not with the CPU's per-parameter loop",
        ]
    points: list[EstimatePoint] = []
    stand_ins = retargeted = kept = 0
    steady = False
    recorder = None
    events: dict[int, list[tuple[bool, int, int]]] = {}
    kernel_notes: list[str] = []
    kernels: dict[str, tuple[KernelUse, ...]] = {}
    coverage: dict[str, int] = {}
    for index, size in enumerate(sizes, 1):
        if progress is not None:
            progress(f"tracing {batch_knob}={size} ({index} of {len(sizes)})")
        if measure_scratch:
            from memfit.estimate.torch._measured_scratch import ScratchRecorder

            recorder = ScratchRecorder()
        trace = run_trace(
            build,
            step,
            make_batch,
            size,
            device,
            steps,
            kernel_scratch=recorder,
            cuda=cuda,
            cuda_target=cuda_target,
        )
        if recorder is not None:
            recorder.measure()
        stand_ins = max(stand_ins, trace.stand_ins)
        program = steady_program(trace)
        if program is not None and program.kept_bytes:
            kept = max(kept, program.kept_bytes)
        steady = steady or program is not None
        retargeted = max(retargeted, trace.retargeted)
        points.append(summarise(trace, size, allocator, context))
        events[size] = gpu_events(trace)
        if size == max(sizes) and trace.cuda_kernels is not None:
            kernels = trace.cuda_kernels.uses()
            kernel_notes = trace.cuda_kernels.notes()
            coverage = trace.cuda_kernels.coverage()
    if recorder is not None:
        deviations += recorder.notes()
    if steady:
        deviations.append(
            "the last traced step repeats the one before it, so it was replayed on through the "
            f"allocator model (up to {STEADY_REPEATS} more times) until the reserved peak held: "
            "the fragmentation a long run reaches"
        )
    elif steps >= 3:
        deviations.append(
            "the traced steps differ from one another, so the reserved peak covers only the "
            f"{steps} traced steps, not the steady state of a long run"
        )
    if kept:
        deviations.append(
            f"each step keeps {format_bytes(kept)} more alive that no later step frees (a "
            "growing list of losses or outputs?): the replayed steps include it, a real run "
            "keeps growing"
        )
    if stand_ins:
        deviations.append(
            f"{stand_ins} tensor value(s) read to Python in build() (initialisers) or inside "
            "stand_in_scalars() were given stand-ins (zero); memory does not depend on them"
        )
    if retargeted:
        deviations.append(
            f"{retargeted} call(s) named a CUDA device explicitly and were traced on the CPU"
        )
    # the last size's notes: the rules are the same at every size
    deviations += trace.autocast.notes()
    if trace.device_defaults is not None:
        deviations += trace.device_defaults.notes()
    deviations += kernel_notes
    if several is not None:
        points = [
            replace(p, device_used_peak=p.device_used_peak + several.every_device_bytes)
            if p.device_used_peak is not None
            else p
            for p in points
        ]
        deviations += several.notes()
    xs = [p.batch_size for p in points]
    sequence = None
    if len(events) >= 2:
        v1, v2 = sorted(events)[-2:]
        sequence = SequenceModel.from_traces(v1, events[v1], v2, events[v2])
    return TorchEstimate(
        points=points,
        fit=fit_affine(xs, [p.allocated_peak for p in points]),
        reserved_fit=fit_affine(xs, [p.reserved_peak for p in points]),
        device=device,
        gpu=None if cuda.spec is None else cuda.spec.name,
        deviations=deviations,
        batch_knob=batch_knob,
        sequence=sequence,
        expandable_segments=expandable_segments,
        max_split_size=max_split_size,
        tensor_fit=fit_affine(xs, [p.tensor_peak for p in points]),
        context=context_estimate,
        kernels=kernels,
        kernel_coverage=coverage,
        collectives=several,
    )


def _cuda_target(gpu: str | None, runtime: Runtime | None) -> CudaTarget:
    """The CUDA target of the figures: the named GPU (or an unknown one) and the target's
    software (its torch and CUDA versions decide the kernels' rules).

    Raises:
        ConfigError: When the GPU name is unknown.
    """
    from memfit.hardware.cuda import cublas_workspace_bytes

    spec = None
    if gpu is not None:
        from memfit.hardware.catalog import gpu as lookup_gpu

        spec = lookup_gpu(gpu)
    text = runtime.torch if runtime is not None else torch.__version__
    cuda_version = parse_version(runtime.cuda) if runtime is not None else None
    import os

    config = os.environ.get("CUBLAS_WORKSPACE_CONFIG") or None  # the job's, as torch reads it
    cudnn = runtime.cudnn if runtime is not None else None
    cublas = cublas_workspace_bytes(spec, config=config)
    return CudaTarget(spec, parse_version(text), cuda_version, cublas, text, cudnn)
