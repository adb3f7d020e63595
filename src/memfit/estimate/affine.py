"""The affine model of peak bytes over the batch size, shared by the torch and JAX estimators.

Kept apart from the estimators so that using one framework's estimator never imports the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["AffineFit", "fit_affine"]


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

    def to_dict(self) -> dict[str, float]:
        """The fit as plain data."""
        return {"intercept": self.intercept, "slope": self.slope, "residual": self.residual}


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
