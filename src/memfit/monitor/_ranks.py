"""Rank imbalance: one rank's peak well above the others' (pure).

Under ``torch.distributed`` every rank should need about the same memory; a rank whose peak
is far above the others' (an uneven shard, a rank that also evaluates or logs, a leak on one
rank) is the one that runs out first and stops all of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["DEFAULT_IMBALANCE", "Imbalance", "rank_imbalance"]

#: How far above the others' median a rank's peak may be before it is flagged (20%).
DEFAULT_IMBALANCE = 0.2


@dataclass(frozen=True)
class Imbalance:
    """A rank whose peak is more than the threshold above the others'.

    Attributes:
        rank: The rank.
        peak_bytes: Its peak.
        others_bytes: The median of the other ranks' peaks.
        excess: ``peak_bytes / others_bytes - 1``.
    """

    rank: int
    peak_bytes: int
    others_bytes: int
    excess: float


def _median(values: Sequence[int]) -> int:
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) // 2


def rank_imbalance(
    peaks: Sequence[int | None], threshold: float = DEFAULT_IMBALANCE
) -> list[Imbalance]:
    """The ranks whose peak is more than ``threshold`` above the median of the others'
    (``None``: a rank that cannot say; it is left out), largest excess first.

    >>> [i.rank for i in rank_imbalance([100, 104, 180, 98])]
    [2]
    >>> rank_imbalance([100, 110])
    []
    """
    known = [(r, p) for r, p in enumerate(peaks) if p is not None]
    out: list[Imbalance] = []
    if len(known) < 2:
        return out
    for r, peak in known:
        others = _median([p for o, p in known if o != r])
        if others > 0 and peak > others * (1.0 + threshold):
            out.append(Imbalance(r, peak, others, peak / others - 1.0))
    return sorted(out, key=lambda i: -i.excess)
