"""The out-of-memory ladder every guard climbs: what to do next, as a pure function.

A guard (:class:`memfit.TrainGuard`, :class:`memfit.RolloutGuard`, ``memfit.jax.TrainGuard``)
works through a batch in chunks: the whole batch, or ``splits`` micro-batches of about
``n / splits`` items. When a chunk runs out of memory the guard asks :func:`on_oom` what to do:

* :class:`Retry` the same chunk. A chunk of a size that has run before (a *proven* size)
  failed although memory was there a moment ago, so the failure is most likely transient (a
  spike from another process, fragmentation, an injected fault): it gets at least
  ``transient_retries`` retries, and more when failures here are often cured by a retry.
  The ladder keeps a running count of attempts at proven sizes and of the failures a retry
  cured; from their ratio ``p`` it retries until ``p ** failures`` falls below
  ``1 / 1000`` (at most ``max_retries``): a run with many transient faults retries more
  instead of splitting, which would not help (a smaller micro-batch has as many
  operations to fail), and a run whose rare failures are about capacity splits soon. A size
  not yet seen to fit gets ``retries``, and none once the ladder has already split at this
  point of the batch (the failures there were about capacity).
* :class:`Split` the rest of the batch into more, smaller chunks (doubling the count; with
  ``divisors`` the next count that divides the batch, so every chunk has one shape). A proven
  size that failed past its retries is no longer proven: memory is tighter than it was.
* :class:`GiveUp` when chunks cannot get smaller (``max_splits`` reached, or one item) and the
  retries are spent.

After each completed step, :func:`end_step` counts clean steps (steps that did not have to
split further) and, after ``grow_back_after`` of them, halves the split count again
(:class:`GrowBack`). After a step that gave up, :func:`after_give_up` halves the split count
of the last completed step: splitting further did not help, so the failure was not a matter
of chunk size, and a guard that stayed at its maximum split would turn every later transient
fault into another give-up (a congestion window that never opens again).

Everything here is plain data in, plain data out: no framework, no clock, no randomness.

>>> config = LadderConfig(max_splits=4)
>>> state = LadderState()
>>> state, action = on_oom(config, state, n=8, splits=1, size=8, failures=1)
>>> action
Retry(transient=False)
>>> state, action = on_oom(config, state, n=8, splits=1, size=8, failures=2)
>>> action
Split(splits=2)
>>> state = on_fit(state, 4)
>>> on_oom(config, state, n=8, splits=2, size=4, failures=1)[1]
Retry(transient=True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, TypeAlias

from memfit._checks import require_count, require_positive_int

__all__ = [
    "Action",
    "GiveUp",
    "GrowBack",
    "LadderConfig",
    "LadderState",
    "Retry",
    "Split",
    "after_give_up",
    "end_step",
    "first_splits",
    "next_divisor",
    "next_splits",
    "on_fit",
    "on_oom",
    "transient_budget",
]


@dataclass(frozen=True)
class Retry:
    """Run the same chunk again with the same number of chunks.

    Attributes:
        transient: The chunk's size has run since the last capacity failure.
    """

    transient: bool


@dataclass(frozen=True)
class Split:
    """Cut what is left of the batch into ``splits`` chunks of the whole batch's size."""

    splits: int


@dataclass(frozen=True)
class GiveUp:
    """Stop: chunks cannot get smaller and the retries are spent.

    Attributes:
        smallest: The size (items) of the chunk that failed last.
    """

    smallest: int


@dataclass(frozen=True)
class GrowBack:
    """After enough clean steps, run with fewer, larger chunks again."""

    splits: int
    previous: int


Action: TypeAlias = Retry | Split | GiveUp


@dataclass(frozen=True)
class LadderConfig:
    """How a guard climbs.

    Attributes:
        max_splits: Most chunks per batch.
        grow_back_after: Clean steps after which the split count is halved.
        retries: Retries of a chunk whose size has not yet been seen to fit.
        transient_retries: Fewest retries of a chunk whose size has run before.
        max_retries: Most retries of a chunk whose size has run before.
        divisors: Split counts must divide the batch's item count (one chunk shape per
            count, as a compiled JAX step needs).
    """

    max_splits: int = 64
    grow_back_after: int = 50
    retries: int = 1
    transient_retries: int = 3
    max_retries: int = 16
    divisors: bool = False

    def __post_init__(self) -> None:
        require_positive_int("max_splits", self.max_splits, hint="a power of two such as 64")
        require_positive_int("grow_back_after", self.grow_back_after)
        for name in ("retries", "transient_retries", "max_retries"):
            require_count(name, getattr(self, name))


class LadderState(NamedTuple):
    """Where a guard stands between steps (a named tuple: a guard replaces it a few times a
    step, and ``_replace`` is cheap).

    Attributes:
        splits: Chunks the next step starts with.
        fits: The largest chunk (items) that has run (0: none yet).
        clean: Steps in a row that did not have to split further.
        completed: The split count the last completed step ran with.
        attempts: Attempts of chunks that ran in the end, recent ones weighing more.
        cured: Failures among those attempts that a retry at the same size cured.
    """

    splits: int = 1
    fits: int = 0
    clean: int = 0
    completed: int = 1
    attempts: float = 0.0
    cured: float = 0.0

    @property
    def transient_rate(self) -> float:
        """The estimated chance that an attempt fails transiently (a small prior: 1%)."""
        return (self.cured + 0.05) / (self.attempts + 5.0)


def next_divisor(n: int, at_least: int) -> int:
    """The smallest divisor of ``n`` that is at least ``at_least`` (``n`` when none smaller).

    >>> next_divisor(12, 5), next_divisor(12, 1), next_divisor(7, 2)
    (6, 1, 7)
    """
    for d in range(max(1, at_least), n + 1):
        if n % d == 0:
            return d
    return n


def first_splits(config: LadderConfig, state: LadderState, n: int) -> int:
    """The number of chunks a step over ``n`` items starts with.

    >>> first_splits(LadderConfig(divisors=True), LadderState(splits=4), 6)
    6
    """
    splits = max(1, min(state.splits, n))
    return next_divisor(n, splits) if config.divisors else splits


def next_splits(config: LadderConfig, splits: int, n: int) -> int | None:
    """The next rung above ``splits`` for ``n`` items, or ``None`` at the top.

    >>> eight = LadderConfig(max_splits=8)
    >>> next_splits(eight, 4, 100), next_splits(eight, 8, 100)
    (8, None)
    >>> next_splits(LadderConfig(divisors=True), 2, 12), next_splits(LadderConfig(), 4, 5)
    (4, 5)
    """
    if splits >= n:
        return None
    wanted = min(config.max_splits, 2 * splits, n)
    if config.divisors:
        wanted = next_divisor(n, 2 * splits)
        if wanted > config.max_splits:
            # The largest divisor still within max_splits, if it is above splits.
            below = [d for d in range(config.max_splits, splits, -1) if n % d == 0]
            return below[0] if below else None
    return wanted if wanted > splits else None


def on_oom(
    config: LadderConfig,
    state: LadderState,
    *,
    n: int,
    splits: int,
    size: int,
    failures: int,
    split_here: bool = False,
) -> tuple[LadderState, Action]:
    """What to do after a chunk of ``size`` items ran out of memory.

    Args:
        config: The ladder's settings.
        state: Where the guard stands.
        n: Items in the whole batch.
        splits: Chunks the batch is being run in now.
        size: Items in the chunk that failed.
        failures: Failures in a row of this chunk at this split count (1 for the first).
        split_here: The ladder already split at this point of the batch, after failures.

    Returns:
        The new state and the action.
    """
    proven = 0 < size <= state.fits
    fresh_budget = 0 if split_here else config.retries
    budget = transient_budget(config, state) if proven else fresh_budget
    if failures <= budget:
        return state, Retry(transient=proven)
    larger = next_splits(config, splits, n) if size > 1 else None
    if larger is not None:
        return state, Split(larger)
    return state, GiveUp(smallest=size)


def transient_budget(config: LadderConfig, state: LadderState) -> int:
    """Retries of a proven size: enough that a transient failure rate ``p`` leaves less
    than one chance in a thousand of splitting for nothing.

    >>> config, often = LadderConfig(), LadderState(attempts=100, cured=50)
    >>> transient_budget(config, LadderState()), transient_budget(config, often)
    (3, 10)
    """
    rate = min(state.transient_rate, 0.95)
    wanted = math.ceil(math.log(1e-3) / math.log(rate))
    return max(config.transient_retries, min(config.max_retries, wanted))


def on_fit(state: LadderState, size: int, failures: int = 0) -> LadderState:
    """A chunk of ``size`` items ran, after ``failures`` failures at that same size (which
    a retry therefore cured): the size is proven, and the cure is counted."""
    return state._replace(
        fits=max(state.fits, size),
        attempts=state.attempts + failures + 1,
        cured=state.cured + failures,
    )


def end_step(
    config: LadderConfig, state: LadderState, *, splits: int, split_further: bool
) -> tuple[LadderState, GrowBack | None]:
    """A step completed with ``splits`` chunks; count clean steps and maybe grow back.

    Args:
        config: The ladder's settings.
        state: Where the guard stands.
        splits: Chunks the step ended with (agreed across ranks under DDP).
        split_further: The step (on any rank) had to split further than it started.

    Returns:
        The new state and, when the split count was halved, the :class:`GrowBack`.
    """
    clean = 0 if split_further else state.clean + 1
    keep = 1.0 - 1.0 / config.grow_back_after  # the counts' memory: about grow_back_after steps
    state = state._replace(
        splits=splits,
        clean=clean,
        completed=splits,
        attempts=state.attempts * keep,
        cured=state.cured * keep,
    )
    if splits > 1 and clean >= config.grow_back_after:
        smaller = max(1, splits // 2)
        return state._replace(splits=smaller, clean=0), GrowBack(smaller, splits)
    return state, None


def after_give_up(state: LadderState) -> LadderState:
    """A step gave up: splitting did not help, so the next step starts from half the last
    completed step's split count (at least 1), not from the top of the ladder."""
    return state._replace(splits=max(1, state.completed // 2), clean=0)
