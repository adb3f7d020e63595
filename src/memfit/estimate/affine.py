"""The affine model of peak bytes over the batch size, shared by the torch and JAX estimators.

Kept apart from the estimators so that using one framework's estimator never imports the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memfit._checks import require_list
from memfit._plain import plain_fields
from memfit.errors import ConfigError

__all__ = ["AffineFit", "check_batch_sizes", "fit_affine"]


def check_batch_sizes(batch_sizes: Sequence[int]) -> list[int]:
    """The batch sizes to trace, as a list of distinct positive integers in the given order.

    Raises:
        ConfigError: When ``batch_sizes`` is a string, is empty, or holds something other than
            a positive integer.

    >>> check_batch_sizes((32, 64, 32))
    [32, 64]
    """
    hint = "give positive integers, e.g. [32, 64, 128] (--batch 32,64,128)"
    sizes = require_list("batch_sizes", batch_sizes, what="a list of integers", hint=hint)
    if not sizes:
        raise ConfigError("no batch sizes to trace", key_path="batch_sizes", hint=hint)
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise ConfigError(
                f"batch size must be a positive integer, got {size!r}",
                key_path="batch_sizes",
                hint=hint,
            )
    return list(dict.fromkeys(sizes))  # each size once: tracing it again tells nothing new


@dataclass(frozen=True)
class AffineFit:
    """Least-squares line ``bytes = intercept + slope * batch_size`` over the traced points.

    Attributes:
        intercept: Bytes at batch size zero.
        slope: Bytes per item of the batch.
        residual: Largest absolute difference between a traced point and the line (bytes).
    """

    intercept: float
    slope: float
    residual: float

    def predict(self, batch_size: int) -> int:
        """Predicted bytes at ``batch_size``."""
        return round(self.intercept + self.slope * batch_size)

    def to_dict(self) -> dict[str, Any]:
        """The fit as plain data."""
        return plain_fields(self)


def fit_affine(xs: Sequence[int], ys: Sequence[int]) -> AffineFit | None:
    """Least-squares line through ``(xs, ys)``; ``None`` with fewer than two distinct ``xs``.

    >>> fit_affine([1, 2, 3], [10, 20, 30])
    AffineFit(intercept=0.0, slope=10.0, residual=0.0)
    """
    if len(set(xs)) < 2:
        return None
    n = len(xs)
    mx = sum(xs) / n
    my = sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    intercept = my - slope * mx
    residual = max(abs(y - (intercept + slope * x)) for x, y in zip(xs, ys, strict=True))
    return AffineFit(intercept=intercept, slope=slope, residual=residual)
