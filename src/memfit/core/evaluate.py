"""A workload's memory at given knob values: its family's terms, measured terms, a frozen
feature extractor beside the learner and the simulator.

:func:`evaluate` turns a workload and its knob values into named device terms (bytes, per
device, at the allocated level) plus the host RAM the job needs, and, given a
:class:`memfit.core.measured.MeasuredTerms`, replaces the analytic parameter and activation
terms with the measured ones. Every function here is pure.

>>> from memfit.core.workload import load_workload
>>> w = load_workload("dqn_fire_raster")
>>> ev = evaluate(w, {**w.default_values()})
>>> "replay_buffer" in ev.terms and ev.allocated_bytes == sum(ev.terms.values())
True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from memfit.core._workload_schema import Workload
from memfit.core.bands import weakest
from memfit.core.families._extractor import extractor_terms
from memfit.core.families.common import MODEL_TERMS, allocator_slack
from memfit.core.families.registry import Family, Term, get_family
from memfit.core.measured import MeasuredTerms
from memfit.core.simulator import simulator_terms
from memfit.errors import ConfigError

__all__ = ["Evaluation", "evaluate", "family_for", "family_terms"]


def family_for(workload: Workload) -> Family:
    """The registered family of ``workload``.

    Raises:
        ConfigError: When the workload names an unregistered family.
    """
    return get_family(workload.family)


@dataclass(frozen=True)
class Evaluation:
    """The memory of one configuration, per device.

    Attributes:
        terms: Term name -> bytes on the device (no context, no slack).
        slack_bytes: Reserved-vs-allocated slack of the framework's allocator over the terms'
            buffers (``allocator_slack``).
        host_bytes: Host RAM the job's GPU-side choices need (a replay buffer on the host).
        outside_bytes: The part of ``terms`` that is not allocated through the framework's
            allocator (a simulator and its renderer in the same process): it takes device
            memory, but not from the caching allocator or XLA's pool.
        sources: Term name -> how it was obtained (its basis:
            :data:`memfit.core.bands.BASES`); a term made of parts of several bases takes the
            least direct.
    """

    terms: dict[str, int]
    slack_bytes: int
    host_bytes: int
    outside_bytes: int = 0
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def allocated_bytes(self) -> int:
        """Sum of the terms."""
        return sum(self.terms.values())

    @property
    def reserved_bytes(self) -> int:
        """Terms plus allocator slack: the job's device memory besides its context."""
        return self.allocated_bytes + self.slack_bytes

    @property
    def framework_reserved_bytes(self) -> int:
        """What the framework's allocator holds (the terms outside it left out)."""
        return self.reserved_bytes - self.outside_bytes


def family_terms(
    workload: Workload, values: Mapping[str, int], *, on_device: bool = True
) -> tuple[list[Term], int]:
    """The analytic terms of the workload's family and the host bytes it needs.

    Raises:
        ConfigError: When the workload lacks a fact its family needs, or names an
            unregistered family.
    """
    terms, host = family_for(workload).terms(workload, values, on_device=on_device)
    return list(terms), int(host)


def _simulator(workload: Workload, values: Mapping[str, int]) -> list[Term]:
    """The simulator's terms (:mod:`memfit.core.simulator`), outside the allocator."""
    assert workload.simulator is not None
    terms = simulator_terms(workload.simulator, values, workload.observations.cameras)
    return [Term(name, (nbytes,), outside_allocator=True, basis="fitted") for name, nbytes in terms]


def _apply_measured(
    terms: list[Term], measured: MeasuredTerms, values: Mapping[str, int]
) -> list[Term]:
    if measured.knob not in values:
        raise ConfigError(
            f"the estimate follows knob {measured.knob!r}, which the workload does not have",
            key_path="estimator",
            hint="name the batch knob in the workload as the estimator's factory does",
        )
    kept = [t for t in terms if t.name not in MODEL_TERMS]
    taken = {t.name for t in kept}
    for name, nbytes in measured.fixed_bytes.items():
        label = name if name not in taken else f"measured_{name}"
        kept.append(Term(label, (nbytes,), basis=measured.basis))
    per_item = round(measured.per_item_bytes * values[measured.knob])
    kept.append(Term("activations", (per_item,), basis=measured.basis))
    return kept


def evaluate(
    workload: Workload,
    values: Mapping[str, int],
    *,
    measured: MeasuredTerms | None = None,
    on_device: bool = True,
) -> Evaluation:
    """Memory terms of ``workload`` at ``values`` (per device).

    Args:
        workload: The workload.
        values: Every knob and setting value (``Workload.default_values`` plus overrides).
        measured: Measured parameter/activation terms from an estimator, replacing the
            analytic ones.
        on_device: Where the family's placeable state lives (an off-policy replay buffer):
            on the device, or in host RAM.

    Returns:
        The terms, the allocator slack and the host bytes.

    Raises:
        ConfigError: When the workload lacks a fact its family needs, or ``measured`` follows
            a knob the workload does not have.
    """
    terms, host = family_terms(workload, values, on_device=on_device)
    if measured is not None:
        terms = _apply_measured(terms, measured, values)
    if workload.feature_extractor is not None:
        terms.extend(extractor_terms(workload, values))
    if workload.simulator is not None:
        terms.extend(_simulator(workload, values))
    named: dict[str, int] = {}
    sources: dict[str, str] = {}
    buffers: list[int] = []
    outside = 0
    for term in terms:
        named[term.name] = named.get(term.name, 0) + term.nbytes
        sources[term.name] = weakest(sources.get(term.name, term.basis), term.basis)
        if term.outside_allocator:
            outside += term.nbytes
        else:
            buffers.extend(term.tensors)
    return Evaluation(
        terms=named,
        slack_bytes=allocator_slack(workload.framework, buffers),
        host_bytes=host,
        outside_bytes=outside,
        sources=sources,
    )
