"""What a plan says besides its numbers: the breakdown, what binds, what else would do, and
why nothing fits (pure; the search is :mod:`memfit.core.space`, the plan
:mod:`memfit.core.plan`)."""

from __future__ import annotations

from typing import Any

from memfit.allocator.xla_fraction import xla_fraction_variable
from memfit.core._workload_load import command_ref
from memfit.core.budget import Budget
from memfit.core.evaluate import Evaluation, evaluate
from memfit.core.families.registry import Fallback
from memfit.core.space import Limit, Rank, Space, SpaceEval
from memfit.errors import ConfigError, InfeasiblePlan
from memfit.hardware.catalog import GpuSpec
from memfit.units import format_bytes


def breakdown_of(budget: Budget, ev: Evaluation) -> dict[str, int]:
    out = {"cuda_context": budget.context_bytes, "cublas_workspace": budget.workspace_bytes}
    out.update(ev.terms)
    out["allocator_slack"] = ev.slack_bytes
    if budget.pool_bytes is not None:
        used = budget.workspace_bytes + ev.framework_reserved_bytes
        out["jax_pool_unused"] = max(0, budget.pool_bytes - used)
    return out


def sources_of(budget: Budget, ev: Evaluation) -> dict[str, str]:
    """How each term of :func:`breakdown_of` was obtained (its basis,
    :data:`memfit.core.bands.BASES`): the CUDA context as its estimate says (``fitted`` to
    readings of its kind, ``assumed`` where another architecture's kernel images stand in:
    :func:`memfit.hardware.runtime.cuda_context`; ``measured`` when the caller gave it),
    the cuBLAS workspace, the allocator's slack and JAX's pool by their documented rules
    (``analytic``), the rest as the terms say."""
    out = {
        "cuda_context": budget.context.basis if budget.context is not None else "measured",
        "cublas_workspace": "analytic",
    }
    out.update({name: ev.sources.get(name, "analytic") for name in ev.terms})
    out["allocator_slack"] = "analytic"
    if budget.pool_bytes is not None:
        out["jax_pool_unused"] = "analytic"
    return out


def chosen_knobs(space: Space, config: tuple[int, ...], on_gpu: bool) -> dict[str, int | str]:
    values = space.values(config)
    knobs: dict[str, int | str] = {n: values[n] for n in space.workload.knobs}
    if space.placement == "auto" and space.family.placement_knob is not None:
        knobs[space.family.placement_knob] = "gpu" if on_gpu else "host"
    return knobs


def _smallest(spec: Any) -> int | None:
    """A knob's smallest allowed value (``min``, or its smallest choice)."""
    if spec.choices:
        return int(min(spec.choices))
    return int(spec.min) if spec.min is not None else None


def grown_term(space: Space, at: SpaceEval) -> str | None:
    """Of a pinned configuration that does not fit, the term that grew most from the pinned
    knobs' smallest values to the pinned ones (what the pins made too big), or ``None``
    when no term grew (the fixed costs alone are the problem): the largest term is then
    the one to name."""
    low: dict[str, int] = {}
    for name, value in space.pinned.items():
        spec = space.workload.knobs.get(name)
        least = _smallest(spec) if spec is not None else None
        if least is not None and least < value:
            low[name] = least
    if not low:
        return None
    values = {**space.values(tuple(space.domains[n][0] for n in space.search_order)), **low}
    try:
        before = evaluate(space.workload, values, measured=space.measured, on_device=at.on_gpu)
    except (ConfigError, ValueError):
        return None
    after = at.evaluation
    deltas = {n: after.terms[n] - before.terms.get(n, 0) for n in after.terms}
    grown = max(sorted(deltas), key=lambda n: deltas[n], default=None)
    return grown if grown is not None and deltas[grown] > 0 else None


def release_pins(space: Space, given: list[Fallback]) -> list[Fallback]:
    """For a pinned configuration that does not fit: each pinned knob released (the planner
    then picks the best value of it that fits), unless a family's own fallback releases it
    already."""
    released = {name for fallback in given for name in fallback.unpin}
    out: list[Fallback] = []
    for name, value in space.pinned.items():
        spec = space.workload.knobs.get(name)
        least = _smallest(spec) if spec is not None else None
        if name in released or least is None or least >= value:
            continue
        out.append(Fallback(f"a smaller {name} (pinned at {value})", unpin=(name,)))
    return out


def _growth(before: Evaluation, after: Evaluation) -> str:
    """The term that grows most from ``before`` to ``after``."""
    deltas = {name: after.terms.get(name, 0) - before.terms.get(name, 0) for name in after.terms}
    deltas["allocator_slack"] = after.slack_bytes - before.slack_bytes
    return max(sorted(deltas), key=lambda n: deltas[n])


def binding_of(
    space: Space, config: tuple[int, ...], chosen: SpaceEval, limit: Limit, budget: Budget
) -> tuple[str, str | None]:
    """What stops a bigger configuration, and (when it is memory) a note that says what the
    next larger valid configuration would need.

    One knob one step up (priority order) first: where that configuration does not fit, the
    term that grows most is the limit. Where it breaks a rule, the next larger *valid*
    configuration decides (the valid one with a larger objective and the smallest
    footprint, other knobs free): when it does not fit, memory is the limit, not the rule;
    when there is none, the rule is. Only the knobs the objective reads can limit it: when
    they all sit at the top of their ranges, the plan is limited by the knob ranges,
    whatever stops a knob the objective does not read (a larger ``num_minibatches`` gains
    no throughput).
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
            return _over_memory(space, chosen, bigger, limit, budget)
        broken = space.broken_rule(space.values(bigger))
        if broken is not None:
            grown = _next_valid(space, config, chosen, limit, budget)
            if grown is not None:
                return grown
            return f"rule: {broken.name}", _rule_note(space, config, name, broken)
        # it fits and keeps the rules but ranks lower (the objective falls): not a limit
    grown = _next_valid(space, config, chosen, limit, budget)
    return grown if grown is not None else ("knob ranges", None)


def _rule_note(space: Space, config: tuple[int, ...], name: str, rule: Any) -> str:
    """What to raise so that ``rule`` lets ``name`` grow: the other knobs it reads that sit
    at the top of their ranges (``knobs.X.max``) or are pinned (``--set``)."""
    values = space.values(config)
    raise_max: list[str] = []
    pinned: list[str] = []
    for other in rule.names:
        if other == name or other not in space.domains:
            continue
        if other in space.pinned:
            pinned.append(f"{other}={values[other]}")
        elif values[other] == space.domains[other][-1]:
            raise_max.append(f"knobs.{other}.max")
    head = f"limited by a rule, not memory: {name}={values[name]} is the most {rule.name} allows"
    ways = []
    if raise_max:
        ways.append(f"raise {' or '.join(raise_max)} (at their maximum)")
    if pinned:
        ways.append(f"pin larger values than {', '.join(pinned)} (--set)")
    if not ways:
        return head
    return f"{head}; to plan a larger {name}, {' or '.join(ways)}"


def _next_valid(
    space: Space, config: tuple[int, ...], chosen: SpaceEval, limit: Limit, budget: Budget
) -> tuple[str, str | None] | None:
    """Memory as the limit, when a valid configuration with a larger objective exists (it
    cannot fit, or the search would have chosen it); ``None`` when none exists."""
    objective = float(space.objective.evaluate(space.values(config)))
    found = space.smallest_valid_above(objective)
    if found is None or space.resolve(found[0], limit) is not None:
        return None
    return _over_memory(space, chosen, found[0], limit, budget)


def _over_memory(
    space: Space, chosen: SpaceEval, bigger: tuple[int, ...], limit: Limit, budget: Budget
) -> tuple[str, str]:
    """The term that grows most from the plan to ``bigger`` (which does not fit), or
    ``host_memory``, with what ``bigger`` needs against what there is."""
    knobs = ", ".join(f"{k}={v}" for k, v in space.values(bigger).items() if k in space.domains)
    head = f"limited by memory: the next larger valid configuration ({knobs})"
    if space.placement != "gpu":
        host_ev = space.evaluation(bigger, False)
        if limit.holds(host_ev) and not space.host_ok(host_ev):
            return "host_memory", (
                f"{head} needs {format_bytes(host_ev.host_bytes)} of host RAM, over its "
                f"{format_bytes(space.host_budget_bytes or 0)} budget"
            )
    after = space.smallest_eval(bigger).evaluation
    term = _growth(chosen.evaluation, after)
    if budget.pool_bytes is not None:
        inside = budget.workspace_bytes + after.framework_reserved_bytes
        if inside > budget.pool_bytes:
            return term, (
                f"{head} needs {format_bytes(inside)} inside XLA's pool of "
                f"{format_bytes(budget.pool_bytes)}; {term} grows most"
            )
        outside = budget.context_bytes + budget.pool_bytes + after.outside_bytes
        return term, (
            f"{head} needs {format_bytes(outside)} on the card with XLA's pool, over the "
            f"{format_bytes(budget.budget_bytes)} budget; {term} grows most"
        )
    needs = sum(breakdown_of(budget, after).values())
    return term, (
        f"{head} needs {format_bytes(needs)}, over the {format_bytes(budget.budget_bytes)} "
        f"budget; {term} grows most"
    )


def no_valid_setting(space: Space) -> ConfigError:
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
        hint=f"run memfit check {command_ref(space.workload)} {pins} for the nearest valid "
        "settings",
    )


def margin_hint(over_bytes: int, budget: Budget) -> str:
    """``", or lower --margin"`` when giving up the safety margin could close a gap of
    ``over_bytes`` (it is no larger than the margin), else nothing: 28 GiB over an 8 GB
    card is no margin's doing."""
    return ", or lower --margin" if 0 < over_bytes <= budget.margin_bytes else ""


def infeasible_error(space: Space, budget: Budget, gpu: GpuSpec) -> InfeasiblePlan:
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
                hint="use a GPU with more memory"
                + margin_hint(
                    budget.context_bytes + budget.workspace_bytes - budget.budget_bytes, budget
                ),
            )
        return InfeasiblePlan(
            f"JAX preallocates {format_bytes(budget.pool_bytes)} on {gpu.name}, more than the "
            f"{format_bytes(max(room, 0))} left after the CUDA context, other processes and "
            "the margin",
            smallest_bytes=budget.context_bytes + budget.pool_bytes,
            budget_bytes=budget.budget_bytes,
            binding_term="jax_preallocation",
            hint=f"set {xla_fraction_variable()[0]}={fraction:.2f} (jax.mem_fraction in the "
            "workload) or XLA_PYTHON_CLIENT_PREALLOCATE=false",
        )
    smallest = space.smallest_valid()
    if smallest is None:
        raise no_valid_setting(space)
    config, ev = smallest
    breakdown = breakdown_of(budget, ev.evaluation)
    if budget.pool_bytes is not None:
        breakdown.pop("jax_pool_unused", None)
    footprint = sum(breakdown.values())
    terms = ev.evaluation.terms
    breaking = max(sorted(terms), key=lambda n: terms[n]) if terms else "cuda_context"
    if budget.breaking_term == "cuda_context":
        breaking = "cuda_context"
    device_fits = Limit.of(budget).holds(ev.evaluation)
    if not ev.on_gpu and not space.host_ok(ev.evaluation) and device_fits:
        return InfeasiblePlan(
            f"{name}'s replay buffer on the host needs {format_bytes(ev.evaluation.host_bytes)} "
            "of host RAM even at its smallest valid configuration, over the "
            f"{format_bytes(space.host_budget_bytes or 0)} it may use ("
            f"{format_bytes(space.host_memory_bytes or 0)} less a {space.margin:.0%} margin"
            + "".join(f", less {k}: {format_bytes(v)}" for k, v in space.host_reserve.items())
            + ")",
            smallest_bytes=footprint,
            budget_bytes=budget.budget_bytes,
            binding_term="host_memory",
            hint="lower buffer_size, set replay.optimize_memory_usage: true, or use a machine "
            "with more RAM",
        )
    knobs = ", ".join(f"{k}={v}" for k, v in chosen_knobs(space, config, ev.on_gpu).items())
    limit_text = (
        f"JAX's preallocated pool of {format_bytes(budget.pool_bytes)}"
        if budget.pool_bytes is not None
        else f"a budget of {format_bytes(budget.budget_bytes)}"
    )
    over = footprint - (
        budget.pool_bytes + budget.context_bytes
        if budget.pool_bytes is not None
        else budget.budget_bytes
    )
    if breaking == "cuda_context":
        size = breakdown.get("cuda_context", 0)
        what = "the CUDA context alone leaves no room"
        hint = "use a GPU with more memory" + margin_hint(over, budget)
    else:
        size = terms.get(breaking, 0)
        what = f"the largest term is {breaking}"
        lower = margin_hint(over, budget)
        hint = (
            f"use a GPU with more memory{',' if lower else ' or'} lower the smallest values of "
            f"the knobs that drive {breaking}{lower}"
        )
    gui = ""
    sim = space.workload.simulator
    if sim is not None and not sim.headless and terms.get("viewport"):
        from memfit.core.simulator_figures import viewport_on

        gui = (
            f"; the GUI's viewport counts {format_bytes(terms['viewport'])} of it (headless "
            f"drops it): {viewport_on(sim.gpu)[1]}"
        )
    return InfeasiblePlan(
        f"{name} does not fit {gpu.name}: its smallest valid configuration ({knobs or 'fixed'}) "
        f"needs {format_bytes(footprint)}, over {limit_text}; {what} "
        f"({format_bytes(size)}){gui}",
        smallest_bytes=footprint,
        budget_bytes=budget.budget_bytes,
        binding_term=breaking,
        hint=hint,
    )


def next_best(
    space: Space,
    budget: Budget,
    limit: Limit,
    ranked: list[tuple[Rank, tuple[int, ...]]],
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
        alt_breakdown = breakdown_of(budget, alt.evaluation)
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
                "knobs": chosen_knobs(space, config, alt.on_gpu),
                "predicted_bytes": predicted,
                "used_bytes": used,
                "host_bytes": alt.evaluation.host_bytes,
                "objective": rank[0],
            }
        )
        if len(out) == count:
            break
    return out


def _next_value(space: Space, name: str, value: int) -> int | None:
    """The value a knob would take after ``value`` if its range went on."""
    spec = space.workload.knobs[name]
    if spec.choices is not None:
        values = spec.values()
        return value + (values[-1] - values[-2]) if len(values) > 1 else None
    if spec.powers_of_two:
        return value * 2
    return value + (spec.step or 1)


def range_note(space: Space, config: tuple[int, ...], limit: Limit) -> str:
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
