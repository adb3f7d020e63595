"""Analytic memory models, one module per workload family.

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
from dataclasses import dataclass

from memfit.core.families import custom, offpolicy, ppo, vision
from memfit.core.families.common import MODEL_TERMS, Term, allocator_slack
from memfit.core.measured import MeasuredTerms
from memfit.core.workload import Workload
from memfit.errors import ConfigError

__all__ = ["Evaluation", "Term", "evaluate", "family_terms"]


@dataclass(frozen=True)
class Evaluation:
    """The memory of one configuration, per device.

    Attributes:
        terms: Term name -> bytes the framework allocates for it (no context, no slack).
        slack_bytes: Reserved-vs-allocated slack of the framework's allocator over the terms'
            buffers (``allocator_slack``).
        host_bytes: Host RAM the job's GPU-side choices need (a replay buffer on the host).
    """

    terms: dict[str, int]
    slack_bytes: int
    host_bytes: int

    @property
    def allocated_bytes(self) -> int:
        """Sum of the terms."""
        return sum(self.terms.values())

    @property
    def reserved_bytes(self) -> int:
        """Terms plus allocator slack: what the framework's allocator holds."""
        return self.allocated_bytes + self.slack_bytes


def family_terms(
    workload: Workload, values: Mapping[str, int], *, replay_on_gpu: bool = True
) -> tuple[list[Term], int]:
    """The analytic terms of the workload's family and the host bytes it needs.

    Raises:
        ConfigError: When the workload lacks a fact its family needs.
    """
    if workload.family == "ppo":
        return ppo.terms(workload, values), 0
    if workload.family == "offpolicy":
        return offpolicy.terms(workload, values, replay_on_gpu=replay_on_gpu)
    if workload.family == "vision_inference":
        return vision.terms(workload, values), 0
    return custom.terms(workload, values), 0


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
        kept.append(Term(label, (nbytes,)))
    per_item = round(measured.per_item_bytes * values[measured.knob])
    kept.append(Term("activations", (per_item,)))
    return kept


def evaluate(
    workload: Workload,
    values: Mapping[str, int],
    *,
    measured: MeasuredTerms | None = None,
    replay_on_gpu: bool = True,
) -> Evaluation:
    """Memory terms of ``workload`` at ``values`` (per device).

    Args:
        workload: The workload.
        values: Every knob and setting value (``Workload.default_values`` plus overrides).
        measured: Measured parameter/activation terms from an estimator, replacing the
            analytic ones.
        replay_on_gpu: For off-policy workloads, whether the replay buffer is on the GPU.

    Returns:
        The terms, the allocator slack and the host bytes.

    Raises:
        ConfigError: When the workload lacks a fact its family needs, or ``measured`` follows
            a knob the workload does not have.
    """
    terms, host = family_terms(workload, values, replay_on_gpu=replay_on_gpu)
    if measured is not None:
        terms = _apply_measured(terms, measured, values)
    named: dict[str, int] = {}
    buffers: list[int] = []
    for term in terms:
        named[term.name] = named.get(term.name, 0) + term.nbytes
        buffers.extend(term.tensors)
    return Evaluation(
        terms=named,
        slack_bytes=allocator_slack(workload.framework, buffers),
        host_bytes=host,
    )
