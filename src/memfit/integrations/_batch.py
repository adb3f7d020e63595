"""What the trainer integrations (Lightning, Hugging Face) share: batch-size arithmetic and the
check of a Recorder they are given."""

from __future__ import annotations

import math
from typing import Any

from memfit._checks import require_choice, require_object, require_positive_int
from memfit.errors import ConfigError, InfeasiblePlan
from memfit.units import format_bytes, require_size

__all__ = ["batch_size_from_estimate", "keep_effective_batch", "require_recorder"]


def batch_size_from_estimate(
    estimate: Any,
    budget: int | str,
    *,
    low: int = 1,
    high: int = 65536,
    multiple_of: int = 1,
    level: str = "allocated",
) -> int:
    """The largest batch size whose predicted peak stays within ``budget``.

    Uses the affine fit of a :class:`memfit.TorchEstimate` (``intercept + slope * b``),
    at the allocated level (``level="allocated"``) or the reserved level (``"reserved"``).

    Args:
        estimate: A :class:`memfit.TorchEstimate` (``fit`` / ``reserved_fit``).
        budget: Bytes (or size text) the step may use.
        low: Smallest batch size accepted.
        high: Largest batch size considered.
        multiple_of: The batch size must be a multiple of this.
        level: ``"allocated"`` or ``"reserved"``.

    Returns:
        The batch size.

    Raises:
        ConfigError: When the estimate has no fit, or an argument is out of range.
        InfeasiblePlan: When even ``low`` does not fit.
    """
    require_object(
        "estimate",
        estimate,
        attributes=("fit", "reserved_fit"),
        what="a memfit.TorchEstimate",
        hint="estimate = memfit.estimate_torch(build, step, make_batch, batch_sizes=[8, 16])",
    )
    limit = require_size("budget", budget)
    for name, value in (("low", low), ("high", high), ("multiple_of", multiple_of)):
        require_positive_int(name, value)
    require_choice("level", level, ("allocated", "reserved"))
    if low < 1 or high < low or multiple_of < 1:
        raise ConfigError(
            f"need 1 <= low <= high and multiple_of >= 1, got low={low}, high={high}, "
            f"multiple_of={multiple_of}",
            key_path="low",
        )
    fit = estimate.fit if level == "allocated" else estimate.reserved_fit
    if fit is None:
        raise ConfigError(
            "the estimate has no fit (trace at least two batch sizes)",
            key_path="estimate.fit",
            hint="estimate_torch(..., batch_sizes=[8, 16, 32])",
        )
    assert limit is not None
    slope, intercept = float(fit.slope), float(fit.intercept)
    best = high if slope <= 0 else math.floor((limit - intercept) / slope)
    best = min(best, high)
    best -= best % multiple_of
    first = math.ceil(low / multiple_of) * multiple_of
    if best < first:
        smallest = int(intercept + slope * first)
        raise InfeasiblePlan(
            f"batch size {first} needs {format_bytes(smallest)}, over the budget "
            f"{format_bytes(limit)}",
            smallest_bytes=smallest,
            budget_bytes=limit,
            binding_term="fixed terms (parameters, gradients, optimizer state)"
            if intercept > limit
            else "activations",
            hint="a smaller model, lower precision, or a larger GPU",
        )
    return best


def keep_effective_batch(effective: int, micro: int) -> tuple[int, int]:
    """``(micro_batch, accumulation)`` with ``micro_batch * accumulation == effective``.

    Takes the largest micro-batch at most ``micro`` that divides ``effective``.

    Raises:
        ConfigError: When ``effective`` or ``micro`` is not a positive integer.
    """
    require_positive_int("effective", effective)
    require_positive_int("micro", micro)
    size = min(micro, effective)
    while effective % size:
        size -= 1
    return size, effective // size


def require_recorder(recorder: Any) -> None:
    """A :class:`memfit.Recorder` (or ``None``): what a callback steps and closes."""
    require_object(
        "recorder",
        recorder,
        methods=("step", "close", "on_event"),
        what="a memfit.Recorder",
        hint="memfit.Recorder('run.jsonl')",
        optional=True,
    )
