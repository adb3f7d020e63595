"""The steady state of a traced training loop: whether the last traced step repeats the one
before it, and its replay on through the allocator model.

A long run's reserved peak is the peak the caching allocator reaches after many steps
(fragmentation settles after a few). The trace runs a few steps (three by default); when the
last one allocates and frees exactly as the one before it did, step after step would too,
and :func:`run_steady` replays it on until the reserved peak holds.

The first step is not like the others: it also makes what lives on for the rest of the run
(the optimizer's state, the cuBLAS workspace at the first matmul). Those are left out of its
positions when the second step is compared with it, so that three steps are enough for an
Adam or SGD loop (a real report: with the default three steps the comparison failed on them, and
the steady state never engaged).

Pure: the trace's records are read through :class:`TracedStorage`; no torch import.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from memfit.allocator.model import AllocatorModel

__all__ = ["STEADY_REPEATS", "Program", "TracedStorage", "run_steady", "steady_program"]

#: How many more times the last traced step is replayed, at most, to reach the allocator's
#: steady state (it stops earlier once the reserved peak holds for two repetitions).
STEADY_REPEATS = 16

#: The targets the CUDA allocator replay takes (a tensor's storage, a CUDA kernel's memory).
_ON_GPU = ("all", "cuda")


class TracedStorage(Protocol):
    """What the period check reads of one storage of the trace."""

    @property
    def nbytes(self) -> int: ...

    @property
    def target(self) -> str: ...

    @property
    def free_index(self) -> int | None: ...


#: ``(storage, is_alloc)`` per event, as the trace records them.
Event = tuple[TracedStorage, bool]


@dataclass(frozen=True)
class Program:
    """The last traced step as a replayable program, when it repeats the step before it.

    ``ops`` holds ``(nbytes, -1, -1)`` for an allocation and ``(0, where, position)`` for a
    free of the ``position``-th allocation of this step (``where`` 0) or of the step before
    (``where`` 1).
    """

    ops: list[tuple[int, int, int]]
    last_allocs: list[TracedStorage]

    @property
    def kept_bytes(self) -> int:
        """Bytes one step leaves alive for good (allocated and never freed by the next)."""
        freed_next = {pos for _, where, pos in self.ops if where == 1}
        freed_here = {pos for _, where, pos in self.ops if where == 0}
        sizes = [n for n, where, _ in self.ops if where < 0]
        return sum(n for i, n in enumerate(sizes) if i not in freed_here | freed_next)


def _step_ops(
    events: Sequence[Event], mine: dict[int, int], before: dict[int, int]
) -> list[tuple[int, int, int]] | None:
    ops: list[tuple[int, int, int]] = []
    for record, is_alloc in events:
        if record.target not in _ON_GPU:
            continue
        if is_alloc:
            ops.append((record.nbytes, -1, -1))
        elif id(record) in mine:
            ops.append((0, 0, mine[id(record)]))
        elif id(record) in before:
            ops.append((0, 1, before[id(record)]))
        else:
            return None  # frees something older than the step before: not periodic
    return ops


def _positions(events: Sequence[Event], done_index: int | None = None) -> dict[int, int]:
    """Each allocation's position among the step's allocations; with ``done_index``, only
    among those freed before it (what lives on to the end is left out)."""
    allocs = [
        r
        for r, a in events
        if a
        and r.target in _ON_GPU
        and (done_index is None or (r.free_index is not None and r.free_index < done_index))
    ]
    return {id(r): i for i, r in enumerate(allocs)}


def steady_program(
    events: Sequence[Event], step_starts: Sequence[int], done_index: int | None
) -> Program | None:
    """The last step as a program, if it allocates and frees exactly as the step before did
    (so step after step would too); ``None`` with fewer than three steps or no such period.

    The step before is compared with the one before it twice: by the positions of all of
    that step's allocations, then, if they differ, leaving out the allocations that live to
    the end of the trace (what the first step makes once: the optimizer's state, the cuBLAS
    workspace), so that its frees name the same positions as the last step's.

    Args:
        events: ``(storage, is_alloc)`` per event of the trace.
        step_starts: The index into ``events`` where each traced step starts.
        done_index: The index where the teardown starts, or ``None`` (no complete run).
    """
    if len(step_starts) < 3 or done_index is None:
        return None
    bounds = [*step_starts, done_index]
    steps = [events[a:b] for a, b in itertools.pairwise(bounds)]
    pos = [_positions(e) for e in steps]
    last = _step_ops(steps[-1], pos[-1], pos[-2])
    if last is None:
        return None
    previous = _step_ops(steps[-2], pos[-2], pos[-3])
    if previous != last:
        previous = _step_ops(steps[-2], pos[-2], _positions(steps[-3], done_index))
    if previous != last:
        return None
    allocs = [r for r, a in steps[-1] if a and r.target in _ON_GPU]
    # the next step would free these of the last step's: they must still be live at its end
    for _, where, position in last:
        if where == 1 and not _live_at_end(allocs[position], done_index):
            return None
    return Program(last, allocs)


def _live_at_end(record: TracedStorage, done_index: int) -> bool:
    return record.free_index is None or record.free_index >= done_index


def run_steady(model: AllocatorModel, program: Program, previous: list[int]) -> None:
    """Replay ``program`` until the reserved peak holds for two repetitions (at most
    :data:`STEADY_REPEATS`): the fragmentation a long run reaches, which two steps miss.

    Args:
        model: The allocator model, after the traced steps.
        program: The last step (:func:`steady_program`).
        previous: The model's handles of the last step's allocations, in order.
    """
    held = 0
    for _ in range(STEADY_REPEATS):
        before = model.peak_reserved_bytes
        current: list[int] = []
        for nbytes, where, position in program.ops:
            if where < 0:
                current.append(model.malloc(nbytes))
            else:
                model.free((current if where == 0 else previous)[position])
        previous = current
        held = held + 1 if model.peak_reserved_bytes == before else 0
        if held >= 2:
            return
