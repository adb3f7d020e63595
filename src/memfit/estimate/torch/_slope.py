"""Whether the traced batch sizes can give the batch's slope, and where they could.

A line through the peaks of two traced batch sizes says what one more item costs only where
the peak comes while the batch's tensors are live. At small batches a step's peak can come
where they are already freed (in the optimizer step, where Adam's temporaries of a large
model outweigh a small batch's activations): then the peak barely moves with the batch, and
the line's slope is not the batch's cost (a real report: "71.10 MiB + 512 B per batch_size" where
an item costs about 8.7 KB).

:func:`check_slope` reads the traced allocation sequence as a function of the batch
(:class:`memfit.estimate.torch._sequence.SequenceModel`): the bytes live after each event are
``A + B * batch``, so the peak is the largest of these lines. When the line that is highest at
the traced sizes is much flatter than the steepest one, it says so, what an item costs while
the batch is live (the steepest ``B``), and from which batch size that line takes the peak:
the sizes to trace for a slope (:meth:`SlopeCheck.trace_at`). Pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memfit.estimate.torch._sequence import SequenceModel
from memfit.units import format_bytes

__all__ = ["MAX_TRACE_AT", "SlopeCheck", "check_slope"]

#: The largest batch size memfit traces on its own to find a slope.
MAX_TRACE_AT = 2**20

#: The line that is highest at the traced sizes must be at least this share as steep as the
#: steepest line of the step for the traced sizes to give the slope.
_STEEP_ENOUGH = 0.5


@dataclass(frozen=True)
class SlopeCheck:
    """The traced sizes cannot give the batch's slope: why, and where they could.

    Attributes:
        traced: The batch sizes traced.
        fitted_per_item: The slope of the line through the traced peaks (bytes per item).
        per_item_bytes: What an item costs while the batch's tensors are live (the steepest
            line of the step).
        from_value: The batch size from which the peak grows at ``per_item_bytes``.
    """

    traced: tuple[int, ...]
    fitted_per_item: float
    per_item_bytes: float
    from_value: int

    def trace_at(self) -> list[int] | None:
        """Two batch sizes past ``from_value`` to trace for the slope (powers of two, the
        first at least twice ``from_value``), or ``None`` when that is past
        :data:`MAX_TRACE_AT`."""
        first = 1 << max(1, math.ceil(math.log2(max(2 * self.from_value, 2))))
        first = max(first, 2 * max(self.traced))
        if 2 * first > MAX_TRACE_AT:
            return None
        return [first, 2 * first]

    def text(self, knob: str) -> str:
        """The finding in one sentence, for the command's output."""
        sizes = " and ".join(str(v) for v in self.traced)
        return (
            f"at {knob} {sizes} the peak comes where the batch's tensors are already freed "
            "(the optimizer step, say), so the line's slope "
            f"({format_bytes(self.fitted_per_item)} per {knob}) is not what an item costs: "
            f"while they are live each takes {format_bytes(self.per_item_bytes)}, and the "
            f"peak grows with them from {knob} ~ {self.from_value:,}"
        )

    def to_dict(self) -> dict[str, Any]:
        """The finding as plain data (for ``--json``)."""
        return {
            "traced": list(self.traced),
            "fitted_per_item_bytes": self.fitted_per_item,
            "per_item_bytes": self.per_item_bytes,
            "from_value": self.from_value,
            "trace_at": self.trace_at(),
        }


def _lines(sequence: SequenceModel) -> list[tuple[float, float]]:
    """``(A, B)`` after each event: the bytes live are ``A + B * batch``."""
    live: dict[int, tuple[float, float]] = {}
    a_sum = b_sum = 0.0
    out: list[tuple[float, float]] = []
    for is_alloc, record, a, b in zip(
        sequence.allocs, sequence.records, sequence.intercepts, sequence.slopes, strict=True
    ):
        if is_alloc:
            live[record] = (a, b)
            a_sum, b_sum = a_sum + a, b_sum + b
        elif record in live:
            a_free, b_free = live.pop(record)
            a_sum, b_sum = a_sum - a_free, b_sum - b_free
        out.append((a_sum, b_sum))
    return out


def check_slope(
    sequence: SequenceModel | None, traced: Sequence[int], fitted_per_item: float
) -> SlopeCheck | None:
    """Whether the traced sizes can give the batch's slope; ``None`` when they can (or there
    is no sequence to read: fewer than two sizes, or steps that differ with the batch).

    Args:
        sequence: The traced allocations as a function of the batch
            (:attr:`memfit.estimate.torch.trace.TorchEstimate.sequence`).
        traced: The batch sizes traced.
        fitted_per_item: The slope of the line through their peaks.
    """
    if sequence is None or not traced:
        return None
    lines = _lines(sequence)
    if not lines:
        return None
    top = max(traced)
    peak_a, peak_b = max(lines, key=lambda line: (line[0] + line[1] * top, line[1]))
    steep_a, steep_b = max(lines, key=lambda line: (line[1], line[0]))
    if steep_b <= 0 or peak_b >= _STEEP_ENOUGH * steep_b:
        return None
    crossing = (peak_a - steep_a) / (steep_b - peak_b)  # where the two lines meet
    return SlopeCheck(
        traced=tuple(sorted(set(traced))),
        fitted_per_item=fitted_per_item,
        per_item_bytes=steep_b,
        from_value=max(top + 1, math.ceil(crossing)),
    )
