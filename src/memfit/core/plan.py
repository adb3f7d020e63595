"""The planner: the best knob values that fit a GPU and keep every rule (pure).

:func:`plan_for_gpu` (and :func:`plan_many` over a tier table) searches the workload's knob
space (:mod:`memfit.core.space`, which says how the search stays exact without enumerating
every configuration) against the GPU's budget (:mod:`memfit.core.budget`) and returns a
:class:`Plan`: what the chosen configuration needs term by term (``breakdown`` sums to
``predicted_bytes``), what stops the next bigger configuration (``binding``: a term, a rule,
host RAM, or the knob ranges), and the next best configurations (``alternatives``); the
explanations are built in :mod:`memfit.core.plan_explain`. When nothing fits,
:class:`memfit.errors.InfeasiblePlan` carries the smallest footprint of a configuration that
keeps every rule and the term that breaks it, and what would fit instead.
:func:`feasible_space` lists every fitting configuration (for sweeps).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from memfit._plain import deep_merge
from memfit.allocator.settings import workload_settings
from memfit.allocator.xla_fraction import (
    DEFAULT_MARGIN,
    FRACTION_VARIABLES,
    xla_fraction_variable,
)
from memfit.core.bands import basis_summary, load_bands, plan_interval
from memfit.core.budget import Budget, compose_budget
from memfit.core.constraints import (
    check,
)
from memfit.core.evaluate import evaluate
from memfit.core.families.common import CONV_WORKSPACE_BASIS, CONV_WORKSPACE_TERM
from memfit.core.families.registry import Fallback
from memfit.core.measured import MeasuredTerms
from memfit.core.plan_explain import (
    binding_of,
    breakdown_of,
    chosen_knobs,
    grown_term,
    infeasible_error,
    next_best,
    range_note,
    release_pins,
    sources_of,
)
from memfit.core.simulator import simulator_fallbacks, simulator_notes
from memfit.core.space import Limit, Space, ranked_order
from memfit.core.workload import Workload
from memfit.errors import ConfigError, InfeasiblePlan
from memfit.hardware.catalog import GpuSpec, size_note
from memfit.hardware.runtime import Runtime, parse_version
from memfit.units import format_bytes

__all__ = ["FeasibleSpace", "Plan", "feasible_space", "plan_for_gpu", "plan_many"]

#: How many next-best configurations a plan lists.
DEFAULT_ALTERNATIVES = 3


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
        compiled_for: For a JAX workload planned from measured compiles (Brax's), what XLA
            compiled them for: ``"cuda sm_89 (NVIDIA GeForce RTX 4070)"`` (XLA's GPU
            compiler for that card) or ``"cpu"``; ``None`` for workloads planned without a
            compile.
        sources: Term name -> how that figure was obtained, for every term of
            ``breakdown`` (``compiled``, ``traced``, ``measured``, ``recorded``,
            ``fitted``, ``analytic``, ``assumed``: :mod:`memfit.core.bands`).
        predicted_low_bytes: The low end of what the job needs (``used_bytes``): each
            term less the most its basis has been over on the truth corpus.
        predicted_high_bytes: The high end: each term plus the most its basis has been
            under (:func:`memfit.core.bands.plan_interval`). A plan "fits" for sure only
            when this end is within the budget (:attr:`high_fits`).
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
    compiled_for: str | None = None
    sources: dict[str, str] = field(default_factory=dict)
    predicted_low_bytes: int | None = None
    predicted_high_bytes: int | None = None

    @property
    def band(self) -> tuple[int, int]:
        """``(predicted_low_bytes, predicted_high_bytes)``: what the job needs, low and high
        (``used_bytes`` itself when no band was computed)."""
        low = self.used_bytes if self.predicted_low_bytes is None else self.predicted_low_bytes
        high = self.used_bytes if self.predicted_high_bytes is None else self.predicted_high_bytes
        return low, high

    @property
    def high_fits(self) -> bool:
        """Whether the high end fits too: within the budget (inside the preallocated pool
        when there is one), not only the estimate."""
        if not self.fits:
            return False
        _, high = self.band
        extra = high - self.used_bytes
        if self.pool_bytes is not None:
            # the context lives outside the pool: its high end against the room outside it
            context = self.breakdown.get("cuda_context", 0)
            _, context_high = load_bands().interval(
                context, self.sources.get("cuda_context", "assumed"), term="cuda_context"
            )
            outside = context_high - context
            room = self.budget_bytes - self.predicted_bytes
            return extra - outside <= self.breakdown.get("jax_pool_unused", 0) and outside <= room
        return self.predicted_bytes + extra <= self.budget_bytes

    @property
    def basis(self) -> str:
        """One line: each basis's share of what the job needs
        (:func:`memfit.core.bands.basis_summary`)."""
        return basis_summary(self.breakdown, self.sources)

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

    def __repr__(self) -> str:
        """One line a person reads: the card, the verdict, the knobs, the figure and what
        limits it (``to_dict()`` has every field)."""
        knobs = ", ".join(f"{k}={v}" for k, v in self.knobs.items())
        return (
            f"Plan({self.gpu!r}, fits={self.fits}, {knobs or 'no knobs'}, "
            f"needs {format_bytes(self.used_bytes)} of {format_bytes(self.budget_bytes)}, "
            f"limited by {self.binding or '-'})"
        )

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
            "sources": dict(self.sources),
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
            "compiled_for": self.compiled_for,
            "basis": self.basis,
            "predicted_low_bytes": self.band[0],
            "predicted_high_bytes": self.band[1],
            "high_fits": self.high_fits,
        }


def _single(space: Space, budget: Budget, gpu: GpuSpec) -> Plan:
    """Every knob pinned: report the configuration as it is, fitting or not."""
    config = tuple(space.domains[n][0] for n in space.search_order)
    values = space.values(config)
    pins = {n: values[n] for n in space.workload.knobs}
    # a pin may leave its knob's declared range on purpose; the framework's rules still hold
    violations = [v for v in check(space.workload, pins) if not v.rule.startswith("knobs.")]
    if violations:
        first = violations[0]
        raise ConfigError(first.message, key_path=first.rule, hint="run memfit check for fixes")
    fitted = space.resolve(config, Limit.of(budget))
    ev = fitted or space.smallest_eval(config)
    breakdown = breakdown_of(budget, ev.evaluation)
    fits = fitted is not None and budget.breaking_term is None
    predicted = sum(breakdown.values())
    binding: str | None = None
    if not fits:
        binding = (
            budget.breaking_term
            or grown_term(space, ev)
            or max(sorted(ev.evaluation.terms), key=lambda n: ev.evaluation.terms[n])
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
            knobs=chosen_knobs(space, config, ev.on_gpu),
            breakdown=breakdown,
            binding=binding,
            alternatives=[],
            host_bytes=ev.evaluation.host_bytes,
            sources=sources_of(budget, ev.evaluation),
        ),
    )


def _would_fit(space: Space, gpu: GpuSpec, budget: Budget) -> list[dict[str, Any]]:
    """The family's fallbacks, each planned: what fits when the request does not."""
    family = space.family
    options = list(family.fallbacks(space.workload)) if family.fallbacks is not None else []
    if space.workload.simulator is not None:  # Isaac Lab 3: a lighter renderer
        sim = space.workload.simulator
        for label, changes in simulator_fallbacks(sim, space.workload.observations.cameras):
            options.append(Fallback(label, changes))
    options += release_pins(space, options)
    out: list[dict[str, Any]] = []
    for fallback in options:
        data = deep_merge(space.workload.model_dump(exclude_none=True), fallback.changes)
        try:
            changed = Workload.model_validate(data)
            overrides = {k: v for k, v in space.overrides.items() if k not in fallback.unpin}
            trial = Space(
                changed,
                overrides,
                space.measured,
                space.host_memory_bytes,
                margin=space.margin,
                host_reserve=space.host_reserve,
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
    space: Space, budget: Budget, gpu: GpuSpec, fallbacks: bool
) -> InfeasiblePlan:
    exc = infeasible_error(space, budget, gpu)
    if fallbacks:
        text = _would_fit_text(_would_fit(space, gpu, budget))
        if text is not None:
            exc.hint = f"{text}; or {exc.hint}" if exc.hint else text
    return exc


def _plan_on(
    space: Space, gpu: GpuSpec, budget: Budget, alternatives: int, *, fallbacks: bool = True
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
    limit = Limit.of(budget)
    ranked = space.top(limit, 1 + alternatives * 8)
    if not ranked:
        raise _infeasible_with_fallbacks(space, budget, gpu, fallbacks)
    best = ranked[0][1]
    chosen = space.resolve(best, limit)
    assert chosen is not None  # the search only keeps configurations that fit
    breakdown = breakdown_of(budget, chosen.evaluation)
    binding, limit_note = binding_of(space, best, chosen, limit, budget)
    plan_ = Plan(
        gpu=gpu.name,
        budget_bytes=budget.budget_bytes,
        predicted_bytes=sum(breakdown.values()),
        fits=True,
        knobs=chosen_knobs(space, best, chosen.on_gpu),
        breakdown=breakdown,
        binding=binding,
        alternatives=next_best(space, budget, limit, ranked, alternatives),
        host_bytes=chosen.evaluation.host_bytes,
        sources=sources_of(budget, chosen.evaluation),
    )
    plan_ = _finish(space, gpu, budget, plan_)
    if binding == "knob ranges":
        plan_.notes.append(range_note(space, best, limit))
    elif limit_note is not None:
        plan_.notes.append(limit_note)
    return plan_


def _finish(space: Space, gpu: GpuSpec, budget: Budget, plan_: Plan) -> Plan:
    """Add what every plan carries besides its numbers: the GPU's total, the pool, the
    allocator settings and the notes that explain them."""
    workload = space.workload
    notes: list[str] = []
    size = size_note(gpu)
    if size is not None:
        notes.append(size)
    advice = budget.advice
    fraction_name, fraction_why = xla_fraction_variable()
    if budget.pool_bytes is not None and advice is not None:
        if workload.jax.mem_fraction is None:
            notes.append(f"{fraction_name}={advice.value}: {advice.reason}")
        elif f"{workload.jax.mem_fraction:.2f}" != advice.value:
            notes.append(
                f"the workload sets jax.mem_fraction {workload.jax.mem_fraction:.2f}; memfit "
                f"recommends {advice.value} here ({advice.reason}); leave jax.mem_fraction "
                "out to plan with it"
            )
        if fraction_name != FRACTION_VARIABLES[0]:
            # the documented name goes without saying; the older one needs its reason
            notes.append(f"{fraction_name}: {fraction_why}")
    if workload.simulator is not None:
        notes.extend(simulator_notes(workload.simulator))
        notes.append(
            "with the simulator in this process, call memfit.autoconfig after it starts to "
            "plan against what it really holds"
        )
    if gpu.unified_memory and not gpu.is_host:
        notes.append(
            f"unified memory: the CPU and the GPU share this card's "
            f"{format_bytes(gpu.total_bytes)}, so the device buffers and what would be kept "
            "in host RAM (a replay buffer) are counted in one pool, against one budget; the "
            "OS and the job's own process take their share of it too"
        )
    if CONV_WORKSPACE_TERM in plan_.breakdown:
        basis, source = CONV_WORKSPACE_BASIS
        where = (
            "on the host oneDNN's convolution scratch stands in for it, at cuDNN's size"
            if gpu.arch == "cpu"
            else f"planned as on a card with room, so an upper bound on this {gpu.name}"
        )
        notes.append(f"{CONV_WORKSPACE_TERM} (basis: {basis}): {source}; {where}")
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
        reserved = "".join(
            f", less {name}: {format_bytes(nbytes)}" for name, nbytes in space.host_reserve.items()
        )
        notes.append(
            f"host RAM: {format_bytes(plan_.host_bytes)} in it, of a "
            f"{format_bytes(space.host_budget_bytes or 0)} budget: "
            f"{format_bytes(space.host_memory_bytes)} less the {space.margin:.0%} margin "
            f"the GPU keeps too{reserved}"
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
        fraction_variable=fraction_name,
        torch_version=_target_torch(budget),
    )
    measured = workload.measurements if workload.framework == "jax" else None
    traced = space.measured.family if space.measured is not None else None
    low, high = plan_interval(
        plan_.breakdown,
        plan_.sources,
        space.family.family_key(workload),
        basis_families={"traced": traced} if traced else None,
    )
    plan_ = replace(plan_, predicted_low_bytes=low, predicted_high_bytes=high)
    if plan_.fits and not plan_.high_fits:
        notes.append(
            f"only the estimate fits: what the job needs is {format_bytes(plan_.used_bytes)} "
            f"({format_bytes(low)} to {format_bytes(high)} by how far each basis has been "
            f"off), and the high end does not fit; {plan_.basis}"
        )
    return replace(
        plan_,
        compiled_for=None if measured is None else measured.provenance.platform,
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


def _target_torch(budget: Budget) -> tuple[int, int] | None:
    """The target's torch ``(major, minor)`` (the runtime the context was sized for), which
    decides the allocator settings and their variable names; ``None`` when unknown."""
    runtime = budget.context.runtime if budget.context is not None else None
    if runtime is None or runtime.torch is None:
        return None
    found = parse_version(runtime.torch, "torch")
    return (found[0], found[1] if len(found) > 1 else 0)


def _one_pool(gpu: GpuSpec) -> bool:
    """Whether the job's device and host buffers share one memory: the host itself
    (``--gpu cpu``) or a card with unified memory (Jetson), where state the family would
    keep in host RAM (a replay buffer) takes the same memory as the device's."""
    return gpu.is_host or gpu.unified_memory


def _on_card(workload: Workload, gpu: GpuSpec) -> Workload:
    """The workload with its simulator's figures chosen for ``gpu`` (they depend on the card:
    :mod:`memfit.core.simulator_figures`); a card the section already names stays."""
    sim = workload.simulator
    if sim is None or sim.gpu is not None or gpu.is_host:
        return workload
    return workload.model_copy(update={"simulator": sim.model_copy(update={"gpu": gpu.name})})


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
    host_reserve: Mapping[str, int] | None = None,
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
        host_reserve: Host RAM that is not the job's state's, by name (the process's own
            baseline, a reserve for the OS): taken off the host budget and named in its
            note.

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
    workload = _on_card(workload, gpu)
    space = Space(
        workload,
        overrides,
        measured,
        host_memory_bytes,
        device_is_host=_one_pool(gpu),
        margin=margin,
        host_reserve=host_reserve,
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
    host_reserve: Mapping[str, int] | None = None,
) -> list[Plan | InfeasiblePlan]:
    """Plans for several GPUs (a tier table), sharing one evaluation cache.

    Returns:
        One entry per GPU, in order: its :class:`Plan`, or the :class:`InfeasiblePlan` that
        says why nothing fits it.

    Raises:
        ConfigError: As :func:`plan` (these do not depend on the GPU).
    """
    space = Space(
        workload, overrides, measured, host_memory_bytes, margin=margin, host_reserve=host_reserve
    )
    out: list[Plan | InfeasiblePlan] = []
    for spec in gpus:
        budget = _budget(workload, spec, margin, 0, None, runtime)
        if _on_card(workload, spec) is not workload:  # the simulator's figures follow the card
            space = Space(
                _on_card(workload, spec),
                overrides,
                measured,
                host_memory_bytes,
                margin=margin,
                host_reserve=host_reserve,
            )
        try:
            out.append(_with_context(_plan_on(space, spec, budget, alternatives), budget))
        except InfeasiblePlan as exc:
            out.append(exc)
    return out


@dataclass(frozen=True)
class FeasibleSpace:
    """Every configuration of a workload that keeps its rules and fits one GPU.

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
    host_reserve: Mapping[str, int] | None = None,
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
    workload = _on_card(workload, gpu)
    space = Space(
        workload,
        overrides,
        measured,
        host_memory_bytes,
        device_is_host=_one_pool(gpu),
        margin=margin,
        host_reserve=host_reserve,
    )
    budget = _budget(workload, gpu, margin, other_processes_bytes, context_bytes, runtime)
    if budget.breaking_term is not None:
        raise _infeasible_with_fallbacks(space, budget, gpu, False)
    limit = Limit.of(budget)
    found = (
        [(space.rank(c), c) for c in [tuple(space.domains[n][0] for n in space.search_order)]]
        if space.pinned_all
        else sorted(space.enumerate_all(limit), key=ranked_order, reverse=True)
    )
    configs: list[dict[str, int | str]] = []
    predicted: list[int] = []
    used: list[int] = []
    for _, config in found:
        chosen = space.resolve(config, limit)
        if chosen is None or not space.valid(config):
            continue  # only reachable for the single pinned configuration
        breakdown = breakdown_of(budget, chosen.evaluation)
        configs.append(chosen_knobs(space, config, chosen.on_gpu))
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
