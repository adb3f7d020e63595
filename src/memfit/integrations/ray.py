"""Ray Tune / Ray Train: sweep only what fits the cluster's cards, and pack trials by memory.

* :func:`feasible_configs` / :func:`param_space` (a): the configurations of a workload that
  keep its rules and fit at least one GPU type of the cluster (by memfit's plan), as a list
  or as a ``tune.choice`` to put in ``param_space``; :func:`fits_some` filters configurations
  a search algorithm proposes.
* :func:`resources` (b): a callable for ``tune.with_resources(trainable, resources=...)``
  that sizes each trial's request from its predicted peak: a *fraction* of a GPU (the peak
  over the smallest card it fits, rounded up), so Ray packs trials by memory rather than by
  count, and an ``accelerator_type:<label>`` request when the configuration fits only some
  of the cards (Ray's accelerator labels; name them as the cluster's nodes advertise them).
* :func:`trial_autoconfig` (c): inside the trainable, :func:`memfit.autoconfig` for the GPU
  the trial landed on (the memory knobs follow the card on a heterogeneous cluster, the
  sweep's own knobs pinned), and, for JAX, ``XLA_PYTHON_CLIENT_MEM_FRACTION`` set to the
  trial's share (JAX's default 75% preallocation would take the card from the trials packed
  next to it).
* :func:`metrics` / :class:`EventLog` (d): the guard and Recorder events and the measured
  peak as metrics for ``tune.report`` (or Ray Train's ``train.report``).

Ray is imported when a function here needs it, not when this module is imported; the sizing
(:func:`resources`' arithmetic, :func:`feasible_configs`) needs no running Ray.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memfit._checks import require as require_arg
from memfit._checks import (
    require_instance,
    require_list,
    require_mapping,
    require_number_in,
    require_object,
    require_str_list,
)
from memfit._lazy import require
from memfit.allocator.xla_fraction import (
    DEFAULT_MARGIN,
    FRACTION_VARIABLES,
    xla_fraction_variable,
)
from memfit.core.plan import FeasibleSpace
from memfit.core.workload import JaxSettings, Workload, load_workload
from memfit.errors import ConfigError, InfeasiblePlan
from memfit.hardware.catalog import GpuSpec
from memfit.integrations._feasible import space as cached_space
from memfit.planning import check_plan_arguments, resolve_gpu
from memfit.runtime.autoconfig import AutoConfig, autoconfig, read_device
from memfit.runtime.events import MemoryEvent
from memfit.units import format_bytes, parse_fraction

__all__ = [
    "Card",
    "EventLog",
    "Request",
    "feasible_configs",
    "fits_some",
    "metrics",
    "param_space",
    "request_for",
    "resources",
    "trial_autoconfig",
]

#: A trial's GPU fraction is rounded up to a multiple of this (Ray accepts any fraction;
#: a coarse grid keeps the packing readable).
FRACTION_STEP = 0.01


@dataclass(frozen=True)
class Card:
    """One GPU type of the cluster.

    Attributes:
        gpu: As :func:`memfit.plan` takes it: a catalog name, a size, or a spec.
        label: The accelerator label its nodes advertise (``"A100"`` for Ray's
            ``accelerator_type:A100``), or ``None`` to request no label.
    """

    gpu: str | int | GpuSpec
    label: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.gpu, GpuSpec):
            require_arg("gpu", self.gpu, "str", "int", hint='Card("RTX 4090", label="4090")')
        require_arg("label", self.label, "str", optional=True)


@dataclass(frozen=True)
class Request:
    """What one trial asks Ray for.

    Attributes:
        gpu: The GPU fraction (0 < gpu <= 1).
        cpu: CPUs.
        labels: Accelerator labels the trial may run on (empty: any card).
        peak_bytes: The predicted peak the fraction was sized from (on the smallest card it
            fits; without the unused part of a preallocated JAX pool).
    """

    gpu: float
    cpu: float
    labels: tuple[str, ...]
    peak_bytes: int

    def __post_init__(self) -> None:
        require_arg("gpu", self.gpu, "number")
        if not 0 < self.gpu <= 1:
            raise ConfigError(f"gpu must be a fraction in (0, 1], not {self.gpu}", key_path="gpu")
        _require_cpu(self.cpu)
        if not isinstance(self.labels, tuple):
            raise ConfigError("labels must be a tuple of accelerator labels", key_path="labels")
        require_str_list("labels", self.labels)
        require_arg("peak_bytes", self.peak_bytes, "int")

    def bundle(self) -> dict[str, float]:
        """The resource bundle for ``tune.PlacementGroupFactory`` (one label: Ray asks
        a tiny amount of the ``accelerator_type:<label>`` resource, as its own
        ``accelerator_type=`` option does)."""
        out: dict[str, float] = {"CPU": self.cpu, "GPU": self.gpu}
        if len(self.labels) == 1:
            out[f"accelerator_type:{self.labels[0]}"] = 0.001
        return out


def _require_cpu(cpu: Any) -> float:
    require_arg("cpu", cpu, "number", hint="CPUs per trial, e.g. cpu=2 (a number, not text)")
    if cpu <= 0:
        raise ConfigError(f"cpu must be more than 0, not {cpu}", key_path="cpu")
    return float(cpu)


def _cards(cards: Sequence[Card | str | int | GpuSpec]) -> list[Card]:
    require_list(
        "cards",
        cards,
        what="a list of the cluster's GPU types",
        exclude=(Card, GpuSpec),
        sequence=True,
        hint='cards=["A100", Card("RTX 4090", label="4090")]',
    )
    out: list[Card] = []
    for i, c in enumerate(cards):
        if isinstance(c, Card):
            out.append(c)
            continue
        if not isinstance(c, GpuSpec):
            require_arg(f"cards[{i}]", c, "str", "int", hint="a catalog name, a size or a Card")
        out.append(Card(c))
    if not out:
        raise ConfigError("no cards given", key_path="cards", hint='give cards=["RTX 4090"]')
    return out


def _spaces(
    workload: Workload,
    cards: Sequence[Card],
    fixed: Mapping[str, int] | None,
    margin: float | str,
) -> list[FeasibleSpace | None]:
    # cached per process: a resources callable sizes every trial from them
    out: list[FeasibleSpace | None] = []
    for card in cards:
        try:
            out.append(cached_space(workload, gpu=card.gpu, fixed=fixed, margin=margin))
        except InfeasiblePlan:
            out.append(None)
    return out


def _check(workload: Any, cards: Any, fixed: Any, margin: Any) -> tuple[Workload, list[Card]]:
    """The arguments every function here shares, checked (and the workload loaded)."""
    check_plan_arguments(workload, pins=("fixed", fixed), margin=margin)
    given = _cards(cards)
    loaded = workload if isinstance(workload, Workload) else load_workload(workload)
    return loaded, given


def _key(space: FeasibleSpace, knobs: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(knobs.get(n) for n in space.order)


def feasible_configs(
    workload: Workload | str | Path,
    cards: Sequence[Card | str | int | GpuSpec],
    *,
    fixed: Mapping[str, int] | None = None,
    margin: float | str = DEFAULT_MARGIN,
) -> list[dict[str, int | str]]:
    """The configurations that keep the workload's rules and fit at least one of ``cards``
    (the searched knobs and the knobs derived from them, without the planner's placement
    knob, which follows the card), in a fixed order.

    Raises:
        InfeasiblePlan: When nothing fits any card.
        ConfigError: On a bad workload, card or pinned value.
    """
    loaded, given = _check(workload, cards, fixed, margin)
    spaces = _spaces(loaded, given, fixed, margin)
    seen: dict[tuple[Any, ...], dict[str, int | str]] = {}
    for space in spaces:
        if space is None:
            continue
        for config in space.configs:
            knobs = {k: v for k, v in config.items() if k in loaded.knobs}
            seen.setdefault(_key(space, knobs), knobs)
    if not seen:
        raise InfeasiblePlan(
            f"{loaded.name} fits none of the cluster's cards",
            smallest_bytes=None,
            budget_bytes=0,
            binding_term=None,
            hint="add a larger card, or narrow the knob ranges",
        )
    return [seen[k] for k in sorted(seen, key=lambda k: tuple(str(v) for v in k))]


def param_space(
    workload: Workload | str | Path,
    cards: Sequence[Card | str | int | GpuSpec],
    *,
    fixed: Mapping[str, int] | None = None,
    margin: float | str = DEFAULT_MARGIN,
) -> Any:
    """``tune.choice`` over :func:`feasible_configs`: put it in ``param_space`` (for example
    ``{"memfit": param_space(...), "lr": tune.loguniform(1e-5, 1e-3)}``).

    Raises:
        ConfigError, InfeasiblePlan: As :func:`feasible_configs` (checked before Ray loads).
    """
    _check(workload, cards, fixed, margin)
    tune = require("ray.tune")
    return tune.choice(feasible_configs(workload, cards, fixed=fixed, margin=margin))


def fits_some(
    workload: Workload | str | Path,
    cards: Sequence[Card | str | int | GpuSpec],
    *,
    fixed: Mapping[str, int] | None = None,
    margin: float | str = DEFAULT_MARGIN,
) -> Callable[[Mapping[str, Any]], bool]:
    """A predicate over knob values: ``True`` when they keep the rules and fit at least one
    card (for a search algorithm's proposals; unknown knobs are ignored).

    Raises:
        ConfigError: On a bad workload, card or pinned value (and, from the predicate,
            knob values that are not a mapping).
    """
    loaded, given = _check(workload, cards, fixed, margin)
    spaces = [s for s in _spaces(loaded, given, fixed, margin) if s is not None]
    keys = [{_key(s, c) for c in s.configs} for s in spaces]

    def check(knobs: Mapping[str, Any]) -> bool:
        require_mapping("knobs", knobs)
        try:
            return any(_key(s, knobs) in k for s, k in zip(spaces, keys, strict=True))
        except TypeError:  # an unhashable value: no configuration of the space has it
            return False

    return check


def request_for(
    knobs: Mapping[str, Any],
    workload: Workload | str | Path,
    cards: Sequence[Card | str | int | GpuSpec],
    *,
    cpu: float = 1.0,
    fixed: Mapping[str, int] | None = None,
    margin: float | str = DEFAULT_MARGIN,
) -> Request:
    """What a trial with these knob values should ask for: a GPU fraction sized from its
    predicted peak (what the job itself takes: without the unused part of a JAX pool, whose
    size :func:`trial_autoconfig` sets to the share) over the smallest card it fits, with
    ``margin`` of it as headroom (the peak is then a smaller share of any larger card), and
    the labels of the cards it fits when that is not all of them.

    Raises:
        InfeasiblePlan: When the configuration fits no card.
        ConfigError: On bad knob values, workload, cards, CPUs, pinned value or margin.
    """
    require_mapping("knobs", knobs, hint="the trial's knob values: config['memfit']")
    cpu = _require_cpu(cpu)
    loaded, given = _check(workload, cards, fixed, margin)
    spaces = _spaces(loaded, given, fixed, margin)
    fits: list[tuple[int, int, Card]] = []  # (total, peak, card)
    for card, space in zip(given, spaces, strict=True):
        if space is None:
            continue
        try:
            index = space.index(knobs)
        except TypeError:  # an unhashable value: not a configuration of the space
            index = None
        if index is not None:
            total = resolve_gpu(card.gpu).total_bytes
            fits.append((total, space.used_bytes[index], card))
    if not fits:
        raise InfeasiblePlan(
            f"{dict(knobs)} fits none of the cluster's cards",
            smallest_bytes=None,
            budget_bytes=0,
            binding_term=None,
            hint="draw the configurations from memfit.integrations.ray.param_space",
        )
    total, peak, _ = min(fits, key=lambda f: (f[0], f[1]))
    headroom = 1.0 + parse_fraction(margin)
    fraction = min(1.0, math.ceil(peak * headroom / total / FRACTION_STEP) * FRACTION_STEP)
    labels: tuple[str, ...] = ()
    if len(fits) < len(given):
        labels = tuple(sorted({c.label for _, _, c in fits if c.label is not None}))
    return Request(gpu=round(fraction, 6), cpu=cpu, labels=labels, peak_bytes=peak)


def resources(
    workload: Workload | str | Path,
    cards: Sequence[Card | str | int | GpuSpec],
    *,
    key: str = "memfit",
    cpu: float = 1.0,
    fixed: Mapping[str, int] | None = None,
    margin: float | str = DEFAULT_MARGIN,
) -> Callable[[Mapping[str, Any]], Any]:
    """The ``resources`` callable for ``tune.with_resources``: a trial's knob values are
    ``config[key]`` (as :func:`param_space` puts them); it returns a
    ``tune.PlacementGroupFactory`` with the bundle of :func:`request_for`.

    Raises:
        ConfigError: On a bad workload, cards, key, CPUs, pinned value or margin (checked
            here, before any trial is sized).
    """
    require_arg("key", key, "str")
    cpu = _require_cpu(cpu)
    loaded, _ = _check(workload, cards, fixed, margin)
    tune = require("ray.tune")

    def size(config: Mapping[str, Any]) -> Any:
        knobs = config.get(key)
        if not isinstance(knobs, Mapping):
            raise ConfigError(
                f"the trial's config has no knob values under {key!r}",
                key_path=key,
                hint=f"put param_space(...) under {key!r} in the Tuner's param_space",
            )
        req = request_for(knobs, loaded, cards, cpu=cpu, fixed=fixed, margin=margin)
        return tune.PlacementGroupFactory([req.bundle()])

    return size


def trial_autoconfig(
    workload: Workload | str | Path,
    knobs: Mapping[str, Any] | None = None,
    *,
    share: float | None = None,
    follow: Sequence[str] = (),
    probe: Any | None = None,
    margin: float | str = DEFAULT_MARGIN,
) -> AutoConfig:
    """Inside a trainable: plan the workload for the GPU this trial landed on.

    The trial's knob values are pinned except those in ``follow``, which
    :func:`memfit.autoconfig` sets for this card from what it has free now (the memory
    knobs follow the card on a heterogeneous cluster).

    With ``share`` (the trial's GPU fraction, :attr:`Request.gpu`) the plan stays inside
    the share, so the trials packed on the card do not crowd each other: a JAX workload
    that preallocates plans with XLA's pool at the share (``XLA_PYTHON_CLIENT_MEM_FRACTION``
    set to it in this process when JAX has not started on the GPU yet: JAX's default 75%
    would take the card from the other trials), and any other plans against the smaller of
    what is free and the share of the card, with ``margin`` taken of the share.

    Raises:
        ConfigError: When ``share`` is not in (0, 1], or an argument is of the wrong type.
        InfeasiblePlan, BackendUnavailable: As :func:`memfit.autoconfig`.
    """
    check_plan_arguments(workload, pins=("knobs", None), margin=margin)
    require_mapping("knobs", knobs, optional=True)
    require_arg("share", share, "number", optional=True)
    follow = require_str_list("follow", follow)
    require_object(
        "probe",
        probe,
        methods=("snapshot",),
        what="a device probe (memfit.backends)",
        optional=True,
    )
    loaded = workload if isinstance(workload, Workload) else load_workload(workload)
    pins = {k: int(v) for k, v in (knobs or {}).items() if k not in follow and _is_int(v)}
    margin_value = parse_fraction(margin)
    notes: list[str] = []
    if share is not None:
        require_number_in(
            "share",
            share,
            low=0,
            high=1,
            low_open=True,
            what="a GPU fraction in (0, 1]",
            hint="pass the trial's fraction: Request.gpu",
        )
        if loaded.framework == "jax" and loaded.jax.preallocate:
            from memfit.runtime.allocator_env import jax_gpu_started

            loaded = loaded.model_copy(
                update={"jax": JaxSettings(preallocate=True, mem_fraction=share)}
            )
            margin_value = 0.0  # XLA's pool is the trial's hard limit; the job must fit it
            if not jax_gpu_started():
                # the name already set, else the one the installed jaxlib reads: never both
                already = [k for k in FRACTION_VARIABLES if os.environ.get(k)]
                name = already[0] if already else xla_fraction_variable()[0]
                os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "true"
                os.environ[name] = f"{share:.2f}"
                notes.append(f"{name}={share:.2f}: this trial's share")
        else:
            reading = read_device(probe=probe)
            room = min(reading.free_bytes, int(share * reading.total_bytes))
            margin_value = (reading.free_bytes - room) / reading.total_bytes + margin_value * share
            notes.append(
                f"planned inside this trial's share: {share:.2f} of the card, "
                f"{format_bytes(room)} (less {parse_fraction(margin):.0%} of it)"
            )
    cfg = autoconfig(loaded, overrides=pins or None, probe=probe, margin=margin_value)
    cfg.notes.extend(notes)
    return cfg


def _events(events: Any) -> list[MemoryEvent]:
    require_list(
        "events",
        events,
        what="a list of memfit events",
        exclude=(MemoryEvent,),
        sequence=True,
        hint="pass an EventLog's .events or a guard's / Recorder's .events",
    )
    for i, event in enumerate(events):
        if not isinstance(event, MemoryEvent):
            raise ConfigError(
                f"events[{i}] is a {type(event).__name__}, not a memfit MemoryEvent",
                key_path=f"events[{i}]",
            )
    return list(events)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class EventLog:
    """Collect guard, cleanup and Recorder events for the trial's metrics
    (``on_event=log``; the Recorder's own events: ``log.extend(recorder.events)``)."""

    def __init__(self) -> None:
        self.events: list[MemoryEvent] = []

    def __call__(self, event: MemoryEvent) -> None:
        self.events.append(event)

    def extend(self, events: Sequence[MemoryEvent]) -> None:
        """Add events a Recorder or guard kept.

        Raises:
            ConfigError: When an item is not a :class:`~memfit.runtime.events.MemoryEvent`.
        """
        self.events.extend(_events(events))


def metrics(
    events: Sequence[MemoryEvent] = (),
    *,
    peak_bytes: int | None = None,
    cfg: AutoConfig | None = None,
) -> dict[str, Any]:
    """Flat metrics for ``tune.report`` / ``train.report``: counts of each event kind
    (``memfit/oom``, ``memfit/give_up``, ``memfit/rank_imbalance``, ...), the last event's
    message, the measured peak and, with ``cfg``, the card and the planned peak.

    Raises:
        ConfigError: When ``events`` is not a list of events, ``peak_bytes`` not an int or
            ``cfg`` not an :class:`~memfit.runtime.autoconfig.AutoConfig`.
    """
    events = _events(events)
    require_arg("peak_bytes", peak_bytes, "int", optional=True)
    require_instance(
        "cfg",
        cfg,
        AutoConfig,
        what="a memfit AutoConfig (what trial_autoconfig returns)",
        optional=True,
    )
    out: dict[str, Any] = {}
    for event in events:
        name = f"memfit/{event.kind}"
        out[name] = int(out.get(name, 0)) + 1
    if events:
        out["memfit/last_event"] = f"{events[-1].kind}: {events[-1].message}"[:500]
    if peak_bytes is not None:
        out["memfit/peak_bytes"] = int(peak_bytes)
    if cfg is not None:
        out["memfit/card"] = cfg.reading.name
        out["memfit/card_free_bytes"] = cfg.reading.free_bytes
        out["memfit/planned_bytes"] = cfg.plan.predicted_bytes
        for knob, value in cfg.knobs.items():
            out[f"memfit/knob/{knob}"] = value
    return out
