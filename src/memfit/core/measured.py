"""Measured memory terms handed to the planner as plain data.

The estimators (``memfit.estimate``) trace the user's real step and reduce it to an affine
model of peak bytes over one knob; the planner (``memfit.core.plan``) uses that instead of its
analytic parameter and activation terms. This module is the plain-data meeting point, so the
core never imports an estimator.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["MeasuredTerms"]


@dataclass(frozen=True)
class MeasuredTerms:
    """Peak memory of a traced step as ``fixed + per_item * knob`` (bytes).

    Attributes:
        knob: The workload knob the batch dimension follows (e.g. ``"batch_size"``).
        fixed_bytes: Terms that do not grow with the knob, by name (parameters, gradients,
            optimizer state, buffers, ...), at the allocated level.
        per_item_bytes: Bytes per unit of the knob (activations and temporaries at the peak).
        residual_bytes: Largest absolute error of the affine fit over the traced points.
        source: What measured it (``"torch fake-tensor trace"``, ``"xla memory_analysis"``).
    """

    knob: str
    fixed_bytes: dict[str, int]
    per_item_bytes: float
    residual_bytes: int = 0
    source: str = "trace"
    notes: tuple[str, ...] = field(default_factory=tuple)

    def peak_bytes(self, knob_value: int) -> int:
        """Predicted allocated peak at ``knob_value``."""
        return sum(self.fixed_bytes.values()) + round(self.per_item_bytes * knob_value)
