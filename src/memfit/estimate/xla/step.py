"""XLA's compiled memory analysis of a jitted JAX step: peak device memory without running it.

:func:`estimate_jax` lowers and compiles ``fn`` for the given arguments (arrays or
``jax.ShapeDtypeStruct``, so nothing needs to be allocated) and reads
``Compiled.memory_analysis()``: the bytes of the arguments, outputs, donated aliases, XLA's
temporaries and the generated code, and, where the backend reports it, the peak. XLA documents
these as a lower bound of what the executable needs.

The device-level prediction adds what the process holds besides the executable's buffers: the
CUDA context and JAX's preallocation policy, read from the allocator settings
(``XLA_PYTHON_CLIENT_PREALLOCATE``, ``XLA_PYTHON_CLIENT_MEM_FRACTION`` /
``XLA_CLIENT_MEM_FRACTION``, ``XLA_PYTHON_CLIENT_ALLOCATOR``). By default JAX reserves 75% of
the GPU's memory at its first operation, so that is what ``nvidia-smi`` shows whatever the step
needs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from memfit._checks import require, require_choice, require_mapping, require_positive_int
from memfit._plain import plain_fields
from memfit.errors import BackendUnavailable, ConfigError, EstimateError, MemfitError
from memfit.estimate._devices import Collectives, collectives, split_gpu
from memfit.estimate.affine import AffineFit, check_batch_sizes, fit_affine
from memfit.estimate.xla.several import other_devices_term, several_devices_notes
from memfit.estimate.xla.tree_bytes import env_state_bytes, tree_nbytes

__all__ = [
    "COMPILERS",
    "JaxEstimate",
    "JaxPreallocation",
    "JaxSweep",
    "env_state_bytes",
    "estimate_jax",
    "estimate_jax_sweep",
    "preallocation_from_env",
    "tree_nbytes",
]


@dataclass(frozen=True)
class JaxPreallocation:
    """How JAX's GPU client takes memory, from its environment variables.

    Attributes:
        preallocate: Whether the client reserves ``fraction`` of the GPU at start.
        fraction: Fraction of total memory the client may use (and preallocates).
        platform_allocator: ``XLA_PYTHON_CLIENT_ALLOCATOR=platform``: exact allocations.
    """

    preallocate: bool
    fraction: float
    platform_allocator: bool


def preallocation_from_env(environ: Mapping[str, str] | None = None) -> JaxPreallocation:
    """Read JAX's allocator settings from ``environ`` (default: ``os.environ``).

    The reading is :func:`memfit.allocator.settings.read_jax_env`, the same one
    ``memfit env`` and ``memfit.configure`` use: as ``jaxlib`` reads them, only ``false``,
    ``False`` and ``0`` turn preallocation off.

    Raises:
        ConfigError: Where JAX would refuse to start its GPU backend (a fraction outside
            (0, 1], both fraction variables set, an unknown allocator).

    >>> preallocation_from_env({})
    JaxPreallocation(preallocate=True, fraction=0.75, platform_allocator=False)
    >>> preallocation_from_env({"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}).preallocate
    False
    """
    from memfit.allocator.settings import read_jax_env

    policy = read_jax_env(os.environ if environ is None else environ)
    return JaxPreallocation(policy.preallocate, policy.fraction, policy.platform_allocator)


@dataclass(frozen=True)
class JaxEstimate:
    """XLA's memory analysis of one compiled step (bytes).

    Attributes:
        argument_bytes: Input buffers.
        output_bytes: Output buffers.
        alias_bytes: Outputs that reuse (donated) input buffers.
        temp_bytes: XLA's temporaries (activations, intermediates).
        generated_code_bytes: The compiled code.
        peak_bytes: XLA's own peak, where the backend reports it, else ``None``.
        executable_peak_bytes: The larger of ``peak_bytes`` and
            ``argument + output - alias + temp`` (on GPU the temporaries are one buffer
            allocated for the whole call, and some backends leave them out of their peak).
        device_used_bytes: What the process would hold on the GPU (preallocation policy and
            context included), or ``None`` when the GPU's size is needed and unknown.
        backend: The backend that compiled it (``"cpu"``, ``"gpu"``, ``"tpu"``).
        batch_size: The batch size, when this is one point of a sweep.
        notes: How ``device_used_bytes`` was reached, and known deviations.
        compiled_for: What XLA compiled for: ``"cuda sm_89 (NVIDIA GeForce RTX 4070)"``
            (XLA's GPU compiler for that card, on this machine or deviceless) or ``"cpu"``.
        peak_bytes_in_use: What ``memory_stats()["peak_bytes_in_use"]`` would show on the
            card (the step's buffers or the first call's autotuning, whichever is larger, and
            the allocator's rounding), or ``None`` when the step was not compiled for a GPU.
        fits: ``False`` when XLA's GPU compiler could not get the step under its memory
            limit (its rematerialization verdict), ``True`` when it could, ``None`` when not
            compiled for a GPU.
        xla_memory_limit_bytes: The limit XLA's scheduler worked under, where XLA said it.
        xla_reduced_to_bytes: What XLA's rematerialization got the step down to, when it
            could not reach the limit.
        breakdown: The terms of ``peak_bytes_in_use`` and ``device_used_bytes``:
            ``(name, bytes, source)``.
        first_call_bytes: What the first call's GEMM autotuning holds at once besides the
            arrays already in use (:func:`memfit.estimate.xla.runtime.autotune_bytes`), or
            ``None`` when the step was not compiled for a GPU; a program of several steps
            (:mod:`memfit.estimate.xla.program`) adds it to what its other arrays hold.
        program: ``"conv"`` when XLA compiled cuDNN convolutions for the GPU, ``"sort"``
            when a sort's CUB scratch was sized without the device, else ``None``: the
            program class whose band :meth:`band` takes (:mod:`memfit.core.bands`).
        alternatives: ``(figure, if Triton wins, if cuBLAS wins)`` for each figure the
            first call's autotuner moves by its choice, timed on the card, between Triton
            and cuBLAS for the step's GEMM fusions: the figure if every tunable fusion stays
            Triton, and if cuBLAS wins every one (the figure itself: under-prediction is the
            dangerous error); ``()`` when the program has no such choice (no GEMM fusion,
            Triton's GEMMs or autotuning off) or the choice moves nothing.
        alternatives_family: The family of the band around :attr:`alternatives`
            (``compiled/alternatives/<family>``, :data:`memfit.core.bands.ALTERNATIVES`):
            ``"small_tuning"`` when the first call's tuning of GEMMs whose operands are all
            below cuBLAS's workspace sets ``peak_bytes_in_use`` (where the autotuner's
            buffers, placed whole by the allocator, are the figure), else ``"other"``;
            ``None`` when the step was not compiled by XLA's GPU compiler.
    """

    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    generated_code_bytes: int
    peak_bytes: int | None
    executable_peak_bytes: int
    device_used_bytes: int | None
    backend: str
    batch_size: int | None = None
    notes: tuple[str, ...] = ()
    compiled_for: str = "cpu"
    peak_bytes_in_use: int | None = None
    fits: bool | None = None
    xla_memory_limit_bytes: int | None = None
    xla_reduced_to_bytes: int | None = None
    breakdown: tuple[tuple[str, int, str], ...] = ()
    first_call_bytes: int | None = None
    #: gpu="8xH100": what the other cards add to ``device_used_bytes`` (NCCL's communicators)
    collectives: Collectives | None = None
    program: str | None = None
    #: how the CUDA context in ``device_used_bytes`` was sized: the basis of a JAX process's
    #: context (:func:`memfit.hardware.runtime.cuda_context` with ``framework="jax"``)
    context_basis: str = "assumed"
    alternatives: tuple[tuple[str, int, int], ...] = ()
    alternatives_family: str | None = None

    #: The figures :meth:`band` knows.
    FIGURES = (
        "argument_bytes", "output_bytes", "temp_bytes", "executable_peak_bytes",
        "peak_bytes_in_use", "device_used_bytes",
    )  # fmt: skip

    def band(self, name: str) -> tuple[int, int]:
        """``(low, high)`` bytes around one figure (``"peak_bytes_in_use"``, ...): how far
        XLA's compiled figures have been off on the project's GPU truth
        (:mod:`memfit.core.bands`, basis ``compiled``; a program that XLA compiled with
        cuDNN convolutions or a CUB sort, whose scratch the library sizes on the device,
        takes its class's band: ``compiled/conv``, ``compiled/sort``); the CUDA context in
        ``device_used_bytes`` takes the context's own band. A step compiled by XLA's GPU
        compiler knows its program's :attr:`alternatives`: its band runs from the residual
        band (``compiled/alternatives/<family>``: how far the card has been from the nearer
        alternative) below the figure if Triton wins every GEMM fusion to above the figure if
        cuBLAS wins them; without a choice the two are the figure.

        Raises:
            ConfigError: When ``name`` is not one of :attr:`FIGURES` or this estimate has no
                such figure (``peak_bytes_in_use`` without a GPU compile).
        """
        from memfit.core.bands import figure_band

        if name not in self.FIGURES:
            raise ConfigError(
                f"name must be one of {', '.join(self.FIGURES)}, not {name!r}", key_path="name"
            )
        value = getattr(self, name)
        if value is None:
            raise ConfigError(f"this estimate has no {name}", key_path="name")
        context = 0
        if name == "device_used_bytes":
            context = sum(b for t, b, _ in self.breakdown if t == "CUDA context")
        # the context's band follows its basis: a JAX process's kernel images are fitted
        # only where readings of a JAX step exist (memfit.hardware.runtime.cuda_context)
        if self.program is not None or self.alternatives_family is None:
            return figure_band(
                int(value), "compiled", context, family=self.program,
                context_basis=self.context_basis,
            )  # fmt: skip
        # a GPU compile knows its program's alternatives: the residual band around both
        ends = {n: (lo, hi) for n, lo, hi in self.alternatives}.get(name, (value, value))
        return figure_band(
            int(value), "compiled", context, family=f"alternatives/{self.alternatives_family}",
            context_basis=self.context_basis, alternatives=(int(ends[0]), int(ends[1])),
        )  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """The estimate as plain data."""
        return {
            "framework": "jax",
            **plain_fields(
                self,
                notes=list(self.notes),
                breakdown=[list(t) for t in self.breakdown],
                collectives=None if self.collectives is None else self.collectives.to_dict(),
                alternatives=[list(t) for t in self.alternatives],
            ),
        }


@dataclass(frozen=True)
class JaxSweep:
    """:func:`estimate_jax` at several batch sizes, with the affine fit of the peak.

    Attributes:
        points: One :class:`JaxEstimate` per batch size.
        fit: Affine fit of ``executable_peak_bytes`` over the batch sizes, or ``None``.
        batch_knob: The knob the batch size stands for.
    """

    points: list[JaxEstimate]
    fit: AffineFit | None
    batch_knob: str = "batch_size"

    def to_dict(self) -> dict[str, Any]:
        """The sweep as plain data."""
        return {
            "framework": "jax",
            "batch_knob": self.batch_knob,
            "points": [p.to_dict() for p in self.points],
            "fit": None if self.fit is None else self.fit.to_dict(),
        }


def _stat(stats: Any, name: str) -> int | None:
    value = getattr(stats, name, None)
    if value is None:
        return None
    return int(value)


def _jax_context(spec: Any) -> tuple[int, str]:
    """The CUDA context of a JAX process on ``spec`` and its basis."""
    from memfit.hardware.runtime import cuda_context

    estimate = cuda_context(spec, framework="jax")
    return estimate.bytes, estimate.basis


def _device_used(
    executable_peak: int, backend: str, gpu: str | None, environ: Mapping[str, str] | None
) -> tuple[int | None, list[str], str]:
    notes: list[str] = []
    if backend not in ("gpu", "cuda", "rocm") and gpu is None:
        notes.append(
            f"compiled on {backend}; name a GPU (gpu=...) for a device-level prediction "
            "(CUDA context and JAX preallocation)"
        )
        return None, notes, "assumed"
    from memfit.hardware.catalog import gpu as lookup_gpu

    spec = lookup_gpu(gpu) if gpu is not None else None
    context, basis = _jax_context(spec)
    notes.append(
        "not counted: the first run's autotuning, which allocates each candidate's buffers "
        "through the same allocator with 8 MiB guard zones on both sides "
        "(xla_gpu_redzone_padding_bytes) and scratch (about 141 MiB above the analysis was "
        "measured on an H100; XLA_FLAGS=--xla_gpu_autotune_level=0 turns it off)"
    )
    policy = preallocation_from_env(environ)
    if policy.platform_allocator or not policy.preallocate:
        notes.append("allocation on demand: the executable's peak plus the CUDA context")
        return executable_peak + context, notes, basis
    if spec is None:
        notes.append("JAX preallocates a fraction of the GPU; its size is unknown (pass gpu=...)")
        return None, notes, basis
    pool = int(spec.total_bytes * policy.fraction)
    notes.append(
        f"JAX preallocates {policy.fraction:.0%} of the GPU at start "
        "(XLA_PYTHON_CLIENT_PREALLOCATE=false allocates on demand)"
    )
    if executable_peak > pool:
        notes.append("the step needs more than the preallocated pool: it would run out of memory")
    return max(pool, executable_peak) + context, notes, basis


#: The ways :func:`estimate_jax` may compile (``compiler=``).
COMPILERS: tuple[str, ...] = ("auto", "gpu", "cpu")


def _compiled_for_here(jax: Any, backend: str) -> str:
    """What this process's own backend compiles for: ``"cuda sm_89 (NVIDIA ...)"`` on a GPU."""
    if backend not in ("gpu", "cuda"):
        return backend
    device = jax.devices()[0]
    cc = str(getattr(device, "compute_capability", "") or "").replace(".", "")
    return f"cuda sm_{cc} ({device.device_kind})" if cc else f"cuda ({device.device_kind})"


def _gpu_target(gpu: str | None, compiler: str) -> tuple[Any, Any, list[str]]:
    """The catalog card, its XLA target config (or ``None``: compile on this process's
    backend) and notes saying why not."""
    require_choice("compiler", compiler, COMPILERS)
    if gpu is None:
        if compiler == "gpu":
            raise ConfigError(
                "compiler='gpu' needs a card to compile for",
                key_path="gpu",
                hint="name it: gpu='RTX 4070' (see `memfit gpus`)",
            )
        return None, None, []
    from memfit.hardware.catalog import gpu as lookup_gpu

    spec = lookup_gpu(gpu)
    if compiler == "cpu":
        return spec, None, []
    from memfit.estimate.xla.gpu import EXTRA_INSTALL, gpu_target_missing
    from memfit.hardware.xla_target import target_config

    try:
        target = target_config(spec)
    except ConfigError:
        if compiler == "gpu":
            raise
        return (
            spec,
            None,
            [
                f"compiled with this process's XLA backend: {spec.name} has no XLA target config "
                "(a GPU given by its size has no compute capability or SM count)"
            ],
        )
    missing = gpu_target_missing()
    if missing:
        if compiler == "gpu":
            raise BackendUnavailable(
                "XLA's GPU compiler is not available here: " + "; ".join(missing),
                hint=EXTRA_INSTALL,
            )
        return (
            spec,
            None,
            [
                f"compiled with this process's XLA backend, not XLA's GPU compiler for "
                f"{spec.name} ({'; '.join(missing)}): GPU fusions, layouts and rematerialization "
                f"toward the card's memory are not seen; {EXTRA_INSTALL} compiles for the card"
            ],
        )
    return spec, target, []


def _trace_error(jax: Any, exc: Exception) -> EstimateError:
    if isinstance(exc, jax.errors.JAXTypeError):
        return EstimateError(
            f"JAX could not trace the step: {exc}",
            hint="the step reads a traced value in Python; make it static or use lax.cond",
        )
    return EstimateError(
        f"JAX could not trace or compile the step: {exc}",
        hint="check the argument shapes and dtypes; values that decide control flow must "
        "be static (jax.jit static_argnums) since memfit passes shapes only",
    )


def _compile_here(fn: Callable[..., Any], args: Any, kwargs: Any) -> tuple[Any, str, str]:
    """Compile on this process's backend: ``(memory stats, backend, compiled_for)``."""
    import jax

    try:
        # An already-jitted function keeps its own options (donate_argnums, static args).
        jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
        compiled = jitted.lower(*args, **kwargs).compile()
    except (TypeError, ValueError, jax.errors.JAXTypeError) as exc:
        raise _trace_error(jax, exc) from exc
    backend = jax.default_backend()
    try:
        stats = compiled.memory_analysis()
    except NotImplementedError as exc:
        raise EstimateError(
            f"the {backend} backend has no compiled memory analysis",
            hint="run on a backend that has one (CPU and GPU do), or upgrade jaxlib",
        ) from exc
    if stats is None:
        raise EstimateError(
            f"the {backend} backend returned no compiled memory analysis",
            hint="run on a backend that has one (CPU and GPU do), or upgrade jaxlib",
        )
    return stats, backend, _compiled_for_here(jax, backend)


def _from_stats(
    stats: Any, backend: str, compiled_for: str, gpu: str | None,
    environ: Mapping[str, str] | None, batch_size: int | None, notes: list[str],
) -> JaxEstimate:  # fmt: skip
    argument = _stat(stats, "argument_size_in_bytes") or 0
    output = _stat(stats, "output_size_in_bytes") or 0
    alias = _stat(stats, "alias_size_in_bytes") or 0
    temp = _stat(stats, "temp_size_in_bytes") or 0
    code = _stat(stats, "generated_code_size_in_bytes") or 0
    peak = _stat(stats, "peak_memory_in_bytes")
    if peak is not None and peak <= 0:
        peak = None  # backends without the figure report zero
    summed = argument + output - alias + temp
    executable_peak = max(summed, peak or 0)
    device_used, more, context_basis = _device_used(executable_peak + code, backend, gpu, environ)
    return JaxEstimate(
        argument_bytes=argument,
        output_bytes=output,
        alias_bytes=alias,
        temp_bytes=temp,
        generated_code_bytes=code,
        peak_bytes=peak,
        executable_peak_bytes=executable_peak,
        device_used_bytes=device_used,
        backend=backend,
        batch_size=batch_size,
        notes=(
            "XLA's memory analysis is a lower bound (its documentation says so)",
            *notes,
            *more,
        ),
        compiled_for=compiled_for,
        context_basis=context_basis,
    )


def _leaf_sizes(tree: Any) -> list[int]:
    import jax
    import numpy as np

    sizes = []
    for leaf in jax.tree_util.tree_leaves(tree):
        shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
        if shape is not None and dtype is not None:
            sizes.append(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
    return sizes


def _from_gpu_compile(
    result: Any, spec: Any, target: Any, leaves: list[int],
    environ: Mapping[str, str] | None, batch_size: int | None, jaxlib: str | None = None,
) -> JaxEstimate:  # fmt: skip
    """The estimate of a step compiled by XLA's GPU compiler for ``target``, with the JAX
    runtime's terms (:mod:`memfit.estimate.xla.runtime`); ``jaxlib``: the target's version
    (``None``: the installed one), which decides how the first call autotunes."""
    from memfit.estimate.xla import runtime as rt
    from memfit.units import format_bytes

    env = os.environ if environ is None else environ
    policy = preallocation_from_env(environ)
    argument, output, alias = result.argument_bytes, result.output_bytes, result.alias_bytes
    # a host callback is a custom call on the card whose operands and results are device
    # buffers among XLA's temporaries; the step was compiled without them
    callbacks = getattr(result, "callbacks", None)
    held = callbacks.held_bytes if callbacks is not None else 0
    fallback = result.device_temp_bytes - result.temp_bytes
    # what the device compiles that the deviceless compile cannot size: CUB's sort scratch,
    # and the workspace of the cuDNN algorithm the first call's autotuning picks (the
    # deviceless compile keeps cuDNN's default algorithm, with none; counted at the largest
    # candidate's, since the fastest is picked by timing on the card)
    sorts = int(getattr(result, "sort_scratch_bytes", 0) or 0)
    tuned = rt.xla_flag(os.environ if environ is None else environ, "xla_gpu_autotune_level")
    conv_workspace = 0
    if tuned != "0":
        conv_workspace = min(
            max((g.workspace for g in result.gemm_buffers if g.kind == "cudnn"), default=0),
            rt.PICKER_WORKSPACE_LIMIT,
        )
    temp = result.device_temp_bytes + held + sorts + conv_workspace
    buffers = argument + output - alias + temp
    installed = _jaxlib_version()
    rules = rt.autotune_rules(jaxlib or installed, tuple(target.compute_capability), installed)
    # a pool the allocator grows region by region (preallocation off) hands a fresh region too
    # small to split out whole; JAX's preallocated pool is one region, split for every request
    # of a fresh process
    growing = not policy.preallocate and not policy.platform_allocator
    rules = replace(rules, whole_chunks=rules.whole_chunks and growing)
    autotune = rt.autotune_bytes(result.gemm_buffers, env, rules, leaves)
    # a GEMM fusion the autotuner hands to cuBLAS is tuned again as the cuBLAS call it became
    handed = rt.handed_to_cublas_bytes(getattr(result, "cublas_gemm_buffers", ()), env, rules,
                                       leaves)  # fmt: skip
    calls = [g for g in result.gemm_buffers if g.kind == "cublas"]
    autotune_name = rules.describe()
    autotune_if_triton = autotune  # every tunable GEMM fusion stays Triton
    if handed > autotune:
        autotune = handed
        calls = list(result.cublas_gemm_buffers)
        autotune_name += (
            "; the GEMM fusions handed to cuBLAS, tuned again as the cuBLAS calls they become"
        )
    if any(g.kind == "cudnn" for g in result.gemm_buffers):
        autotune_name += (
            "; each cuDNN convolution's operands and results guarded, the largest candidate's "
            "workspace guarded and a guarded reference copy (conv_algorithm_picker.cc)"
        )
    if rules.whole_chunks and calls:
        autotune_name += (
            "; its cuBLAS calls placed by the BFC allocator after the arguments, the reference "
            "output holding the call's workspace too"
        )
    # the arguments' own chunks while the first call tunes (a 5.2 MiB input takes a
    # whole 8 MiB region: measured on an H100, jaxlib 0.11.2, the conv:64 step)
    whole_arguments = rt.whole_chunk_bytes(leaves) if growing else 0
    tuning = argument + whole_arguments + autotune if autotune else 0
    whole, rounding, in_use = rt.step_in_use_bytes(leaves, buffers, temp, tuning, growing)
    context, context_basis = _jax_context(spec)
    # the same figures if every tunable GEMM fusion stays Triton (the autotuner's choice is
    # timed on the card): the Triton compile's temporaries, the fusions' own tuning
    temp_if_triton, buffers_if_triton = temp - fallback, buffers - fallback
    tuning_if_triton = argument + whole_arguments + autotune_if_triton if autotune_if_triton else 0
    in_use_if_triton = rt.step_in_use_bytes(
        leaves, buffers_if_triton, temp_if_triton, tuning_if_triton, growing
    )[2]
    bfc = "tsl/framework/bfc_allocator.cc"
    terms = [
        ("XLA buffers (arguments + outputs - donated + temporaries)",
         buffers - fallback - held - sorts - conv_workspace,
         f"XLA:GPU's memory analysis, compiled for {target.compiled_for}"),
        ("CUB radix sorts' scratch (alternate key and value buffers, digit histograms; the "
         "deviceless compile keeps XLA's own sort)", sorts,
         "xla/backends/gpu/transforms/sort_rewriter.cc (SortRewriter); CUB "
         "DispatchRadixSort (cub/device/dispatch/dispatch_radix_sort.cuh)"),
        ("cuDNN workspace of the convolution algorithm autotuning picks (the largest "
         "candidate's: an explicit-GEMM engine's unfolded input and output copy)",
         conv_workspace,
         "xla/backends/gpu/autotuner/cudnn.cc (ApplyConfigAndUpdateWorkspaceInOutputTuple: "
         "the algorithm's workspace becomes the call's scratch)"),
        ("host callbacks' operands and results (device buffers the host reads and writes), "
         "all counted as alive at once", held,
         "jax/_src/callback.py (emit_python_callback: a custom call on the device); the "
         "callbacks' shapes in the step's jaxpr"),
        ("GEMM fusions the autotuner may hand to cuBLAS: fused operands as buffers, workspace",
         fallback,
         "xla/service/gpu/autotuning/gemm_fusion_autotuner.cc (xla_gpu_cublas_fallback: the "
         "fusion inlined for the GEMM rewriter); the same step compiled with "
         "xla_gpu_enable_triton_gemm=false"),
        (autotune_name,
         max(0, tuning - buffers),
         "xla/service/gpu/autotuning/redzone_buffers.cc, gemm_fusion_autotuner.cc, "
         "gemm_algorithm_picker.cc (at the XLA commit the target's jaxlib pins); "
         "xla_gpu_redzone_padding_bytes; measured floors: KluvaDa/benchback-rl"),
        ("BFC rounding to 256 B", rounding, bfc + " (kMinAllocationSize)"),
        ("BFC chunks handed out whole (allocation on demand: a fresh region under twice "
         "the request, less than 128 MiB left over)",
         max(0, buffers + whole - max(buffers, tuning)),
         bfc + " (Extend, SplitChunk); measured: an H100, jaxlib 0.11.2 (xla_floor_probe)"),
    ]  # fmt: skip
    notes = [
        "XLA's memory analysis is a lower bound (its documentation says so)",
        f"compiled by XLA's GPU compiler for {target.compiled_for} on this machine, "
        f"without the card (compile-only devices), with jaxlib {_jaxlib_version()}'s XLA: a "
        "GPU running another jaxlib may fuse and buffer the step differently (published "
        "peaks of jaxlib 0.7.2 runs are compared in docs/benchmarks.md)",
    ]
    if callbacks is not None:
        notes.append(
            f"{callbacks.describe()} in the step: compiled as what they hold on the card, "
            f"{format_bytes(callbacks.operand_bytes)} of operands and "
            f"{format_bytes(callbacks.result_bytes)} of results added to XLA's temporaries "
            "(JAX cannot lower a host callback for CUDA without a GPU backend; the program "
            "was compiled with them taken out, results as zeros of their shapes)"
        )
    if result.cublas_temp_bytes is not None:
        notes.append(
            "XLA's autotuner picks Triton or cuBLAS for each GEMM on the device; the larger "
            f"temporaries of the two compiles are counted ({format_bytes(result.temp_bytes)} "
            f"with Triton's default tilings, {format_bytes(result.cublas_temp_bytes)} with "
            "cuBLAS)"
        )
    if jaxlib is not None and jaxlib != installed:
        notes.append(
            f"the first call's autotuning follows jaxlib {jaxlib}'s XLA, as the target runs "
            f"it; the buffers are jaxlib {installed}'s compile"
        )
    if rules.overlap:
        notes.append(
            f"jaxlib {rules.jaxlib}'s autotuner may hold the last GEMM's guarded buffers while "
            "it allocates the next one's (one autotuner per module; parallel nested compiles "
            "on Ampere and later): counted as the published jax 0.5 floors show it, the next "
            "GEMM's operands and result with the last GEMM's five buffers (the next one's "
            "workspace too would add one more guarded buffer, 16 MiB)"
        )
    limit = int(target.device_memory_size * policy.fraction)
    if policy.platform_allocator:
        device_used = context + in_use
        used_if_triton = context + in_use_if_triton
        terms.append(("the platform allocator: exact allocations, freed", in_use, bfc))
        notes.append("XLA_PYTHON_CLIENT_ALLOCATOR=platform: allocations are exact and freed")
    elif policy.preallocate:
        pool = max(limit, in_use)
        device_used = context + pool
        used_if_triton = context + max(limit, in_use_if_triton)
        terms.append((f"JAX's pool: {policy.fraction:.0%} of the memory CUDA reports", pool,
                      "xla/pjrt/gpu/gpu_helpers.cc (CreateBFCAllocator)"))  # fmt: skip
        notes.append(
            f"JAX preallocates {policy.fraction:.0%} of the GPU at start "
            "(XLA_PYTHON_CLIENT_PREALLOCATE=false allocates on demand)"
        )
    else:
        grown = rt.bfc_growth_bytes([*leaves, max(autotune, output - alias + temp)], limit)
        device_used = context + grown
        used_if_triton = context + rt.bfc_growth_bytes(
            [*leaves, max(autotune_if_triton, output - alias + temp_if_triton)], limit
        )
        terms.append(("BFC regions grown on demand (2 MiB, each next twice the last)", grown,
                      bfc + " (Extend)"))  # fmt: skip
        notes.append("allocation on demand: the BFC allocator grows in doubling regions")
    if not policy.platform_allocator:
        notes.append(
            "peak_bytes_in_use is this step's in a fresh process; in a Python loop of several "
            "jitted calls the allocator hands a chunk freed earlier, under twice a later "
            "request, out whole, and the peak drifts up over iterations: replay the loop with "
            "memfit.estimate.xla.program (published PPO loops: up to 32% above one call)"
        )
    terms.append(("CUDA context", context, "memfit.hardware.runtime.cuda_context"))
    fits: bool | None = True
    limit_bytes = reduced = None
    if result.remat is not None:
        fits = False
        limit_bytes, reduced = result.remat.limit_bytes, result.remat.reduced_to_bytes
        notes.append(result.remat.sentence())
    if not policy.platform_allocator and in_use > limit:
        fits = False
        notes.append(
            f"does not fit: the step needs {format_bytes(in_use)} in JAX's allocator, which "
            f"may use {format_bytes(limit)} of {spec.name}"
        )
    if target.device_memory_source == "estimated":
        notes.append(
            f"{spec.name}'s memory as CUDA reports it is estimated from nvidia-smi's total "
            "(no published figure)"
        )
    if target.note:
        notes.append(target.note)
    notes.extend(result.warnings)
    if result.devices > 1:
        terms.append(other_devices_term(result.devices, buffers + rounding, in_use))
        notes.extend(several_devices_notes(result))
    convolutions = any(g.kind == "cudnn" for g in result.gemm_buffers)
    sort = any(w.startswith("a sort was compiled without CUB") for w in result.warnings)
    if convolutions:
        notes.append(
            "cuDNN convolutions: the first call tries each cuDNN algorithm with its own "
            "workspace, up to 4 GiB (xla_gpu_redzone_scratch_max_megabytes; a candidate that "
            "cannot allocate its workspace is skipped, so the tuning takes what is free: the "
            "figure is what it takes on a card with room); counted with the largest "
            "candidate's workspace bounded by an "
            "explicit-GEMM engine's (memfit.estimate.xla.runtime.conv_workspace_bytes; on an "
            "H100 a 64x3x84x84 convolution's weight gradient tuned with 720 MiB above its "
            "arguments); XLA_FLAGS=--xla_gpu_autotune_level=0 keeps cuDNN's default "
            "algorithm and tunes nothing"
        )
    if result.devices > 1:
        notes.append(
            "not counted: on several GPUs, arrays the program leaves on JAX's default device "
            "(device 0) and NCCL's own buffers"
        )
    if result.devices > 1:  # the other cards' term follows the figures it was built from
        used_if_triton = device_used
    moved = (
        ("temp_bytes", temp_if_triton, temp),
        ("executable_peak_bytes", buffers_if_triton, buffers),
        ("peak_bytes_in_use", in_use_if_triton, in_use),
        ("device_used_bytes", used_if_triton, device_used),
    )
    alternatives = tuple((n, lo, hi) for n, lo, hi in moved if lo != hi)
    if in_use_if_triton != in_use:
        notes.append(
            "the autotuner's choice between Triton and cuBLAS for the GEMM fusions, timed on the "
            f"card, moves peak_bytes_in_use: {format_bytes(in_use_if_triton)} if Triton wins "
            f"every one, {format_bytes(in_use)} if cuBLAS does (the figure; band() spans both)"
        )
    gemms = (*result.gemm_buffers, *getattr(result, "cublas_gemm_buffers", ()))
    family = rt.tuning_family(gemms, rules.hopper, tuning_sets_peak=tuning > buffers + whole)
    return JaxEstimate(
        argument_bytes=argument,
        output_bytes=output,
        alias_bytes=alias,
        temp_bytes=temp,
        generated_code_bytes=result.generated_code_bytes,
        peak_bytes=None,
        executable_peak_bytes=buffers,
        device_used_bytes=device_used,
        backend="cuda",
        batch_size=batch_size,
        notes=tuple(notes),
        compiled_for=result.compiled_for,
        peak_bytes_in_use=in_use,
        fits=fits,
        xla_memory_limit_bytes=limit_bytes,
        xla_reduced_to_bytes=reduced,
        breakdown=tuple((name, int(n), src) for name, n, src in terms),
        first_call_bytes=autotune,
        program="conv" if convolutions else ("sort" if sort else None),
        context_basis=context_basis,
        alternatives=alternatives,
        alternatives_family=family,
    )


def _target_jaxlib(jaxlib: str | None) -> str | None:
    """The jaxlib the GPU runs: the one given, else the installed one (``None``: neither)."""
    installed = _jaxlib_version()
    return jaxlib or (None if installed == "?" else installed)


def _jaxlib_version() -> str:
    """This machine's jaxlib, ``"?"`` where it has none."""
    from memfit.backends.software import installed_jaxlib

    return installed_jaxlib() or "?"


def _memory_base(target: Any, environ: Mapping[str, str] | None) -> int | None:
    """The memory JAX hands XLA's compiler on the card: its allocator's ``bytes_limit``
    (jaxlib's ``py_client.cc`` passes it as ``device_memory_size``); ``None`` for the
    platform allocator, which has none (XLA then takes 80% of the card's memory)."""
    policy = preallocation_from_env(environ)
    if policy.platform_allocator:
        return None
    return int(target.device_memory_size * policy.fraction)


def estimate_jax(
    fn: Callable[..., Any],
    *args: Any,
    gpu: str | None = None,
    environ: Mapping[str, str] | None = None,
    batch_size: int | None = None,
    compiler: str = "auto",
    jaxlib: str | None = None,
    devices: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> JaxEstimate:
    """Compile ``fn`` for ``args`` and read XLA's memory analysis, without running it.

    With ``gpu`` naming a catalog card and the ``gpu-target`` extra installed
    (``pip install "memfit[gpu-target]"``), the step is compiled by XLA's GPU compiler for
    that card (in a child process, without the card) and the estimate adds what JAX's
    runtime holds on it (:attr:`JaxEstimate.peak_bytes_in_use`, the breakdown). Otherwise
    it is compiled on this process's backend, as the notes say.

    Args:
        fn: The step (jitted or not).
        *args: Its arguments: arrays, pytrees, or ``jax.ShapeDtypeStruct``. Arguments sharded
            over a mesh of several devices (a ``NamedSharding`` on a ``jax.sharding.Mesh`` or
            ``AbstractMesh``) are compiled, with the GPU compiler, for that many devices:
            every figure is then per device (device 0's, which also holds the autotuning).
        gpu: GPU name or size for the device-level prediction (context, preallocation).
            With a count (``"8xH100"``) the step is one device's of a job on that many cards
            (``pmap`` by default): ``device_used_bytes`` adds the collective terms every
            device holds (NCCL's communicators: one per device group, two for jaxlib before
            0.4.30), in the breakdown with their basis and in :attr:`JaxEstimate.collectives`.
        environ: Environment to read JAX's allocator settings from (default ``os.environ``).
        batch_size: Recorded in the result, for sweeps.
        compiler: ``"auto"`` (XLA's GPU compiler for ``gpu`` where it can), ``"gpu"``
            (only that, or an error) or ``"cpu"`` (this process's backend).
        jaxlib: The jaxlib version the GPU runs (``"0.4.33"``), when it is not the one
            installed here: the first call's GEMM autotuning, most of a small program's
            ``peak_bytes_in_use``, follows that version's XLA
            (:func:`memfit.estimate.xla.runtime.autotune_rules`); the compile stays this
            jaxlib's. ``None``: the installed one.
        devices: With a count in ``gpu``: a workload's ``devices:`` keys (``topology``,
            ``nccl``, ``nccl_env``, ``communicators``, ...).
        **kwargs: Keyword arguments of ``fn`` (``gpu``, ``environ``, ``batch_size``,
            ``compiler``, ``jaxlib`` and ``devices`` are taken by this function).

    Returns:
        A :class:`JaxEstimate`.

    Raises:
        EstimateError: When ``fn`` cannot be traced or compiled for these arguments, or the
            backend has no memory analysis.
        ConfigError: When the GPU name, the compiler or an allocator setting is invalid.
        BackendUnavailable: For ``compiler="gpu"`` without the ``gpu-target`` extra.
    """
    require("fn", fn, "callable")
    require("gpu", gpu, "str", optional=True)
    require_mapping("environ", environ, values="str", optional=True)
    require("batch_size", batch_size, "int", optional=True)
    if batch_size is not None:
        require_positive_int("batch_size", batch_size, hint="the batch the step runs, e.g. 64")
    require("compiler", compiler, "str")
    _check_jaxlib(jaxlib)
    several = collectives(gpu, framework="jax", devices=devices, jaxlib=_target_jaxlib(jaxlib))
    est = _estimate_one(fn, args, kwargs, split_gpu(gpu)[0], environ, batch_size, compiler, jaxlib)
    return est if several is None else _with_collectives(est, several)


def _with_collectives(est: JaxEstimate, several: Collectives) -> JaxEstimate:
    """``est`` as one device's of ``several.count``: the collective terms every device holds
    added to ``device_used_bytes`` and its breakdown, with their basis."""
    every = [t for t in several.terms if not t.device0_only]
    used = est.device_used_bytes
    more = several.every_device_bytes
    return replace(
        est,
        device_used_bytes=None if used is None else used + more,
        alternatives=tuple(
            (n, lo + more, hi + more) if n == "device_used_bytes" else (n, lo, hi)
            for n, lo, hi in est.alternatives
        ),
        breakdown=(
            *est.breakdown,
            *((t.name, t.bytes, f"{t.basis}: {t.detail}") for t in every),
        ),
        notes=(*est.notes, *several.notes()),
        collectives=several,
    )


def _estimate_one(
    fn: Callable[..., Any],
    args: Any,
    kwargs: Any,
    gpu: str | None,
    environ: Mapping[str, str] | None,
    batch_size: int | None,
    compiler: str,
    jaxlib: str | None,
) -> JaxEstimate:
    """:func:`estimate_jax` on one card."""
    from memfit.estimate.xla._pmap import unpmap

    spec, target, notes = _gpu_target(gpu, compiler)
    fn, args, kwargs, pmap_note = unpmap(fn, args, kwargs, sharded=target is not None)
    if target is None:
        stats, backend, compiled_for = _compile_here(fn, args, kwargs)
        return _from_stats(
            stats, backend, compiled_for, gpu, environ, batch_size, notes + pmap_note
        )
    from memfit.estimate.xla.gpu import compile_exported, cpu_fallback_note, export_or_fall_back

    step = export_or_fall_back(fn, args, kwargs, compiler, spec.name)
    if step is None:
        stats, backend, compiled_for = _compile_here(fn, args, kwargs)
        notes = [*notes, *pmap_note, cpu_fallback_note(spec.name)]
        return _from_stats(stats, backend, compiled_for, gpu, environ, batch_size, notes)
    (result,) = compile_exported(
        [step], target, memory_base_bytes=_memory_base(target, environ), environ=environ
    )
    leaves = _leaf_sizes((args, kwargs))
    est = _from_gpu_compile(result, spec, target, leaves, environ, batch_size, jaxlib)
    return replace(est, notes=(*pmap_note, *est.notes)) if pmap_note else est


def _check_jaxlib(jaxlib: str | None) -> None:
    """``jaxlib`` is ``None`` or a version (``"0.4.33"``), else a :class:`ConfigError`."""
    from memfit.estimate.xla.runtime import parse_jaxlib_version

    require("jaxlib", jaxlib, "str", optional=True)
    if jaxlib is not None and parse_jaxlib_version(jaxlib) is None:
        shown = repr(jaxlib) if len(jaxlib) <= 40 else f"{jaxlib[:30]!r}... ({len(jaxlib)} chars)"
        raise ConfigError(
            f"jaxlib={shown} is not a version",
            key_path="jaxlib",
            hint="the jaxlib version the GPU runs, e.g. jaxlib='0.4.33' (jax.__version__ there)",
        )


def _call_make_args(
    make_args: Callable[[int], tuple[Any, ...]], batch_size: int
) -> tuple[Any, ...]:
    """``make_args(batch_size)`` as a tuple; the user's failure as an :class:`EstimateError`."""
    try:
        args = make_args(batch_size)
    except MemfitError:
        raise
    except Exception as exc:
        raise EstimateError(
            f"make_args({batch_size}) failed: {type(exc).__name__}: {exc}",
            hint="make_args(batch_size) returns the step's arguments; rerun with --debug for "
            "the traceback",
        ) from exc
    if not isinstance(args, (tuple, list)):
        raise EstimateError(
            f"make_args({batch_size}) returned {type(args).__name__}, not a tuple of arguments",
            hint="return a tuple, e.g. (params, jax.ShapeDtypeStruct((batch_size, 64), "
            "jnp.float32))",
        )
    return tuple(args)


def estimate_jax_sweep(
    fn: Callable[..., Any],
    make_args: Callable[[int], tuple[Any, ...]],
    batch_sizes: Sequence[int],
    *,
    gpu: str | None = None,
    environ: Mapping[str, str] | None = None,
    batch_knob: str = "batch_size",
    progress: Callable[[str], None] | None = None,
    compiler: str = "auto",
    jaxlib: str | None = None,
    devices: Mapping[str, Any] | None = None,
) -> JaxSweep:
    """:func:`estimate_jax` at each batch size (``fn(*make_args(b))``) and the affine fit;
    ``progress`` (a status line's updater) hears each batch size as its compile starts.
    Compiled for a GPU, every batch size goes to one child process. ``gpu`` and ``devices``
    as :func:`estimate_jax` takes them (``"8xH100"``: each point adds the collective terms).

    Raises:
        ConfigError: When ``batch_sizes`` is empty or holds a non-positive value.
        EstimateError: As :func:`estimate_jax`.
    """
    sizes = check_batch_sizes(batch_sizes)
    require("compiler", compiler, "str")
    _check_jaxlib(jaxlib)
    several = collectives(gpu, framework="jax", devices=devices, jaxlib=_target_jaxlib(jaxlib))
    gpu = split_gpu(gpu)[0]
    spec, target, _notes = _gpu_target(gpu, compiler)
    points = []
    exported, leaves, pmap_notes = [], [], []
    if target is not None:
        from memfit.estimate.xla._pmap import unpmap
        from memfit.estimate.xla.gpu import export_or_fall_back

        for b in sizes:
            args = _call_make_args(make_args, b)
            step, args, kwargs, pmap_note = unpmap(fn, args, {}, sharded=True)
            one = export_or_fall_back(step, args, kwargs, compiler, spec.name)
            if one is None:  # warned: every size on this process's backend
                compiler, target = "cpu", None
                break
            exported.append(one)
            leaves.append(_leaf_sizes((args, kwargs)))
            pmap_notes.append(tuple(pmap_note))
    if target is None:
        for index, b in enumerate(sizes, 1):
            if progress is not None:
                progress(f"compiling {batch_knob}={b} ({index} of {len(sizes)})")
            points.append(
                estimate_jax(
                    fn, *_call_make_args(make_args, b), gpu=gpu, environ=environ,
                    batch_size=b, compiler=compiler, jaxlib=jaxlib,
                )
            )  # fmt: skip
    else:
        from memfit.estimate.xla.gpu import compile_exported

        if progress is not None:
            progress(f"compiling {len(sizes)} sizes for {target.compiled_for}")
        results = compile_exported(
            exported, target, memory_base_bytes=_memory_base(target, environ), environ=environ
        )
        for r, n, b, extra in zip(results, leaves, sizes, pmap_notes, strict=True):
            est = _from_gpu_compile(r, spec, target, n, environ, b, jaxlib)
            points.append(replace(est, notes=(*extra, *est.notes)))
    if several is not None:
        points = [_with_collectives(p, several) for p in points]
    fit = fit_affine(sizes, [p.executable_peak_bytes for p in points])
    return JaxSweep(points=points, fit=fit, batch_knob=batch_knob)
