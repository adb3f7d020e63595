"""What a GPU leaves for the job: CUDA context, cuBLAS workspaces, other processes, margin.

The device's own figures come from :mod:`memfit.hardware.cuda` (the CUDA context and cuBLAS's
workspaces, with their sources) and the XLA pool from :mod:`memfit.allocator.xla_fraction`
(memfit's one fraction rule); this module composes them into the :class:`Budget` a plan checks
a configuration against. The names of those modules are re-exported here, where older code
imports them.

>>> from memfit.hardware.catalog import gpu
>>> b = compose_budget(gpu("RTX 4070"), framework="torch")
>>> b.job_limit_bytes < b.budget_bytes < b.total_bytes
True
"""

from __future__ import annotations

from dataclasses import dataclass

from memfit.allocator.xla_fraction import (
    DEFAULT_MARGIN,
    JAX_DEFAULT_MEM_FRACTION,
    XLA_FRACTION_CAP,
    XLA_FRACTION_STEP,
    FractionAdvice,
    recommended_xla_fraction,
)
from memfit.errors import ConfigError
from memfit.hardware.catalog import GpuSpec
from memfit.hardware.cuda import (
    CUBLAS_DEFAULT_CONFIG,
    CUBLAS_HOPPER_CONFIG,
    CUBLAS_SOURCE,
    cublas_workspace_bytes,
    cuda_context_bytes,
    parse_cublas_workspace_config,
)
from memfit.hardware.runtime import ContextEstimate, Runtime, cuda_context

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

# --------------------------------------------------------------------------------------------
# Budget composition: what the job may allocate on a GPU


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
            ``None`` (:func:`memfit.hardware.runtime.cuda_context`).

    Returns:
        The budget.

    Raises:
        ConfigError: When the margin is outside ``[0, 1)``, other processes' memory is
            negative, or the JAX fraction is outside ``(0, 1]``.

    >>> from memfit.hardware.catalog import anonymous_gpu
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
    estimate = cuda_context(spec, runtime, framework=framework) if context_bytes is None else None
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
