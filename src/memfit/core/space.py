"""The knob space of a workload and its exact search (pure).

:class:`Space` searches the discrete knob space of a workload deterministically, and gives
exactly what enumerating every configuration would give (a property test checks it against
``Space.enumerate_all``), without enumerating it:

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
  (:meth:`Space.completions`);
* only the best ``1 + 8 x alternatives`` configurations are kept, ranked by one key
  (:meth:`Space.rank`: the workload's objective, the throughput proxy; at equal objective
  the configuration that keeps the knobs the objective does not read at their declared
  defaults (the user's hyperparameters) wins, then the one that needs less memory, then the
  knob values in priority order);
* the evaluation of a configuration does not depend on the GPU (the GPU adds constants), so
  :func:`plan_many` shares one cache over a whole tier table, and each GPU's search starts
  from the previous GPU's answer.

With ``effective_batch`` declared, the accumulation knob is not searched: it is
``value // micro`` for each micro-batch that divides the effective batch.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from memfit.allocator.xla_fraction import DEFAULT_MARGIN
from memfit.core._bounds import nondecreasing, upper_bound
from memfit.core.budget import Budget
from memfit.core.constraints import (
    CompiledRule,
    apply_overrides,
    compile_rules,
    environment,
    parse_expr,
    range_violation,
    require_known,
)
from memfit.core.evaluate import Evaluation, evaluate, family_for
from memfit.core.measured import MeasuredTerms
from memfit.core.workload import Workload
from memfit.errors import ConfigError

#: Largest number of complete configurations one search may visit.
MAX_CONFIGURATIONS = 2_000_000


#: Largest number of combinations of the open knobs the rules read that the search lists
#: at once to skip, before any memory is evaluated, a subtree where no rule can hold.
MAX_COMPLETIONS = 4096


#: A configuration's rank (larger is better): objective, defaults kept, -reserved bytes,
#: knob values in priority order.
Rank = tuple[float, int, int, tuple[int, ...]]


@dataclass(frozen=True)
class SpaceEval:
    """One configuration's memory, placement resolved."""

    evaluation: Evaluation
    on_gpu: bool


@dataclass(frozen=True)
class Limit:
    """What a configuration may take: the framework's allocator (``job``) and, with a JAX
    pool, the device memory outside it (``outside``; ``None`` without a pool, where terms
    outside the allocator share ``job``)."""

    job: int
    outside: int | None = None

    @classmethod
    def of(cls, budget: Budget) -> Limit:
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
Ranked = tuple["Rank", tuple[int, ...]]


def ranked_order(item: Ranked) -> tuple[Any, ...]:
    """The total order of ranked configurations: the rank, then (at an equal rank) the
    configuration that comes first in ascending enumeration order."""
    rank, config = item
    return rank, tuple(-v for v in config)


def _below(bound: float | None, bar: float | None) -> bool:
    """Whether an objective bound is strictly under the bar (no bound or no bar: ``False``)."""
    return bound is not None and bar is not None and bound < bar


#: The PPO layouts whose minibatch is the rollout divided by a count: that knob lowers
#: memory as it grows (skrl's ``mini_batches``, the usual lever against ``num_envs``).
_MINIBATCH_DIVISORS = {
    "cleanrl": "num_minibatches",
    "skrl": "mini_batches",
    "rsl_rl": "num_mini_batches",
}


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
    if workload.family == "ppo" and workload.ppo is not None:
        # the minibatch is the rollout divided by this knob: more minibatches, less memory
        divisor = _MINIBATCH_DIVISORS.get(workload.ppo.layout)
        if divisor is not None and divisor in workload.knobs:
            return False
    if workload.family == "custom":
        from memfit.core.families.custom import compile_terms

        knobs = frozenset(workload.knobs)
        names = {"device_count": workload.device_count, **constants}
        for spec in compile_terms(workload).values():  # checked: a bad term says which
            if not isinstance(spec, int) and not nondecreasing(spec, knobs, names):
                return False
    return True


class Space:
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
        host_reserve: Mapping[str, int] | None = None,
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
        # host RAM keeps the GPU's margin rule: a share of the total is left free; what the
        # job's own process and the OS hold (host_reserve, named) is not the job's state's
        self.margin = margin
        self.host_reserve: dict[str, int] = dict(host_reserve or {})
        self.host_budget_bytes = (
            None
            if self.host_memory_bytes is None
            else max(
                0,
                self.host_memory_bytes
                - int(self.host_memory_bytes * margin)
                - sum(self.host_reserve.values()),
            )
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
        self._ranks: dict[tuple[int, ...], Rank] = {}
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

    def resolve(self, config: tuple[int, ...], limit: Limit) -> SpaceEval | None:
        """The configuration's memory with its placement, or ``None`` if it cannot fit."""
        if self.placement in ("gpu", "auto"):
            ev = self.evaluation(config, True)
            if limit.holds(ev):
                return SpaceEval(ev, True)
            if self.placement == "gpu":
                return None
        ev = self.evaluation(config, False)
        if limit.holds(ev) and self.host_ok(ev):
            return SpaceEval(ev, False)
        return None

    def could_fit(self, config: tuple[int, ...], limit: Limit) -> bool:
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

    def smallest_eval(self, config: tuple[int, ...]) -> SpaceEval:
        """The smallest device footprint of a configuration over the allowed placements."""
        if self.placement == "host":
            return SpaceEval(self.evaluation(config, False), False)
        gpu_ev = self.evaluation(config, True)
        if self.placement == "gpu":
            return SpaceEval(gpu_ev, True)
        host_ev = self.evaluation(config, False)
        if self.host_ok(host_ev) and host_ev.reserved_bytes < gpu_ev.reserved_bytes:
            return SpaceEval(host_ev, False)
        return SpaceEval(gpu_ev, True)

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

    def rank(self, config: tuple[int, ...]) -> Rank:
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

    def _leaf(self, config: tuple[int, ...], limit: Limit) -> bool:
        """Count one complete configuration visited; whether it fits and keeps the rules."""
        self.visited += 1
        if self.visited > MAX_CONFIGURATIONS:
            raise ConfigError(
                f"the knob space has more than {MAX_CONFIGURATIONS} configurations to visit",
                key_path="knobs",
                hint="narrow the knob ranges, or pin some knobs with --set",
            )
        return self.valid(config) and self.resolve(config, limit) is not None

    def enumerate_all(self, limit: Limit) -> list[Ranked]:
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
        return upper_bound(self.objective, box)

    def top(self, limit: Limit, count: int) -> list[Ranked]:
        """The ``count`` best configurations that fit ``limit`` and keep the rules, best
        first (:meth:`search`; with ``exhaustive`` set, from :meth:`enumerate_all`: the same
        list, the reference the tests compare with)."""
        if self.exhaustive:
            found = sorted(self.enumerate_all(limit), key=ranked_order, reverse=True)[:count]
        else:
            found = self.search(limit, count, self.last_top)
        self.last_top = [config for _, config in found]
        return found

    def search(
        self, limit: Limit, count: int, seeds: Sequence[tuple[int, ...]] = ()
    ) -> list[Ranked]:
        """The ``count`` best configurations that fit ``limit`` and keep the rules, best
        first: exactly the first ``count`` of :meth:`enumerate_all` in :func:`ranked_order`.

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
            item = (ranked_order((self.rank(config), config)), config)
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

    def smallest_valid_above(self, objective: float) -> tuple[tuple[int, ...], SpaceEval] | None:
        """Among the valid configurations whose objective is larger than ``objective``, the
        one with the smallest device footprint, whatever the memory (``None``: no valid
        configuration of the knob ranges does better): what a plan would need to grow.

        Branch and bound as :meth:`smallest_valid`, and a subtree whose objective bound is
        not above ``objective`` is skipped."""
        prune = self.monotone and not self.exhaustive
        order = self.search_order
        domains = [self.domains[n] for n in order]
        mins = [d[0] for d in domains]
        best: list[tuple[int, tuple[int, ...], SpaceEval]] = []

        def walk(depth: int, prefix: list[int]) -> None:
            bound = self.objective_bound(prefix)
            if bound is not None and bound <= objective:
                return  # nothing below does better than the plan
            allowed = None if self.exhaustive else self.completions(depth, prefix)
            if allowed is not None and not allowed:
                return
            if depth == len(order):
                config = tuple(prefix)
                if not self.valid(config):
                    return
                if self.objective.evaluate(self.values(config)) <= objective:
                    return
                ev = self.smallest_eval(config)
                size = ev.evaluation.reserved_bytes
                if not best or size < best[0][0]:
                    best[:] = [(size, config, ev)]
                return
            for value in domains[depth]:
                low = (*prefix, value, *mins[depth + 1 :])
                if prune and best and self.lower_bound(low) >= best[0][0]:
                    break
                prefix.append(value)
                walk(depth + 1, prefix)
                prefix.pop()

        walk(0, [])
        if not best:
            return None
        return best[0][1], best[0][2]

    def smallest_valid(self) -> tuple[tuple[int, ...], SpaceEval] | None:
        """The valid configuration with the smallest device footprint (branch and bound
        where memory is monotone, else every configuration)."""
        prune = self.monotone and not self.exhaustive
        order = self.search_order
        domains = [self.domains[n] for n in order]
        mins = [d[0] for d in domains]
        best: list[tuple[int, tuple[int, ...], SpaceEval]] = []

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
