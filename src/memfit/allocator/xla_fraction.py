"""The XLA pool fraction: memfit's one rule for ``XLA_PYTHON_CLIENT_MEM_FRACTION``.

JAX preallocates a fraction of the GPU's memory for XLA's allocator at its first operation.
:func:`recommended_xla_fraction` is the only place memfit decides that fraction; ``memfit
plan``, ``memfit env``, the plan's environment and the examples all show its answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from memfit.hardware.catalog import GpuSpec
from memfit.hardware.cuda import cuda_context_bytes
from memfit.units import format_bytes

__all__ = [
    "DEFAULT_MARGIN",
    "JAX_DEFAULT_MEM_FRACTION",
    "XLA_FRACTION_CAP",
    "XLA_FRACTION_STEP",
    "FractionAdvice",
    "recommended_xla_fraction",
]

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

    >>> from memfit.hardware.catalog import gpu
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
