"""A traced allocation sequence as a function of the batch size, replayed at any size.

Two traces of the same step at batch sizes ``v1 < v2`` usually allocate and free the same
storages in the same order; only the sizes differ, and each size is affine in the batch
(``a + b * v``: a weight's size is fixed, an activation's grows with the batch). Knowing
``a`` and ``b`` for every event gives the sequence at any batch size without tracing again,
and :class:`memfit.allocator.model.AllocatorModel` replays it in milliseconds: whether it fits
under a memory limit (the cap ``memfit.fit`` puts on the CUDA allocator), and with how much
room between the live blocks and the limit. Reserved memory is a step function of the batch
(20 MiB segments, cached blocks given back at the limit), so a line through reserved peaks
reads it badly; the replay follows the steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memfit.allocator.model import AllocatorModel
from memfit.errors import OutOfMemory

__all__ = ["ISLAND_SAMPLES", "Fit", "SequenceModel"]

#: Batches :meth:`SequenceModel.largest_fitting` samples above the bisection's first failure,
#: looking for a fitting run the reserved peak's steps leave there (a replay takes
#: milliseconds; the runs the corpus's workloads show are a few percent of the batch wide).
ISLAND_SAMPLES = 32


@dataclass(frozen=True)
class Fit:
    """One replay at one batch size.

    Attributes:
        value: The batch size.
        fits: It ran to the end under the limit (no out-of-memory), and its reserved peak
            stayed within the target.
        allocated_peak: Peak allocated bytes (to the failure, if it failed).
        reserved_peak: Peak reserved bytes.
    """

    value: int
    fits: bool
    allocated_peak: int
    reserved_peak: int


@dataclass(frozen=True)
class SequenceModel:
    """Allocations and frees in order, each event's size ``intercept + slope * batch``.

    Attributes:
        allocs: ``True`` for an allocation, ``False`` for the free of an earlier one.
        records: Which storage each event is about (pairs a free with its allocation).
        intercepts: Bytes at batch 0 of each event's storage.
        slopes: Bytes per item.
    """

    allocs: tuple[bool, ...]
    records: tuple[int, ...]
    intercepts: tuple[float, ...]
    slopes: tuple[float, ...]

    @classmethod
    def from_traces(
        cls,
        v1: int,
        events1: Sequence[tuple[bool, int, int]],
        v2: int,
        events2: Sequence[tuple[bool, int, int]],
    ) -> SequenceModel | None:
        """Build from two traces, ``(is_alloc, record, nbytes)`` per event; ``None`` when
        their structure differs (the step takes another path at another batch size) or the
        sizes are equal."""
        if v1 == v2 or len(events1) != len(events2):
            return None
        allocs, records, intercepts, slopes = [], [], [], []
        for (a1, r1, n1), (a2, r2, n2) in zip(events1, events2, strict=True):
            if a1 != a2 or r1 != r2:
                return None
            slope = (n2 - n1) / (v2 - v1)
            allocs.append(a1)
            records.append(r1)
            intercepts.append(n1 - slope * v1)
            slopes.append(slope)
        return cls(tuple(allocs), tuple(records), tuple(intercepts), tuple(slopes))

    def replay(
        self,
        value: int,
        *,
        limit_bytes: int | None = None,
        target_bytes: int | None = None,
        expandable_segments: bool = False,
        max_split_size: int | None = None,
        extra_bytes: float = 0.0,
    ) -> Fit:
        """Replay the sequence at ``value`` through the allocator model.

        Args:
            value: The batch size.
            limit_bytes: The allocator's cap (it gives cached segments back before failing).
            target_bytes: The most reserved memory the run may reach (a margin below the
                cap); ``None``: the cap.
            expandable_segments: Model ``expandable_segments:True``.
            max_split_size: Model ``max_split_size_mb`` (bytes).
            extra_bytes: Memory the real run holds that the sequence lacks (a correction
                measured on the device), taken from the limit and the target (negative:
                room given back). It is not replayed as an allocation: where it sits among
                the segments is unknown, and guessing would make the replay jump with it.
        """
        shift = round(extra_bytes)
        if limit_bytes is not None:
            limit_bytes = max(0, limit_bytes - shift)
        if target_bytes is not None:
            target_bytes = max(0, target_bytes - shift)
        model = AllocatorModel(expandable_segments, max_split_size, limit_bytes)
        handles: dict[int, int] = {}
        ok = True
        for is_alloc, record, a, b in zip(
            self.allocs, self.records, self.intercepts, self.slopes, strict=True
        ):
            if is_alloc:
                try:
                    handles[record] = model.malloc(max(0, round(a + b * value)))
                except OutOfMemory:
                    ok = False
                    break
            elif record in handles:
                model.free(handles.pop(record))
        target = target_bytes if target_bytes is not None else limit_bytes
        if target is not None and model.peak_reserved_bytes > target:
            ok = False
        return Fit(value, ok, model.peak_allocated_bytes + shift, model.peak_reserved_bytes + shift)

    def largest_fitting(
        self,
        low: int,
        high: int,
        *,
        limit_bytes: int,
        target_bytes: int | None = None,
        expandable_segments: bool = False,
        max_split_size: int | None = None,
    ) -> Fit | None:
        """The largest batch in ``[low, high]`` whose replay fits, or ``None`` when ``low``
        does not fit.

        Whether a batch fits is not monotone in the batch: the reserved peak is a step
        function of the request sizes, and it can fall as they grow (a block crossing the
        1 MiB line leaves the small pool's 2 MiB segments for room in a large segment that
        is already there; a different split of a cached block). So a bisection finds the top
        of the first fitting run only. Above its first failure, the search looks for fitting
        runs up to the largest batch whose *allocated* peak (monotone in the batch) still fits
        the target: :data:`ISLAND_SAMPLES` batches evenly spread there, then a bisection
        between the largest that fits and the next one sampled.
        """

        def run(v: int) -> Fit:
            return self.replay(
                v,
                limit_bytes=limit_bytes,
                target_bytes=target_bytes,
                expandable_segments=expandable_segments,
                max_split_size=max_split_size,
            )

        def bisect(lo: int, hi: int, best: Fit) -> tuple[Fit, int]:
            """``lo`` fits (``best``), ``hi`` does not: the top of ``lo``'s run, and the
            failure above it."""
            while hi - lo > 1:
                mid = (lo + hi) // 2
                got = run(mid)
                if got.fits:
                    lo, best = mid, got
                else:
                    hi = mid
            return best, hi

        best = run(low)
        if not best.fits:
            return None
        top = run(high)
        if top.fits:
            return top
        best, fail = bisect(low, high, best)
        ceiling = self._allocated_ceiling(fail, high, target_bytes or limit_bytes)
        if ceiling <= fail:
            return best
        step = max(1, (ceiling - fail) // ISLAND_SAMPLES)
        samples = sorted({*range(ceiling, fail, -step), ceiling})
        for i in range(len(samples) - 1, -1, -1):
            got = run(samples[i])
            if got.fits:
                above = samples[i + 1] if i + 1 < len(samples) else high + 1
                if above > high:
                    return got
                island, _ = bisect(samples[i], above, got)
                return island
        return best

    def _allocated_ceiling(self, low: int, high: int, target: int) -> int:
        """The largest batch in ``[low, high]`` whose allocated peak (without a cap) is at
        most ``target`` (``low`` when none): no batch above it can fit."""
        if self.replay(high).allocated_peak <= target:
            return high
        if self.replay(low).allocated_peak > target:
            return low
        lo, hi = low, high
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.replay(mid).allocated_peak <= target:
                lo = mid
            else:
                hi = mid
        return lo
