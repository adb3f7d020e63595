"""What a GPU leaves for the job: CUDA context, cuBLAS workspaces, other processes, margin.

This part holds the hardware constants: the memory a CUDA context takes before the job
allocates anything (:func:`cuda_context_bytes`) and the cuBLAS workspace PyTorch allocates
per handle and stream (:func:`cublas_workspace_bytes`). Both are estimates with their sources
given below; a figure measured on the user's machine (``memfit devices`` right after the
framework initialised CUDA) is better, and the planner prefers it where it has one.

>>> from memfit.core.catalog import gpu
>>> cublas_workspace_bytes(gpu("H100")) == 32 * 2**20
True
>>> cublas_workspace_bytes(gpu("4090")) == 8 * 2**20 + 128 * 2**10
True
>>> cuda_context_bytes(gpu("T4")) < cuda_context_bytes(gpu("H100"))
True
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from memfit.core.catalog import GpuSpec
from memfit.core.runtime import (
    ContextEstimate,
    Runtime,
    cuda_context,
    runtime_from_versions,
)
from memfit.errors import ConfigError
from memfit.units import KiB, format_bytes

__all__ = [
    "CUBLAS_DEFAULT_CONFIG",
    "CUBLAS_HOPPER_CONFIG",
    "CUBLAS_SOURCE",
    "DEFAULT_MARGIN",
    "JAX_DEFAULT_MEM_FRACTION",
    "XLA_FRACTION_CAP",
    "XLA_FRACTION_STEP",
    "Budget",
    "FractionAdvice",
    "compose_budget",
    "cublas_workspace_bytes",
    "cuda_context_bytes",
    "parse_cublas_workspace_config",
    "recommended_xla_fraction",
]

#: Where the cuBLAS figures come from.
CUBLAS_SOURCE = (
    "PyTorch's default CUBLAS_WORKSPACE_CONFIG ':4096:2:16:8' = 2 x 4 MiB + 8 x 16 KiB = "
    "8.125 MiB per cuBLAS handle and stream; ':4096:8' = 32 MiB on sm90 and newer (shared "
    "REFERENCE.md; cuBLAS docs on cublasSetWorkspace recommend 32 MiB for Hopper). The "
    "workspace comes from the caching allocator, so it counts as allocated."
)

#: PyTorch's default workspace configuration before Hopper.
CUBLAS_DEFAULT_CONFIG = ":4096:2:16:8"
#: PyTorch's default workspace configuration on sm90 and newer.
CUBLAS_HOPPER_CONFIG = ":4096:8"

_CUBLAS_CONFIG_RE = re.compile(r"^(?::\d+:\d+)+$")


def parse_cublas_workspace_config(config: str) -> int:
    """Bytes a ``CUBLAS_WORKSPACE_CONFIG`` value reserves per handle and stream.

    The value is a sequence of ``:SIZE_KIB:COUNT`` pairs; the workspace is the sum of
    ``SIZE_KIB * COUNT`` KiB.

    Raises:
        ConfigError: When the text is not of that form.

    >>> parse_cublas_workspace_config(":4096:2:16:8") == 8 * 2**20 + 128 * 2**10
    True
    >>> parse_cublas_workspace_config(":4096:8") == 32 * 2**20
    True
    """
    text = config.strip()
    if not _CUBLAS_CONFIG_RE.match(text):
        raise ConfigError(
            f"not a cuBLAS workspace configuration: {config!r}",
            key_path="CUBLAS_WORKSPACE_CONFIG",
            hint="write pairs of :SIZE_KIB:COUNT, such as :4096:8 or :4096:2:16:8",
        )
    numbers = [int(n) for n in text.strip(":").split(":")]
    return sum(size * count for size, count in zip(numbers[::2], numbers[1::2], strict=True)) * KiB


def _is_sm90_or_newer(spec: GpuSpec | None) -> bool | None:
    if spec is None:
        return None
    if spec.compute_capability is not None:
        return spec.compute_capability >= (9, 0)
    if spec.arch in ("hopper", "blackwell"):
        return True
    if spec.arch in ("pascal", "volta", "turing", "ampere", "ada"):
        return False
    return None


def cuda_context_bytes(
    spec: GpuSpec | None, *, lazy_loading: bool = True, runtime: Runtime | None = None
) -> int:
    """Estimated device memory a CUDA context takes before the job allocates anything.

    The figure comes from the one context model, :func:`memfit.core.runtime.cuda_context`,
    which names its sources.

    Args:
        spec: The GPU, or ``None`` when unknown.
        lazy_loading: ``False`` for eager module loading; ignored when ``runtime`` is given.
        runtime: The target's runtime (its versions decide the loading mode).

    Returns:
        Bytes, per process and device.

    >>> from memfit.core.runtime import EAGER_CONTEXT_BYTES, LAZY_CONTEXT_UNKNOWN_BYTES
    >>> cuda_context_bytes(None) == LAZY_CONTEXT_UNKNOWN_BYTES
    True
    >>> cuda_context_bytes(None, lazy_loading=False) == EAGER_CONTEXT_BYTES
    True
    """
    if runtime is None:
        runtime = runtime_from_versions(module_loading="lazy" if lazy_loading else "eager")
    return cuda_context(spec, runtime).bytes


def cublas_workspace_bytes(
    spec: GpuSpec | None, *, config: str | None = None, handles: int = 1
) -> int:
    """cuBLAS workspace PyTorch allocates per handle and stream (counted as allocated).

    Args:
        spec: The GPU, or ``None`` when unknown.
        config: The ``CUBLAS_WORKSPACE_CONFIG`` in force, if the user set one; it overrides
            the architecture's default.
        handles: Number of (handle, stream) pairs that run matmuls (one per stream used).

    Returns:
        Bytes: 8.125 MiB per handle before sm90, 32 MiB on sm90 and newer, and 32 MiB when
        the architecture is unknown (the larger figure, so a plan errs on the safe side).

    Raises:
        ConfigError: When ``config`` is malformed or ``handles`` is negative.

    >>> cublas_workspace_bytes(None) == 32 * 2**20
    True
    >>> cublas_workspace_bytes(None, config=":4096:2", handles=2) == 16 * 2**20
    True
    """
    if handles < 0:
        raise ConfigError(f"handles must be >= 0, not {handles}", key_path="handles")
    if spec is not None and spec.arch == "cpu":
        return 0  # no cuBLAS on the host
    if config is not None:
        per_handle = parse_cublas_workspace_config(config)
    else:
        newer = _is_sm90_or_newer(spec)
        chosen = CUBLAS_DEFAULT_CONFIG if newer is False else CUBLAS_HOPPER_CONFIG
        per_handle = parse_cublas_workspace_config(chosen)
    return per_handle * handles


# --------------------------------------------------------------------------------------------
# Budget composition: what the job may allocate on a GPU


#: Default safety margin, a fraction of the GPU's total memory.
DEFAULT_MARGIN = 0.05

#: JAX preallocates this fraction of the total GPU memory by default (shared REFERENCE.md).
JAX_DEFAULT_MEM_FRACTION = 0.75

#: memfit recommends XLA pool fractions in steps of this size.
XLA_FRACTION_STEP = 0.05

#: The largest XLA pool fraction memfit recommends: besides the CUDA context, cuDNN/cuBLAS
#: handles and XLA's autotuning scratch are allocated outside the pool (on an H100 the first
#: run's peak exceeded XLA's own analysis by about 141 MiB, shared REFERENCE.md).
XLA_FRACTION_CAP = 0.90


@dataclass(frozen=True)
class FractionAdvice:
    """memfit's one recommendation for ``XLA_PYTHON_CLIENT_MEM_FRACTION``, with its reason.

    Attributes:
        fraction: The fraction of the GPU's total memory for XLA's preallocated pool.
        reason: Why, in one sentence (shown by ``memfit plan``, ``memfit env`` and the
            examples alike).
    """

    fraction: float

    reason: str

    @property
    def value(self) -> str:
        """The fraction as the environment variable's text (``"0.90"``)."""
        return f"{self.fraction:.2f}"


def recommended_xla_fraction(
    spec: GpuSpec | None = None,
    *,
    margin: float = DEFAULT_MARGIN,
    other_processes_bytes: int = 0,
    context_bytes: int | None = None,
) -> FractionAdvice:
    """The XLA pool fraction memfit recommends for one JAX training job on ``spec``.

    The rule (the only place memfit decides this): the largest multiple of
    :data:`XLA_FRACTION_STEP`, at most :data:`XLA_FRACTION_CAP`, that leaves the CUDA
    context, the memory other processes use and the safety margin outside the pool, since
    those live outside XLA's allocator. With the default 5% margin that is 0.90 on every card
    of 8 GB or more, and 0.85 on a 4 GB card; an unknown GPU gets 0.90.

    Args:
        spec: The GPU, or ``None`` when unknown.
        margin: The safety margin, a fraction of the total.
        other_processes_bytes: Memory other processes already hold on the GPU.
        context_bytes: The job's CUDA context (``None``: :func:`cuda_context_bytes` of
            ``spec`` with lazy loading).

    Returns:
        The fraction and the reason.

    >>> from memfit.core.catalog import gpu
    >>> recommended_xla_fraction(gpu("RTX 4070")).value, recommended_xla_fraction(gpu("1650")).value
    ('0.90', '0.85')
    """
    cap_steps = round(XLA_FRACTION_CAP / XLA_FRACTION_STEP)
    context = cuda_context_bytes(spec) if context_bytes is None else context_bytes
    outside = f"the CUDA context ({format_bytes(context)}), other processes and the safety margin"
    if spec is None or spec.total_bytes <= 0:
        steps = cap_steps
        where = "on any card of 8 GB or more"
    else:
        room = spec.total_bytes * (1 - margin) - context - other_processes_bytes
        steps = min(cap_steps, math.floor(round(room / spec.total_bytes / XLA_FRACTION_STEP, 9)))
        steps = max(steps, 1)
        where = f"on {spec.name}"
    fraction = steps * XLA_FRACTION_STEP
    reason = (
        f"one JAX job owns the GPU: preallocate {fraction:.0%} of it {where} instead of JAX's "
        f"default 75%, leaving {outside} outside XLA's pool (they are not allocated from it); "
        f"memfit plans the job to fit inside that pool"
    )
    return FractionAdvice(round(fraction, 2), reason)


@dataclass(frozen=True)
class Budget:
    """What a GPU leaves for one job, term by term (bytes).

    ``budget_bytes = total_bytes - other_processes_bytes - margin_bytes`` is what the job's
    whole footprint (its CUDA context included) may reach. Inside it, ``job_limit_bytes`` is
    what the framework may allocate for the job's own buffers (parameters, rollout, replay,
    activations, allocator slack): the budget less the CUDA context and the cuBLAS workspace,
    or, when JAX preallocates, the preallocated pool less the workspace (the job must fit the
    pool, not the card).

    Attributes:
        total_bytes: The GPU's total memory as the driver reports it.
        other_processes_bytes: Memory other processes already use.
        margin_bytes: The safety margin.
        budget_bytes: What the job's footprint may reach.
        context_bytes: The job's CUDA context (0 when it already exists and is counted in
            ``other_processes_bytes``, or on the host).
        workspace_bytes: cuBLAS workspace (from the framework's allocator).
        pool_bytes: JAX's preallocated pool, or ``None`` when nothing is preallocated.
        job_limit_bytes: What the job's buffers may take (may be negative: nothing fits).
        breaking_term: When even an empty job does not fit, the term that breaks it
            (``"cuda_context"``, ``"jax_preallocation"``), else ``None``.
        pool_fraction: The pool's fraction of the total (``None`` without preallocation).
        outside_limit_bytes: With a pool, what memory outside the pool (a simulator in the
            same process) may take: the budget less the context and the pool; ``None``
            without a pool (then everything shares ``job_limit_bytes``).
        margin: The safety margin as the fraction of the total it was given as.
        advice: memfit's XLA fraction recommendation for this budget (with a pool), whether
            or not the pool uses it.
        context: How ``context_bytes`` was estimated (runtime, architecture, source);
            ``None`` when the caller gave the context.
    """

    total_bytes: int
    other_processes_bytes: int
    margin_bytes: int
    budget_bytes: int
    context_bytes: int
    workspace_bytes: int
    pool_bytes: int | None
    job_limit_bytes: int
    breaking_term: str | None
    pool_fraction: float | None = None
    outside_limit_bytes: int | None = None
    margin: float = DEFAULT_MARGIN
    advice: FractionAdvice | None = None
    context: ContextEstimate | None = None


def compose_budget(
    spec: GpuSpec,
    *,
    framework: str = "torch",
    margin: float = DEFAULT_MARGIN,
    other_processes_bytes: int = 0,
    jax_preallocate: bool = True,
    jax_mem_fraction: float | None = None,
    context_bytes: int | None = None,
    runtime: Runtime | None = None,
) -> Budget:
    """Compose the budget of a job on ``spec``.

    Args:
        spec: The GPU (``arch="cpu"`` for the host: no context, workspace or pool).
        framework: ``"torch"`` or ``"jax"``.
        margin: Safety margin as a fraction of the total, in ``[0, 1)``.
        other_processes_bytes: Memory other processes already hold on the GPU.
        jax_preallocate: Whether JAX preallocates its pool (``XLA_PYTHON_CLIENT_PREALLOCATE``).
        jax_mem_fraction: The pool's fraction of the total (``XLA_PYTHON_CLIENT_MEM_FRACTION``);
            ``None``: memfit's recommendation (:func:`recommended_xla_fraction`).
        context_bytes: The job's CUDA context; ``None``: the estimate for ``spec``
            (:func:`cuda_context_bytes`); ``0`` when the process already has its context
            and it is counted in ``other_processes_bytes`` (``memfit.autoconfig``).
        runtime: The target's software, which sizes the context when ``context_bytes`` is
            ``None`` (:func:`memfit.core.runtime.cuda_context`).

    Returns:
        The budget.

    Raises:
        ConfigError: When the margin is outside ``[0, 1)``, other processes' memory is
            negative, or the JAX fraction is outside ``(0, 1]``.

    >>> from memfit.core.catalog import anonymous_gpu
    >>> b = compose_budget(anonymous_gpu(8 * 2**30), framework="jax", margin=0.1,
    ...                    jax_mem_fraction=0.75)
    >>> b.pool_bytes == 6 * 2**30, b.job_limit_bytes == b.pool_bytes - b.workspace_bytes
    (True, True)
    """
    if not 0 <= margin < 1:
        raise ConfigError(f"margin must be in [0, 100%), not {margin!r}", key_path="margin")
    if other_processes_bytes < 0:
        raise ConfigError(
            f"other processes' memory cannot be negative: {other_processes_bytes}",
            key_path="other_processes_bytes",
        )
    if jax_mem_fraction is not None and not 0 < jax_mem_fraction <= 1:
        raise ConfigError(
            f"mem_fraction must be in (0, 1], not {jax_mem_fraction!r}",
            key_path="jax.mem_fraction",
        )
    if context_bytes is not None and context_bytes < 0:
        raise ConfigError(
            f"context bytes cannot be negative: {context_bytes}", key_path="context_bytes"
        )
    total = spec.total_bytes
    margin_bytes = int(total * margin)
    budget = total - other_processes_bytes - margin_bytes
    estimate = cuda_context(spec, runtime) if context_bytes is None else None
    context = estimate.bytes if estimate is not None else int(context_bytes or 0)
    workspace = cublas_workspace_bytes(spec)
    pool: int | None = None
    fraction: float | None = None
    outside: int | None = None
    breaking: str | None = None
    advice: FractionAdvice | None = None
    if framework == "jax" and jax_preallocate and spec.arch != "cpu":
        advice = recommended_xla_fraction(
            spec,
            margin=margin,
            other_processes_bytes=other_processes_bytes,
            context_bytes=context,
        )
        fraction = advice.fraction if jax_mem_fraction is None else jax_mem_fraction
        pool = int(total * fraction)
        limit = pool - workspace
        outside = budget - context - pool
        if context + pool > budget:
            breaking = "jax_preallocation"
    else:
        limit = budget - context - workspace
    if breaking is None and limit < 0:
        breaking = "cuda_context"
    return Budget(
        total_bytes=total,
        other_processes_bytes=other_processes_bytes,
        margin_bytes=margin_bytes,
        budget_bytes=budget,
        context_bytes=context,
        workspace_bytes=workspace,
        pool_bytes=pool,
        job_limit_bytes=limit,
        breaking_term=breaking,
        pool_fraction=fraction,
        outside_limit_bytes=outside,
        margin=margin,
        advice=advice,
        context=estimate,
    )
