"""The planner: the best knob values that fit a GPU and keep every rule (pure).

:func:`plan` searches the discrete knob space of a workload deterministically, and gives
exactly what enumerating every configuration would give (a property test checks it against
``_Space.enumerate_all``), without enumerating it:

* knobs are searched depth-first in priority order, each value from the largest down;
* allocated memory is non-decreasing in every knob (each family's terms grow with the knobs
  they read; a property test checks it, and :func:`_memory_monotone` turns pruning off for a
  workload whose own terms are not shown to grow), so the allocated bytes of the
  configuration made of the values chosen so far and the *smallest* values of the knobs
  still open are a lower bound on the reserved bytes of every configuration below it: the
  values of a knob that may still fit are a prefix of its domain, found by bisection. The
  bound uses allocated, not reserved, bytes because the allocator's segment slack is not
  monotone (a block that crosses 10 MiB leaves a shared 20 MiB segment for its own);
* a subtree is skipped before any of its memory is evaluated when an upper bound of the
  objective over it (interval arithmetic, :mod:`memfit.core._bounds`) is below the answers
  kept so far, or when no values of its open knobs keep every rule
  (:meth:`_Space.completions`);
* only the best ``1 + 8 x alternatives`` configurations are kept, ranked by one key
  (:meth:`_Space.rank`: the workload's objective, the throughput proxy; at equal objective
  the configuration that keeps the knobs the objective does not read at their declared
  defaults (the user's hyperparameters) wins, then the one that needs less memory, then the
  knob values in priority order);
* the evaluation of a configuration does not depend on the GPU (the GPU adds constants), so
  :func:`plan_many` shares one cache over a whole tier table, and each GPU's search starts
  from the previous GPU's answer.

With ``effective_batch`` declared, the accumulation knob is not searched: it is
``value // micro`` for each micro-batch that divides the effective batch.

The result, :class:`Plan`, says what the chosen configuration needs term by term
(``breakdown`` sums to ``predicted_bytes``), what stops the next bigger configuration
(``binding``: a term, a rule, host RAM, or the knob ranges), and the next best
configurations (``alternatives``). When nothing fits, :class:`memfit.errors.InfeasiblePlan`
carries the smallest footprint of a configuration that keeps every rule and the term that
breaks it.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from memfit._plain import deep_merge
from memfit.allocator.settings import workload_settings
from memfit.allocator.xla_fraction import DEFAULT_MARGIN
from memfit.core._bounds import nondecreasing, upper_bound
from memfit.core.budget import Budget, compose_budget
from memfit.core.constraints import (
    CompiledRule,
    apply_overrides,
    check,
    compile_rules,
    environment,
    parse_expr,
    range_violation,
    require_known,
)
from memfit.core.evaluate import Evaluation, evaluate, family_for
from memfit.core.measured import MeasuredTerms
from memfit.core.workload import Workload
from memfit.errors import ConfigError, InfeasiblePlan
from memfit.hardware.catalog import GpuSpec, size_note
from memfit.hardware.runtime import Runtime
from memfit.units import format_bytes, parse_bytes

__all__ = ["FeasibleSpace", "Plan", "feasible_space", "plan_for_gpu", "plan_many"]

#: How many next-best configurations a plan lists.
DEFAULT_ALTERNATIVES = 3

#: Largest number of complete configurations one search may visit.
MAX_CONFIGURATIONS = 2_000_000

#: Largest number of combinations of the open knobs the rules read that the search lists
#: at once to skip, before any memory is evaluated, a subtree where no rule can hold.
MAX_COMPLETIONS = 4096


@dataclass(frozen=True)
class Plan:
    """The chosen configuration of a workload on one GPU.

    Attributes:
        gpu: The GPU's name.
        budget_bytes: What the GPU leaves for the job: total less other processes and margin.
        predicted_bytes: The job's predicted peak device footprint, its CUDA context included
            (with JAX preallocation: the context and the whole pool).
        fits: Whether ``predicted_bytes <= budget_bytes`` (and the buffers fit JAX's pool and
            the host RAM where that applies).
        knobs: Chosen knob values, named as in the workload (plus ``replay_placement`` when
            the workload lets the planner place the replay buffer).
        breakdown: Term name -> bytes; the values sum to ``predicted_bytes``.
        binding: What stops the next bigger configuration: a term name, ``rule: ...``,
            ``host_memory``, or ``knob ranges``; ``None`` when nothing was searched.
        alternatives: The next best configurations, best first, each different from the
            chosen one and from each other in what it achieves or needs: ``{"knobs",
            "predicted_bytes", "used_bytes", "objective"}``, where ``used_bytes`` is what the
            job itself takes (``predicted_bytes`` without ``jax_pool_unused``: with
            preallocation every configuration's footprint is the whole pool).
        gpu_total_bytes: The GPU's total memory (as the driver reports it).
        pool_bytes: JAX's preallocated pool (``None`` without preallocation).
        host_bytes: Host RAM the plan puts state in (a replay buffer in host RAM), not part
            of ``predicted_bytes``.
        environment: The allocator settings the plan assumes, to run the job with
            (:func:`memfit.allocator.settings.workload_settings`).
        notes: Sentences a reader needs: the XLA fraction's reason, what a size given in
            decimal units means, a knob range that limits the plan, where measurements came
            from.
        would_fit: When the requested configuration does not fit: changes that would
            (``{"change", "fits", "knobs", "predicted_bytes", "host_bytes"}`` each), from
            the workload family's fallbacks (an off-policy replay buffer in host RAM,
            ``optimize_memory_usage``, a smaller buffer).
        host_memory_bytes: The host RAM the plan relied on for state in host RAM (given,
            the workload's, or this machine's available RAM); ``None`` when not checked.
        host_budget_bytes: What of it the plan let host state take: ``host_memory_bytes``
            less the same margin (a share of it) the GPU keeps.
        context: How the ``cuda_context`` term was sized: the runtime it assumed (versions,
            module loading and why), the architecture and the source of the figure
            (:meth:`memfit.hardware.runtime.ContextEstimate.to_dict`); ``None`` when the
            context was given (measured) rather than estimated.
    """

    gpu: str
    budget_bytes: int
    predicted_bytes: int
    fits: bool
    knobs: dict[str, int | str]
    breakdown: dict[str, int]
    binding: str | None
    alternatives: list[dict[str, Any]] = field(default_factory=list)
    gpu_total_bytes: int | None = None
    pool_bytes: int | None = None
    host_bytes: int = 0
    environment: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    would_fit: list[dict[str, Any]] = field(default_factory=list)
    host_memory_bytes: int | None = None
    host_budget_bytes: int | None = None
    context: dict[str, Any] | None = None

    @property
    def used_bytes(self) -> int:
        """What the job itself takes on the device: ``predicted_bytes`` without the unused
        part of a preallocated pool."""
        return self.predicted_bytes - self.breakdown.get("jax_pool_unused", 0)

    @property
    def headroom_bytes(self) -> int:
        """Room left: inside the preallocated pool when there is one (the rest of the card
        is already the pool's), else within the budget."""
        if self.pool_bytes is not None:
            return self.breakdown.get("jax_pool_unused", 0)
        return self.budget_bytes - self.predicted_bytes

    def to_dict(self) -> dict[str, Any]:
        """The plan's fields and the two figures derived from them (``used_bytes``,
        ``headroom_bytes``), as plain data (the CLI's ``--json``)."""
        return {
            "gpu": self.gpu,
            "budget_bytes": self.budget_bytes,
            "predicted_bytes": self.predicted_bytes,
            "fits": self.fits,
            "knobs": dict(self.knobs),
            "breakdown": dict(self.breakdown),
            "binding": self.binding,
            "alternatives": [dict(a) for a in self.alternatives],
            "gpu_total_bytes": self.gpu_total_bytes,
            "pool_bytes": self.pool_bytes,
            "host_bytes": self.host_bytes,
            "used_bytes": self.used_bytes,
            "headroom_bytes": self.headroom_bytes,
            "environment": dict(self.environment),
            "notes": list(self.notes),
            "would_fit": [dict(w) for w in self.would_fit],
            "host_memory_bytes": self.host_memory_bytes,
            "host_budget_bytes": self.host_budget_bytes,
            "context": None if self.context is None else dict(self.context),
        }


#: A configuration's rank (larger is better): objective, defaults kept, -reserved bytes,
#: knob values in priority order.
_Rank = tuple[float, int, int, tuple[int, ...]]


@dataclass(frozen=True)
class _Eval:
    """One configuration's memory, placement resolved."""

    evaluation: Evaluation
    on_gpu: bool


@dataclass(frozen=True)
class _Limit:
    """What a configuration may take: the framework's allocator (``job``) and, with a JAX
    pool, the device memory outside it (``outside``; ``None`` without a pool, where terms
    outside the allocator share ``job``)."""

    job: int
    outside: int | None = None

    @classmethod
    def of(cls, budget: Budget) -> _Limit:
        return cls(budget.job_limit_bytes, budget.outside_limit_bytes)

    def holds(self, ev: Evaluation) -> bool:
        """Whether the configuration's reserved memory fits."""
        if self.outside is None:
            return ev.reserved_bytes <= self.job
        return ev.framework_reserved_bytes <= self.job and ev.outside_bytes <= self.outside

    def may_hold(self, ev: Evaluation) -> bool:
        """Whether the configuration's allocated memory fits (a lower bound of every larger
        configuration's reserved memory, for pruning)."""
        if self.outside is None:
            return ev.allocated_bytes <= self.job
        return (
            ev.allocated_bytes - ev.outside_bytes <= self.job and ev.outside_bytes <= self.outside
        )


#: A configuration with its rank: ``(rank, config)``, ``config`` in search order.
_Ranked = tuple["_Rank", tuple[int, ...]]


def _order(item: _Ranked) -> tuple[Any, ...]:
    """The total order of ranked configurations: the rank, then (at an equal rank) the
    configuration that comes first in ascending enumeration order."""
    rank, config = item
    return rank, tuple(-v for v in config)


def _below(bound: float | None, bar: float | None) -> bool:
    """Whether an objective bound is strictly under the bar (no bound or no bar: ``False``)."""
    return bound is not None and bar is not None and bound < bar


def _memory_monotone(
    workload: Workload, measured: MeasuredTerms | None, constants: Mapping[str, int]
) -> bool:
    """Whether allocated memory is shown never to fall when a knob grows, so the search may
    prune on it.

    The analytic families are (a property test checks every bundled workload); what a
    workload writes itself is checked here: a custom family's term expressions, a measured
    line's slope, a Brax measurement's coefficients, a simulator's per-env and per-pixel
    bytes. Where it is not shown, the search evaluates every configuration its objective
    bound leaves (the answer is the same, only slower).
    """
    if measured is not None and measured.per_item_bytes < 0:
        return False
    m = workload.measurements
    if m is not None:
        slopes = (m.env_step.per_item_bytes, m.step.per_transition_bytes)
        if min(*slopes, m.step.per_minibatch_item_bytes) < 0:
            return False
    if workload.simulator is not None and min(workload.simulator.resolved()[1:3]) < 0:
        return False
    if workload.family == "custom":
        knobs = frozenset(workload.knobs)
        names = {"device_count": workload.device_count, **constants}
        for spec in (workload.terms or {}).values():
            if (
                isinstance(spec, str)
                and not _is_size(spec)
                and not nondecreasing(spec, knobs, names)
            ):
                return False
    return True


def _is_size(text: str) -> bool:
    try:
        parse_bytes(text)
    except ConfigError:
        return False
    return True


class _Space:
    """The search space and the GPU-independent evaluation cache of one workload."""

    def __init__(
        self,
        workload: Workload,
        overrides: Mapping[str, int] | None,
        measured: MeasuredTerms | None,
        host_memory_bytes: int | None,
        *,
        device_is_host: bool = False,
        margin: float = DEFAULT_MARGIN,
    ) -> None:
        self.workload = workload
        given = apply_overrides(workload, overrides)
        self.overrides: dict[str, int] = dict(given)
        self.env: dict[str, int] = {**environment(workload)}
        self.env.update({k: v for k, v in given.items() if k in workload.settings})
        pinned = {k: v for k, v in given.items() if k in workload.knobs}
        for name, value in pinned.items():
            outside = range_violation(workload, name, value)
            if outside is not None:  # the rule memfit check applies: one rule for both
                near = " or ".join(f"--set {name}={s[name]}" for s in outside.suggestions)
                raise ConfigError(
                    outside.message,
                    key_path=f"--set {name}",
                    hint=f"try {near}, or widen knobs.{name} in the workload",
                )
        self.pinned: dict[str, int] = pinned
        self.measured = measured
        self.host_memory_bytes = (
            host_memory_bytes if host_memory_bytes is not None else workload.host_memory_bytes
        )
        # host RAM keeps the GPU's margin rule: a share of the total is left free
        self.margin = margin
        self.host_budget_bytes = (
            None
            if self.host_memory_bytes is None
            else self.host_memory_bytes - int(self.host_memory_bytes * margin)
        )
        eb = workload.effective_batch
        self.accumulation = eb.accumulation if eb is not None else None
        names = [n for n in workload.knobs if n != self.accumulation]
        # knobs in priority order (high first): used for ranking and binding
        self.priority_order = sorted(names, key=lambda n: (-workload.knobs[n].priority, n))
        self.domains: dict[str, tuple[int, ...]] = {}
        for name in names:
            domain = (pinned[name],) if name in pinned else workload.knobs[name].values()
            if eb is not None and name == eb.micro:
                domain = tuple(v for v in domain if eb.value % v == 0)
                if self.accumulation in pinned:
                    acc = pinned[self.accumulation]
                    domain = tuple(v for v in domain if v * acc == eb.value)
                if not domain:
                    raise ConfigError(
                        f"no value of {name} keeps effective_batch "
                        f"({eb.micro} * {eb.accumulation} == {eb.value})",
                        key_path=f"knobs.{name}",
                        hint="give the micro-batch knob values that divide the effective batch",
                    )
            self.domains[name] = domain
        self.search_order = list(self.priority_order)
        self.rules: list[CompiledRule] = compile_rules(workload)
        self.objective = parse_expr(workload.objective_expr(), key_path="objective")
        require_known(self.objective, [*workload.knobs, *self.env], what="objective")
        self.family = family_for(workload)
        # on the host (--gpu cpu) the device is host RAM: placeable state stays "on device"
        self.placement = "gpu" if device_is_host else self.family.placement_of(workload)
        self.pinned_all = all(len(d) == 1 for d in self.domains.values())
        self._cache: dict[tuple[tuple[int, ...], bool], Evaluation] = {}
        self._valid: dict[tuple[int, ...], bool] = {}
        self._ranks: dict[tuple[int, ...], _Rank] = {}
        # knobs the objective does not read, with the value the workload declares for them
        # (the user's hyperparameter): at equal objective a plan keeps them
        self.held: dict[str, int] = {
            n: workload.knobs[n].default  # type: ignore[misc]
            for n in self.priority_order
            if n not in self.objective.names
            and n not in pinned
            and workload.knobs[n].default is not None
        }
        reads = set(self.objective.names)
        if eb is not None and eb.accumulation in reads:
            reads.add(eb.micro)  # the accumulation follows the micro-batch
        self.objective_reads = frozenset(reads)
        self.monotone = _memory_monotone(workload, measured, self.env)
        self.visited = 0  # complete configurations the last search visited
        self.exhaustive = False  # True: enumerate every configuration (the tests' reference)
        # the knobs the rules read (the micro-batch too when a rule reads the accumulation)
        ruled = {n for rule in self.rules for n in rule.names}
        if eb is not None and eb.accumulation in ruled:
            ruled.add(eb.micro)
        self.rule_knobs = frozenset(n for n in self.search_order if n in ruled)
        self._rule_read = [n in self.rule_knobs for n in self.search_order]
        # per depth: the positions of the rule-read knobs still open, or None (too many)
        self._rule_rest: list[list[int] | None] = []
        for depth in range(len(self.search_order) + 1):
            rest = [j for j in range(depth, len(self.search_order)) if self._rule_read[j]]
            size = math.prod(len(self.domains[self.search_order[j]]) for j in rest)
            self._rule_rest.append(rest if size <= MAX_COMPLETIONS else None)
        self._completions: dict[tuple[int, ...], frozenset[tuple[int, ...]]] = {}
        self.last_top: list[tuple[int, ...]] = []  # the last search's answer: seeds the next

    def values(self, config: Sequence[int]) -> dict[str, int]:
        out = dict(self.env)
        out.update(zip(self.search_order, config, strict=True))
        eb = self.workload.effective_batch
        if eb is not None:
            out[eb.accumulation] = eb.value // out[eb.micro]
        return out

    def evaluation(self, config: tuple[int, ...], on_gpu: bool) -> Evaluation:
        key = (config, on_gpu)
        found = self._cache.get(key)
        if found is None:
            found = evaluate(
                self.workload, self.values(config), measured=self.measured, on_device=on_gpu
            )
            self._cache[key] = found
        return found

    def host_ok(self, ev: Evaluation) -> bool:
        return self.host_budget_bytes is None or ev.host_bytes <= self.host_budget_bytes

    def resolve(self, config: tuple[int, ...], limit: _Limit) -> _Eval | None:
        """The configuration's memory with its placement, or ``None`` if it cannot fit."""
        if self.placement in ("gpu", "auto"):
            ev = self.evaluation(config, True)
            if limit.holds(ev):
                return _Eval(ev, True)
            if self.placement == "gpu":
                return None
        ev = self.evaluation(config, False)
        if limit.holds(ev) and self.host_ok(ev):
            return _Eval(ev, False)
        return None

    def could_fit(self, config: tuple[int, ...], limit: _Limit) -> bool:
        """``False`` when neither this configuration nor any larger one can fit ``limit``."""
        if self.placement in ("gpu", "auto"):
            if limit.may_hold(self.evaluation(config, True)):
                return True
            if self.placement == "gpu":
                return False
        ev = self.evaluation(config, False)
        return limit.may_hold(ev) and self.host_ok(ev)

    def lower_bound(self, config: tuple[int, ...]) -> int:
        """Allocated bytes of the smallest placement: no larger configuration reserves less."""
        if self.placement == "gpu":
            return self.evaluation(config, True).allocated_bytes
        return self.evaluation(config, False).allocated_bytes

    def smallest_eval(self, config: tuple[int, ...]) -> _Eval:
        """The smallest device footprint of a configuration over the allowed placements."""
        if self.placement == "host":
            return _Eval(self.evaluation(config, False), False)
        gpu_ev = self.evaluation(config, True)
        if self.placement == "gpu":
            return _Eval(gpu_ev, True)
        host_ev = self.evaluation(config, False)
        if self.host_ok(host_ev) and host_ev.reserved_bytes < gpu_ev.reserved_bytes:
            return _Eval(host_ev, False)
        return _Eval(gpu_ev, True)

    def rules_hold(self, values: Mapping[str, int]) -> bool:
        return all(rule.holds(values) for rule in self.rules)

    def broken_rule(self, values: Mapping[str, int]) -> CompiledRule | None:
        for rule in self.rules:
            if not rule.holds(values):
                return rule
        return None

    def valid(self, config: tuple[int, ...]) -> bool:
        """Whether the configuration keeps every rule (cached: it does not depend on the GPU)."""
        found = self._valid.get(config)
        if found is None:
            found = self.rules_hold(self.values(config))
            self._valid[config] = found
        return found

    def rank(self, config: tuple[int, ...]) -> _Rank:
        """The one comparison key of the search: larger is better (cached).

        Its first element is the objective, the only part the search prunes on (an upper
        bound of the objective over a box of knob values); everything after it is the tie
        rule, free to read anything about the configuration: how many of the knobs the
        objective does not read keep their declared default (the user's hyperparameters:
        PPO learns differently with another batch_size), then less memory (the reserved
        bytes on the device), then the knob values in priority order.
        """
        found = self._ranks.get(config)
        if found is None:
            values = self.values(config)
            objective = self.objective.evaluate(values)
            kept = sum(1 for n, v in self.held.items() if values[n] == v)
            reserved = self.evaluation(config, self.placement != "host").reserved_bytes
            found = (
                float(objective),
                kept,
                -reserved,
                tuple(values[n] for n in self.priority_order),
            )
            self._ranks[config] = found
        return found

    def _leaf(self, config: tuple[int, ...], limit: _Limit) -> bool:
        """Count one complete configuration visited; whether it fits and keeps the rules."""
        self.visited += 1
        if self.visited > MAX_CONFIGURATIONS:
            raise ConfigError(
                f"the knob space has more than {MAX_CONFIGURATIONS} configurations to visit",
                key_path="knobs",
                hint="narrow the knob ranges, or pin some knobs with --set",
            )
        return self.valid(config) and self.resolve(config, limit) is not None

    def enumerate_all(self, limit: _Limit) -> list[_Ranked]:
        """Every configuration that fits ``limit`` and keeps the rules, with its rank: plain
        enumeration, no pruning (the reference the search is tested against)."""
        domains = [self.domains[n] for n in self.search_order]
        self.visited = 0
        return [
            (self.rank(config), config)
            for config in itertools.product(*domains)
            if self._leaf(config, limit)
        ]

    def completions(self, depth: int, prefix: Sequence[int]) -> frozenset[tuple[int, ...]] | None:
        """The values of the knobs the rules read that are still open after ``prefix`` (in
        search order) and keep every rule with it; ``None`` when there are too many such
        combinations to list (more than :data:`MAX_COMPLETIONS`). Cached: it depends only
        on the prefix's values of the knobs the rules read, not on the GPU."""
        rest = self._rule_rest[depth]
        if rest is None:
            return None
        # the projection's length says which rule-read knobs are still open
        key = tuple(v for v, read in zip(prefix, self._rule_read, strict=False) if read)
        found = self._completions.get(key)
        if found is None:
            found = frozenset(self._list_completions(depth, prefix, rest))
            self._completions[key] = found
        return found

    def _list_completions(
        self, depth: int, prefix: Sequence[int], rest: list[int]
    ) -> Iterator[tuple[int, ...]]:
        values = self.values([*prefix, *(self.domains[n][0] for n in self.search_order[depth:])])
        names = [self.search_order[j] for j in rest]
        eb = self.workload.effective_batch
        micro_open = eb is not None and eb.micro in names
        opened = set(names)
        if micro_open:
            assert eb is not None
            opened.add(eb.accumulation)
        settled = [r for r in self.rules if opened.isdisjoint(r.names)]
        if not all(rule.holds(values) for rule in settled):
            return  # a rule over the values given so far is already broken
        tests = [r.test for r in self.rules if not opened.isdisjoint(r.names)]
        domains = [self.domains[n] for n in names]
        for combo in itertools.product(*domains):
            values.update(zip(names, combo, strict=True))
            if micro_open:
                assert eb is not None
                values[eb.accumulation] = eb.value // values[eb.micro]
            for test in tests:  # a plain loop: this is the search's innermost one
                if not test(values):
                    break
            else:
                yield combo

    def objective_bound(self, prefix: Sequence[int]) -> float | None:
        """An upper bound of the objective over every configuration that starts with
        ``prefix`` (search order), or ``None`` when none is safe."""
        box: dict[str, tuple[float, float]] = {k: (v, v) for k, v in self.env.items()}
        for depth, name in enumerate(self.search_order):
            if depth < len(prefix):
                box[name] = (prefix[depth], prefix[depth])
            else:
                domain = self.domains[name]
                box[name] = (domain[0], domain[-1])
        eb = self.workload.effective_batch
        if eb is not None:
            low, high = box[eb.micro]
            box[eb.accumulation] = (eb.value // high, eb.value // low)
        return upper_bound(self.objective.text, box)

    def top(self, limit: _Limit, count: int) -> list[_Ranked]:
        """The ``count`` best configurations that fit ``limit`` and keep the rules, best
        first (:meth:`search`; with ``exhaustive`` set, from :meth:`enumerate_all`: the same
        list, the reference the tests compare with)."""
        if self.exhaustive:
            found = sorted(self.enumerate_all(limit), key=_order, reverse=True)[:count]
        else:
            found = self.search(limit, count, self.last_top)
        self.last_top = [config for _, config in found]
        return found

    def search(
        self, limit: _Limit, count: int, seeds: Sequence[tuple[int, ...]] = ()
    ) -> list[_Ranked]:
        """The ``count`` best configurations that fit ``limit`` and keep the rules, best
        first: exactly the first ``count`` of :meth:`enumerate_all` in :func:`_order`.

        A depth-first search over the knobs in priority order that never enumerates the
        space. Allocated memory never falls when a knob grows (where that is shown:
        :func:`_memory_monotone`), so at each knob the values whose smallest completion may
        fit are a prefix of its domain, found by bisection; each value is visited from the
        largest down, and a subtree whose objective bound is below the ``count``-th best
        found so far is skipped before any of its memory is evaluated. ``seeds`` are
        configurations to try first (another GPU's answer): they only raise that bar
        sooner.
        """
        order = self.search_order
        domains = [self.domains[n] for n in order]
        mins = [d[0] for d in domains]
        monotone = self.monotone
        heap: list[tuple[tuple[Any, ...], tuple[int, ...]]] = []
        kept: set[tuple[int, ...]] = set()
        self.visited = 0

        def offer(config: tuple[int, ...]) -> None:
            if config in kept:
                return
            item = (_order((self.rank(config), config)), config)
            if len(heap) < count:
                heapq.heappush(heap, item)
                kept.add(config)
            elif item[0] > heap[0][0]:
                kept.discard(heapq.heapreplace(heap, item)[1])
                kept.add(config)

        def bar() -> float | None:
            """The objective a subtree must reach to matter, once ``count`` are kept."""
            return heap[0][0][0][0] if len(heap) >= count else None

        reads = self.objective_reads

        def fits_below(prefix: list[int], value: int, depth: int) -> bool:
            return self.could_fit((*prefix, value, *mins[depth + 1 :]), limit)

        for seed in seeds:
            if self.resolve(seed, limit) is not None and self.valid(seed):
                offer(seed)

        def walk(depth: int, prefix: list[int]) -> None:
            allowed = self.completions(depth, prefix)
            if allowed is not None and not allowed:
                return  # no values of the knobs still open keep every rule
            if depth == len(order):
                config = tuple(prefix)
                if config not in kept and self._leaf(config, limit):
                    offer(config)
                return
            domain = domains[depth]
            if allowed is not None and order[depth] in self.rule_knobs:
                firsts = {combo[0] for combo in allowed}
                domain = tuple(v for v in domain if v in firsts)
            if order[depth] in reads:
                bounds = [self.objective_bound([*prefix, v]) for v in domain]
            else:  # the objective does not read this knob: one bound for every value
                bounds = [self.objective_bound(prefix)] * len(domain)
            need = bar()
            candidates = [i for i in range(len(domain)) if not _below(bounds[i], need)]
            if monotone:
                # the candidates whose smallest completion fits are a prefix of them
                low, high = 0, len(candidates)
                while low < high:
                    mid = (low + high) // 2
                    if fits_below(prefix, domain[candidates[mid]], depth):
                        low = mid + 1
                    else:
                        high = mid
                candidates = candidates[:low]
            for i in reversed(candidates):
                if _below(bounds[i], bar()):
                    continue  # the bar rose while the larger values were searched
                prefix.append(domain[i])
                walk(depth + 1, prefix)
                prefix.pop()

        walk(0, [])
        return [(rank, config) for (rank, _), config in sorted(heap, reverse=True)]

    def smallest_valid(self) -> tuple[tuple[int, ...], _Eval] | None:
        """The valid configuration with the smallest device footprint (branch and bound
        where memory is monotone, else every configuration)."""
        prune = self.monotone and not self.exhaustive
        order = self.search_order
        domains = [self.domains[n] for n in order]
        mins = [d[0] for d in domains]
        best: list[tuple[int, tuple[int, ...], _Eval]] = []

        def walk(depth: int, prefix: list[int]) -> None:
            allowed = None if self.exhaustive else self.completions(depth, prefix)
            if allowed is not None and not allowed:
                return  # no values of the knobs still open keep every rule
            if depth == len(order):
                config = tuple(prefix)
                if not self.valid(config):
                    return
                ev = self.smallest_eval(config)
                size = ev.evaluation.reserved_bytes
                if not best or size < best[0][0]:
                    best[:] = [(size, config, ev)]
                return
            for value in domains[depth]:
                bound = (*prefix, value, *mins[depth + 1 :])
                if prune and best and self.lower_bound(bound) >= best[0][0]:
                    break
                prefix.append(value)
                walk(depth + 1, prefix)
                prefix.pop()

        walk(0, [])
        if not best:
            return None
        return best[0][1], best[0][2]


def _breakdown(budget: Budget, ev: Evaluation) -> dict[str, int]:
    out = {"cuda_context": budget.context_bytes, "cublas_workspace": budget.workspace_bytes}
    out.update(ev.terms)
    out["allocator_slack"] = ev.slack_bytes
    if budget.pool_bytes is not None:
        used = budget.workspace_bytes + ev.framework_reserved_bytes
        out["jax_pool_unused"] = max(0, budget.pool_bytes - used)
    return out


def _knobs(space: _Space, config: tuple[int, ...], on_gpu: bool) -> dict[str, int | str]:
    values = space.values(config)
    knobs: dict[str, int | str] = {n: values[n] for n in space.workload.knobs}
    if space.placement == "auto" and space.family.placement_knob is not None:
        knobs[space.family.placement_knob] = "gpu" if on_gpu else "host"
    return knobs


def _growth(before: Evaluation, after: Evaluation) -> str:
    """The term that grows most from ``before`` to ``after``."""
    deltas = {name: after.terms.get(name, 0) - before.terms.get(name, 0) for name in after.terms}
    deltas["allocator_slack"] = after.slack_bytes - before.slack_bytes
    return max(sorted(deltas), key=lambda n: deltas[n])


def _binding(space: _Space, config: tuple[int, ...], chosen: _Eval, limit: _Limit) -> str:
    """Why the next bigger configuration (one knob one step up, priority order) is not it.

    Only the knobs the objective reads can limit it: when they all sit at the top of their
    ranges, the plan is limited by the knob ranges, whatever stops a knob the objective
    does not read (a larger ``num_minibatches`` gains no throughput).
    """
    in_objective = [n for n in space.priority_order if n in space.objective.names]
    for name in in_objective or space.priority_order:
        index = space.search_order.index(name)
        domain = space.domains[name]
        position = domain.index(config[index])
        if position + 1 >= len(domain):
            continue
        trial = list(config)
        trial[index] = domain[position + 1]
        bigger = tuple(trial)
        if space.resolve(bigger, limit) is None:
            if space.placement != "gpu":
                host_ev = space.evaluation(bigger, False)
                if limit.holds(host_ev) and not space.host_ok(host_ev):
                    return "host_memory"
            after = space.smallest_eval(bigger).evaluation
            return _growth(chosen.evaluation, after)
        broken = space.broken_rule(space.values(bigger))
        if broken is not None:
            return f"rule: {broken.name}"
        # it fits and keeps the rules but ranks lower (the objective falls): not a limit
    return "knob ranges"


def _single(space: _Space, budget: Budget, gpu: GpuSpec) -> Plan:
    """Every knob pinned: report the configuration as it is, fitting or not."""
    config = tuple(space.domains[n][0] for n in space.search_order)
    values = space.values(config)
    pins = {n: values[n] for n in space.workload.knobs}
    # a pin may leave its knob's declared range on purpose; the framework's rules still hold
    violations = [v for v in check(space.workload, pins) if not v.rule.startswith("knobs.")]
    if violations:
        first = violations[0]
        raise ConfigError(first.message, key_path=first.rule, hint="run memfit check for fixes")
    fitted = space.resolve(config, _Limit.of(budget))
    ev = fitted or space.smallest_eval(config)
    breakdown = _breakdown(budget, ev.evaluation)
    fits = fitted is not None and budget.breaking_term is None
    predicted = sum(breakdown.values())
    binding: str | None = None
    if not fits:
        binding = budget.breaking_term or max(
            sorted(ev.evaluation.terms), key=lambda n: ev.evaluation.terms[n]
        )
        if fitted is None and not space.host_ok(ev.evaluation):
            binding = "host_memory"
    return _finish(
        space,
        gpu,
        budget,
        Plan(
            gpu=gpu.name,
            budget_bytes=budget.budget_bytes,
            predicted_bytes=predicted,
            fits=fits,
            knobs=_knobs(space, config, ev.on_gpu),
            breakdown=breakdown,
            binding=binding,
            alternatives=[],
            host_bytes=ev.evaluation.host_bytes,
        ),
    )


def _no_valid_setting(space: _Space) -> ConfigError:
    """Why no configuration keeps every rule: the pinned values, when there are any."""
    name = space.workload.name
    if not space.pinned:
        return ConfigError(
            f"no setting of the knobs of {name} keeps every rule",
            key_path="constraints",
            hint="run memfit check to see which rules conflict, or widen the knob ranges",
        )
    pins = " ".join(f"--set {k}={v}" for k, v in space.pinned.items())
    known = {**space.env, **space.pinned}
    broken = [
        rule
        for rule in space.rules
        if all(n in known for n in rule.names) and not rule.holds(known)
    ]
    outside = [
        f"{k}={v} is outside its range ({space.workload.knobs[k].describe()})"
        for k, v in space.pinned.items()
        if v not in space.workload.knobs[k].values()
    ]
    if broken:
        why = f"{pins} breaks the rule {broken[0].name}"
    else:
        why = f"with {pins}, no value of the other knobs of {name} keeps every rule"
    if outside:
        why += "; " + "; ".join(outside)
    return ConfigError(
        why,
        key_path="--set",
        hint=f"run memfit check WORKLOAD {pins} for the nearest valid settings",
    )


def _infeasible(space: _Space, budget: Budget, gpu: GpuSpec) -> InfeasiblePlan:
    name = space.workload.name
    if budget.breaking_term == "jax_preallocation":
        assert budget.pool_bytes is not None
        room = budget.budget_bytes - budget.context_bytes
        fraction = max(room, 0) / budget.total_bytes
        if fraction < 0.01:  # no pool fraction helps: the context alone fills the budget
            return InfeasiblePlan(
                f"the CUDA context ({format_bytes(budget.context_bytes)}) leaves no room on "
                f"{gpu.name} within a budget of {format_bytes(budget.budget_bytes)}",
                smallest_bytes=budget.context_bytes + budget.workspace_bytes,
                budget_bytes=budget.budget_bytes,
                binding_term="cuda_context",
                hint="use a GPU with more memory, or lower --margin",
            )
        return InfeasiblePlan(
            f"JAX preallocates {format_bytes(budget.pool_bytes)} on {gpu.name}, more than the "
            f"{format_bytes(max(room, 0))} left after the CUDA context, other processes and "
            "the margin",
            smallest_bytes=budget.context_bytes + budget.pool_bytes,
            budget_bytes=budget.budget_bytes,
            binding_term="jax_preallocation",
            hint=f"set XLA_PYTHON_CLIENT_MEM_FRACTION={fraction:.2f} (jax.mem_fraction in the "
            "workload) or XLA_PYTHON_CLIENT_PREALLOCATE=false",
        )
    smallest = space.smallest_valid()
    if smallest is None:
        raise _no_valid_setting(space)
    config, ev = smallest
    breakdown = _breakdown(budget, ev.evaluation)
    if budget.pool_bytes is not None:
        breakdown.pop("jax_pool_unused", None)
    footprint = sum(breakdown.values())
    terms = ev.evaluation.terms
    breaking = max(sorted(terms), key=lambda n: terms[n]) if terms else "cuda_context"
    if budget.breaking_term == "cuda_context":
        breaking = "cuda_context"
    device_fits = _Limit.of(budget).holds(ev.evaluation)
    if not ev.on_gpu and not space.host_ok(ev.evaluation) and device_fits:
        return InfeasiblePlan(
            f"{name}'s replay buffer on the host needs {format_bytes(ev.evaluation.host_bytes)} "
            "of host RAM even at its smallest valid configuration, over the "
            f"{format_bytes(space.host_budget_bytes or 0)} it may use ("
            f"{format_bytes(space.host_memory_bytes or 0)} less a {space.margin:.0%} margin)",
            smallest_bytes=footprint,
            budget_bytes=budget.budget_bytes,
            binding_term="host_memory",
            hint="lower buffer_size, set replay.optimize_memory_usage: true, or use a machine "
            "with more RAM",
        )
    knobs = ", ".join(f"{k}={v}" for k, v in _knobs(space, config, ev.on_gpu).items())
    limit_text = (
        f"JAX's preallocated pool of {format_bytes(budget.pool_bytes)}"
        if budget.pool_bytes is not None
        else f"a budget of {format_bytes(budget.budget_bytes)}"
    )
    if breaking == "cuda_context":
        size = breakdown.get("cuda_context", 0)
        what = "the CUDA context alone leaves no room"
        hint = "use a GPU with more memory, or lower --margin"
    else:
        size = terms.get(breaking, 0)
        what = f"the largest term is {breaking}"
        hint = (
            f"use a GPU with more memory, lower the smallest values of the knobs that drive "
            f"{breaking}, or lower --margin"
        )
    return InfeasiblePlan(
        f"{name} does not fit {gpu.name}: its smallest valid configuration ({knobs or 'fixed'}) "
        f"needs {format_bytes(footprint)}, over {limit_text}; {what} "
        f"({format_bytes(size)})",
        smallest_bytes=footprint,
        budget_bytes=budget.budget_bytes,
        binding_term=breaking,
        hint=hint,
    )


def _would_fit(space: _Space, gpu: GpuSpec, budget: Budget) -> list[dict[str, Any]]:
    """The family's fallbacks, each planned: what fits when the request does not."""
    family = space.family
    if family.fallbacks is None:
        return []
    out: list[dict[str, Any]] = []
    for fallback in family.fallbacks(space.workload):
        data = deep_merge(space.workload.model_dump(exclude_none=True), fallback.changes)
        try:
            changed = Workload.model_validate(data)
            overrides = {k: v for k, v in space.overrides.items() if k not in fallback.unpin}
            trial = _Space(
                changed, overrides, space.measured, space.host_memory_bytes, margin=space.margin
            )
            trial.exhaustive = space.exhaustive
            again = _budget(
                changed, gpu, budget.margin, budget.other_processes_bytes, budget.context_bytes
            )
            result = _plan_on(trial, gpu, again, 0, fallbacks=False)
        except InfeasiblePlan as exc:
            out.append({"change": fallback.label, "fits": False, "binding": exc.binding_term})
            continue
        except (ConfigError, ValueError):
            continue
        values = {k: v for k, v in result.knobs.items() if isinstance(v, int)}
        placed = result.knobs.get(family.placement_knob or "", None)
        on_device = trial.placement == "gpu" or placed == "gpu"
        ev = evaluate(changed, {**trial.env, **values}, measured=space.measured,
                      on_device=on_device)  # fmt: skip
        out.append(
            {
                "change": fallback.label,
                "fits": result.fits,
                "binding": None if result.fits else result.binding,
                "knobs": dict(result.knobs),
                "predicted_bytes": result.predicted_bytes,
                "host_bytes": ev.host_bytes,
            }
        )
    return out


def _would_fit_text(options: list[dict[str, Any]]) -> str | None:
    fitting = [o for o in options if o.get("fits")]
    if not fitting:
        return None
    parts = []
    for o in fitting:
        knobs = ", ".join(f"{k}={v}" for k, v in o["knobs"].items())
        host = f", {format_bytes(o['host_bytes'])} of host RAM" if o.get("host_bytes") else ""
        parts.append(f"{o['change']} ({knobs}{host})")
    return "would fit: " + "; ".join(parts)


def _infeasible_with_fallbacks(
    space: _Space, budget: Budget, gpu: GpuSpec, fallbacks: bool
) -> InfeasiblePlan:
    exc = _infeasible(space, budget, gpu)
    if fallbacks:
        text = _would_fit_text(_would_fit(space, gpu, budget))
        if text is not None:
            exc.hint = f"{text}; or {exc.hint}" if exc.hint else text
    return exc


def _plan_on(
    space: _Space, gpu: GpuSpec, budget: Budget, alternatives: int, *, fallbacks: bool = True
) -> Plan:
    if space.pinned_all:
        plan_ = _single(space, budget, gpu)
        if not plan_.fits and not space.pinned:
            # the workload itself allows one configuration (nothing was pinned): nothing fits
            raise _infeasible_with_fallbacks(space, budget, gpu, fallbacks)
        if not plan_.fits and fallbacks:
            plan_ = replace(plan_, would_fit=_would_fit(space, gpu, budget))
        return plan_
    if budget.breaking_term is not None:
        raise _infeasible_with_fallbacks(space, budget, gpu, fallbacks)
    limit = _Limit.of(budget)
    ranked = space.top(limit, 1 + alternatives * 8)
    if not ranked:
        raise _infeasible_with_fallbacks(space, budget, gpu, fallbacks)
    best = ranked[0][1]
    chosen = space.resolve(best, limit)
    assert chosen is not None  # the search only keeps configurations that fit
    breakdown = _breakdown(budget, chosen.evaluation)
    binding = _binding(space, best, chosen, limit)
    plan_ = Plan(
        gpu=gpu.name,
        budget_bytes=budget.budget_bytes,
        predicted_bytes=sum(breakdown.values()),
        fits=True,
        knobs=_knobs(space, best, chosen.on_gpu),
        breakdown=breakdown,
        binding=binding,
        alternatives=_alternatives(space, budget, limit, ranked, alternatives),
        host_bytes=chosen.evaluation.host_bytes,
    )
    plan_ = _finish(space, gpu, budget, plan_)
    if binding == "knob ranges":
        plan_.notes.append(_range_note(space, best, limit))
    return plan_


def _alternatives(
    space: _Space,
    budget: Budget,
    limit: _Limit,
    ranked: list[tuple[_Rank, tuple[int, ...]]],
    count: int,
) -> list[dict[str, Any]]:
    """The next best configurations after ``ranked[0]``, each differing from the chosen one
    and from the others listed in its objective or in the memory the job itself takes
    (a line that repeats another's figures tells the reader nothing)."""
    seen: set[tuple[float, int]] = set()
    out: list[dict[str, Any]] = []
    for index, (rank, config) in enumerate(ranked):
        alt = space.resolve(config, limit)
        assert alt is not None
        alt_breakdown = _breakdown(budget, alt.evaluation)
        predicted = sum(alt_breakdown.values())
        used = predicted - alt_breakdown.get("jax_pool_unused", 0)
        key = (rank[0], used // 2**20)
        if key in seen:
            continue
        seen.add(key)
        if index == 0:
            continue
        out.append(
            {
                "knobs": _knobs(space, config, alt.on_gpu),
                "predicted_bytes": predicted,
                "used_bytes": used,
                "objective": rank[0],
            }
        )
        if len(out) == count:
            break
    return out


def _next_value(space: _Space, name: str, value: int) -> int | None:
    """The value a knob would take after ``value`` if its range went on."""
    spec = space.workload.knobs[name]
    if spec.choices is not None:
        values = spec.values()
        return value + (values[-1] - values[-2]) if len(values) > 1 else None
    if spec.powers_of_two:
        return value * 2
    return value + (spec.step or 1)


def _range_note(space: _Space, config: tuple[int, ...], limit: _Limit) -> str:
    """Say plainly that the knob ranges, not memory, stop the plan, and whether the next
    value of the first knob at its top would still fit."""
    at_top = [
        n
        for n in space.priority_order
        if n not in space.pinned
        and len(space.domains[n]) > 1
        and config[space.search_order.index(n)] == space.domains[n][-1]
    ]
    if not at_top:
        return (
            "limited by the knob ranges, not by memory: no larger value of any knob keeps "
            "every rule"
        )
    name = at_top[0]
    value = config[space.search_order.index(name)]
    text = (
        f"limited by the knob range, not by memory: {name}={value} is the largest value "
        f"knobs.{name} allows"
    )
    beyond = _next_value(space, name, value)
    if beyond is not None:
        values = {**space.values(config), name: beyond}
        ev = evaluate(space.workload, values, measured=space.measured, on_device=True)
        if limit.holds(ev):
            text += f"; {name}={beyond} would fit too (raise knobs.{name}.max to plan it)"
        else:
            text += f"; {name}={beyond} would not fit"
    return text


def _finish(space: _Space, gpu: GpuSpec, budget: Budget, plan_: Plan) -> Plan:
    """Add what every plan carries besides its numbers: the GPU's total, the pool, the
    allocator settings and the notes that explain them."""
    workload = space.workload
    notes: list[str] = []
    size = size_note(gpu)
    if size is not None:
        notes.append(size)
    advice = budget.advice
    if budget.pool_bytes is not None and advice is not None:
        if workload.jax.mem_fraction is None:
            notes.append(f"XLA_PYTHON_CLIENT_MEM_FRACTION={advice.value}: {advice.reason}")
        elif f"{workload.jax.mem_fraction:.2f}" != advice.value:
            notes.append(
                f"the workload sets jax.mem_fraction {workload.jax.mem_fraction:.2f}; memfit "
                f"recommends {advice.value} here ({advice.reason}); leave jax.mem_fraction "
                "out to plan with it"
            )
    if workload.simulator is not None:
        base, per_env, per_pixel, source = workload.simulator.resolved()
        name = workload.simulator.name or workload.simulator.preset
        notes.append(
            f"simulator {name}: {format_bytes(base)} at start, {format_bytes(per_env)} per env, "
            f"{per_pixel:,} B per camera pixel ({source}); outside the framework's allocator. "
            "With it in this process, call memfit.autoconfig after it starts to plan against "
            "what it really holds"
        )
    if gpu.arch == "cpu":
        notes.append(
            "planned for the host: the job trains on the CPU, everything (replay buffer "
            "included) in host RAM; no CUDA context, no allocator settings to apply"
        )
    if (
        workload.framework == "jax"
        and workload.jax.preallocate
        and not _preallocates(workload)
        and gpu.arch != "cpu"
    ):
        notes.append(
            "XLA_PYTHON_CLIENT_PREALLOCATE=false: the simulator in this process takes memory "
            "outside XLA's pool that grows with num_envs, so the two share the card as they "
            "need it (give jax.mem_fraction to plan with a pool instead)"
        )
    if plan_.host_bytes and space.host_memory_bytes is not None:
        notes.append(
            f"host RAM: {format_bytes(plan_.host_bytes)} in it, of a "
            f"{format_bytes(space.host_budget_bytes or 0)} budget: "
            f"{format_bytes(space.host_memory_bytes)} less the {space.margin:.0%} margin "
            "the GPU keeps too"
        )
    if gpu.arch == "cpu":
        notes.append(
            f"margin: {budget.margin:.0%} of the host RAM is left free, the same rule as on a "
            "GPU (--margin)"
        )
    environment = workload_settings(
        workload.framework,
        jax_preallocate=_preallocates(workload),
        pool_fraction=budget.pool_fraction,
        gpu=gpu,
    )
    return replace(
        plan_,
        host_memory_bytes=space.host_memory_bytes,
        host_budget_bytes=space.host_budget_bytes,
        gpu_total_bytes=gpu.total_bytes,
        pool_bytes=budget.pool_bytes,
        environment=environment,
        notes=[*notes, *plan_.notes],
    )


def _budget(
    workload: Workload,
    gpu: GpuSpec,
    margin: float,
    other_processes_bytes: int,
    context_bytes: int | None = None,
    runtime: Runtime | None = None,
) -> Budget:
    return compose_budget(
        gpu,
        framework=workload.framework,
        margin=margin,
        other_processes_bytes=other_processes_bytes,
        jax_preallocate=_preallocates(workload),
        jax_mem_fraction=workload.jax.mem_fraction,
        context_bytes=context_bytes,
        runtime=runtime,
    )


def _with_context(plan_: Plan, budget: Budget) -> Plan:
    """The plan with how its context term was sized (not when the context was given)."""
    if budget.context is None:
        return plan_
    return replace(plan_, context=budget.context.to_dict())


def _preallocates(workload: Workload) -> bool:
    """Whether the plan models XLA's preallocated pool. A simulator in the job's process
    takes memory outside the pool that grows with the environments, so without a fraction
    the workload sets, memfit's recommendation there is no preallocation (the two share the
    card as they need it)."""
    if workload.simulator is not None and workload.jax.mem_fraction is None:
        return False
    return workload.jax.preallocate


def plan_for_gpu(
    workload: Workload,
    gpu: GpuSpec,
    overrides: Mapping[str, int] | None = None,
    margin: float = DEFAULT_MARGIN,
    measured: MeasuredTerms | None = None,
    other_processes_bytes: int = 0,
    *,
    host_memory_bytes: int | None = None,
    alternatives: int = DEFAULT_ALTERNATIVES,
    context_bytes: int | None = None,
    runtime: Runtime | None = None,
) -> Plan:
    """The best configuration of ``workload`` on ``gpu``.

    Args:
        workload: The workload.
        gpu: The GPU.
        overrides: Knob values to pin (``--set``) or settings to change.
        margin: Safety margin, a fraction of the GPU's total memory.
        measured: Measured parameter/activation terms from an estimator.
        other_processes_bytes: Memory other processes already hold on the GPU.
        host_memory_bytes: Host RAM for a replay buffer on the host (default: the
            workload's ``host_memory_bytes``; ``None``: not checked).
        alternatives: How many next-best configurations to list.
        context_bytes: The job's CUDA context; ``None``: the estimate for ``gpu`` and
            ``runtime``; ``0`` when the process already has one and
            ``other_processes_bytes`` counts it (``memfit.autoconfig``).
        runtime: The target's software (:class:`memfit.hardware.runtime.Runtime`), which sizes
            the CUDA context; ``None``: lazy module loading, versions unknown.

    Returns:
        The plan. With every knob pinned it reports that configuration, fitting or not;
        otherwise it is the best fitting configuration.

    Raises:
        InfeasiblePlan: When no configuration that keeps every rule fits (with the smallest
            footprint and the term that breaks it).
        ConfigError: When an override names an unknown knob, a rule or the objective is
            malformed, no knob setting keeps every rule, or the margin is out of range.

    >>> from memfit.hardware.catalog import gpu
    >>> from memfit.core.workload import load_workload
    >>> p = plan_for_gpu(load_workload("brax_humanoid_ppo"), gpu("RTX 4090"))
    >>> p.fits and sum(p.breakdown.values()) == p.predicted_bytes <= p.budget_bytes
    True
    """
    space = _Space(
        workload,
        overrides,
        measured,
        host_memory_bytes,
        device_is_host=gpu.is_host,
        margin=margin,
    )
    budget = _budget(workload, gpu, margin, other_processes_bytes, context_bytes, runtime)
    return _with_context(_plan_on(space, gpu, budget, alternatives), budget)


def plan_many(
    workload: Workload,
    gpus: Sequence[GpuSpec],
    overrides: Mapping[str, int] | None = None,
    margin: float = DEFAULT_MARGIN,
    measured: MeasuredTerms | None = None,
    *,
    host_memory_bytes: int | None = None,
    alternatives: int = DEFAULT_ALTERNATIVES,
    runtime: Runtime | None = None,
) -> list[Plan | InfeasiblePlan]:
    """Plans for several GPUs (a tier table), sharing one evaluation cache.

    Returns:
        One entry per GPU, in order: its :class:`Plan`, or the :class:`InfeasiblePlan` that
        says why nothing fits it.

    Raises:
        ConfigError: As :func:`plan` (these do not depend on the GPU).
    """
    space = _Space(workload, overrides, measured, host_memory_bytes, margin=margin)
    out: list[Plan | InfeasiblePlan] = []
    for spec in gpus:
        budget = _budget(workload, spec, margin, 0, None, runtime)
        try:
            out.append(_with_context(_plan_on(space, spec, budget, alternatives), budget))
        except InfeasiblePlan as exc:
            out.append(exc)
    return out


@dataclass(frozen=True)
class FeasibleSpace:
    """Every configuration of a workload that keeps its rules and fits one GPU (issue 24).

    What a sweep draws from: :mod:`memfit.integrations.optuna` suggests only these
    configurations, and :mod:`memfit.integrations.ray` drops the others. The knobs are in
    the planner's search order (priority, high first); a knob derived from another
    (``effective_batch``'s accumulation) and the planner's placement knob are in each
    configuration's ``knobs`` but are not searched.

    Attributes:
        gpu: The GPU's name.
        budget_bytes: What the GPU leaves for the job (total less others and margin).
        order: The searched knobs, in search order.
        domains: Each searched knob's declared values (a knob pinned by ``overrides`` has
            only its pinned value), ascending.
        configs: The configurations, each the knob values a plan would report
            (``Plan.knobs``), in the order the search found them.
        predicted_bytes: Each configuration's predicted peak (as ``Plan.predicted_bytes``).
        used_bytes: What each configuration's job itself takes (as ``Plan.used_bytes``:
            without the unused part of a preallocated JAX pool).
    """

    gpu: str
    budget_bytes: int
    order: tuple[str, ...]
    domains: dict[str, tuple[int, ...]]
    configs: tuple[dict[str, int | str], ...]
    predicted_bytes: tuple[int, ...]
    used_bytes: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.configs)

    def values(self, knob: str, given: Mapping[str, int | str] | None = None) -> tuple[int, ...]:
        """The values of ``knob`` some feasible configuration takes with the ``given`` values
        of other knobs, ascending (empty when none does).

        Raises:
            ConfigError: When ``knob`` is not a searched knob.
        """
        if knob not in self.domains:
            raise ConfigError(
                f"{knob!r} is not a searched knob of this space",
                key_path=f"knobs.{knob}",
                hint="searched knobs: " + ", ".join(self.order),
            )
        given = dict(given or {})
        found = {
            int(c[knob])
            for c in self.configs
            if all(c.get(name) == value for name, value in given.items())
        }
        return tuple(sorted(found))

    def index(self, knobs: Mapping[str, int | str]) -> int | None:
        """The position in :attr:`configs` of the configuration with these values of the
        searched knobs, or ``None`` when it is not feasible."""
        key = tuple(knobs.get(name) for name in self.order)
        for i, config in enumerate(self.configs):
            if tuple(config[name] for name in self.order) == key:
                return i
        return None


def feasible_space(
    workload: Workload,
    gpu: GpuSpec,
    overrides: Mapping[str, int] | None = None,
    margin: float = DEFAULT_MARGIN,
    measured: MeasuredTerms | None = None,
    other_processes_bytes: int = 0,
    *,
    host_memory_bytes: int | None = None,
    context_bytes: int | None = None,
    runtime: Runtime | None = None,
) -> FeasibleSpace:
    """Every configuration of ``workload`` that keeps its rules and fits ``gpu``, by the
    same search and the same memory model as :func:`plan_for_gpu` (arguments as there).

    Raises:
        InfeasiblePlan: When no configuration fits (as :func:`plan_for_gpu`).
        ConfigError: As :func:`plan_for_gpu`.

    >>> from memfit.hardware.catalog import gpu
    >>> from memfit.core.workload import load_workload
    >>> w = load_workload("brax_humanoid_ppo")
    >>> space = feasible_space(w, gpu("RTX 4070"))
    >>> best = plan_for_gpu(w, gpu("RTX 4070"))
    >>> best.knobs in space.configs and max(space.predicted_bytes) <= space.budget_bytes
    True
    """
    space = _Space(
        workload, overrides, measured, host_memory_bytes, device_is_host=gpu.is_host, margin=margin
    )
    budget = _budget(workload, gpu, margin, other_processes_bytes, context_bytes, runtime)
    if budget.breaking_term is not None:
        raise _infeasible_with_fallbacks(space, budget, gpu, False)
    limit = _Limit.of(budget)
    found = (
        [(space.rank(c), c) for c in [tuple(space.domains[n][0] for n in space.search_order)]]
        if space.pinned_all
        else sorted(space.enumerate_all(limit), key=_order, reverse=True)
    )
    configs: list[dict[str, int | str]] = []
    predicted: list[int] = []
    used: list[int] = []
    for _, config in found:
        chosen = space.resolve(config, limit)
        if chosen is None or not space.valid(config):
            continue  # only reachable for the single pinned configuration
        breakdown = _breakdown(budget, chosen.evaluation)
        configs.append(_knobs(space, config, chosen.on_gpu))
        predicted.append(sum(breakdown.values()))
        used.append(predicted[-1] - breakdown.get("jax_pool_unused", 0))
    if not configs:
        raise _infeasible_with_fallbacks(space, budget, gpu, False)
    return FeasibleSpace(
        gpu=gpu.name,
        budget_bytes=budget.budget_bytes,
        order=tuple(space.search_order),
        domains={n: space.domains[n] for n in space.search_order},
        configs=tuple(configs),
        predicted_bytes=tuple(predicted),
        used_bytes=tuple(used),
    )
