"""The search rule of ``memfit fit``: which knob value to probe next, as a pure function.

``memfit fit`` confirms on the device the largest knob value (batch size, number of
environments, ...) whose peak memory stays under a budget. Each probe runs a short step at one
value and reports ``Probe(value, peak_bytes, ok)``. This module decides, from those probes
alone, which value to try next:

* An **affine model** ``peak(v) = intercept + slope * v`` is kept from the measurements: the
  secant through the two measured probes on either side of the target, or else through the
  largest one and one at most half its value (when the peak rose enough between them to
  tell a slope from allocator rounding). Otherwise it is anchored at one measurement: with
  the prior's slope (leaning the safe way by the prior's uncertainty, and scaled when the
  measurement shows the prior off in proportion), or without a prior the proportional line
  through the origin, which for any affine curve with non-negative fixed bytes never
  over-predicts the largest fitting value (growth is then at least 4x per probe).
* The **prior** (a memfit estimate or plan, reduced to :class:`Prior`) gives the first guess:
  the largest value it predicts to fit, de-rated by the prior's own uncertainty. Without a
  prior the first probe is the smallest valid value (a bounded first probe that cannot take
  the device down), and the model extrapolates from there.
* A probe that **ran out of memory** is information: the failing value does not fit, so it and
  everything above it are out of the search; its peak was above the budget, which bounds the
  slope from below. When the model did not see a failure coming, or misses twice in a row,
  the next value backs off from the failure by 10% of the open interval, doubling with each
  miss up to bisection, so the search never creeps down one value at a time.
* The next value is the **largest** value that keeps the constraint (``multiple_of`` and an
  optional predicate) and whose predicted peak leaves the margin, strictly between the largest
  confirmed value and the smallest excluded one. The rule never returns a value known to fail,
  nor one already probed.
* The search **stops** (``None``) when that value is already confirmed, or within
  ``tolerance`` of the largest confirmed value, or when nothing is left between the bounds.

Without any measured peak (a backend that cannot report one) and without a prior, the rule
falls back to doubling until the first failure, then bisection.

Everything here is plain data: no framework is imported, so the rule is tested with a fake
``fits(value)`` and no device (see ``tests/core/test_search_rule.py``).

With a prior 5% off in its slope, two probes reach 304 of a true maximum of 307 (99%):

>>> def peak(v: int) -> int:  # 1 GiB fixed + 10 MiB per item
...     return 2**30 + 10 * 2**20 * v
>>> history: list[Probe] = []
>>> budget = 4 * 2**30
>>> prior = Prior(intercept_bytes=2**30, slope_bytes=10.5 * 2**20)
>>> while (v := next_probe(history, low=1, high=4096, budget=budget, margin=0.0,
...                         prior=prior)) is not None:
...     history.append(Probe(v, peak(v), peak(v) <= budget))
>>> [p.value for p in history], best_probe(history, budget=budget, margin=0.0).value
([273, 304], 304)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from memfit._checks import check_int_size
from memfit._plain import plain_fields
from memfit.errors import ConfigError

__all__ = [
    "AffineModel",
    "Prior",
    "Probe",
    "best_probe",
    "ceiling_value",
    "fit_model",
    "island_probe",
    "next_probe",
    "target_bytes",
    "valid_values",
]

#: Default relative tolerance: stop once the next candidate is within 1% of a confirmed value.
DEFAULT_TOLERANCE = 0.01
#: After a failure the model did not predict, the next value backs off from the failure by
#: this share of the open interval (doubling with each further failure).
_BACKOFF = 0.1
#: Extrapolate from two probes only when the peak rose between them by at least this share of
#: what is left to the target (so that rounding noise cannot pass for a slope).
_RESOLUTION = 0.1
#: Without a prior and while the measurements cannot tell the slope, grow at least this much.
_GROWTH = 4


@dataclass(frozen=True)
class Probe:
    """One short run at one knob value.

    Attributes:
        value: The knob value the probe ran at.
        peak_bytes: The peak memory measured during the probe, or ``None`` when the backend
            cannot tell. For a probe that ran out of memory it is the peak seen before the
            failure (a lower bound of what the step needs), or ``None``.
        ok: ``True`` when the probe ran to the end, ``False`` when it ran out of memory.
    """

    value: int
    peak_bytes: int | None
    ok: bool

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON."""
        return plain_fields(self)


@dataclass(frozen=True)
class AffineModel:
    """Peak memory as ``intercept_bytes + slope_bytes * value``.

    Attributes:
        intercept_bytes: Bytes that do not grow with the knob (may be negative for a secant
            through a curved region).
        slope_bytes: Bytes per unit of the knob (positive).
    """

    intercept_bytes: float
    slope_bytes: float

    def peak_bytes(self, value: float) -> float:
        """Predicted peak at ``value``."""
        return self.intercept_bytes + self.slope_bytes * value

    def largest_fitting(self, limit_bytes: float) -> float:
        """The real value at which the predicted peak reaches ``limit_bytes``."""
        return (limit_bytes - self.intercept_bytes) / self.slope_bytes


@dataclass(frozen=True)
class Prior:
    """What is known before the first probe, as plain data.

    Give an affine model (``slope_bytes``, with ``intercept_bytes`` when known), or a single
    predicted point (``value`` with ``peak_bytes``), or only ``value`` (a predicted largest
    fitting value, e.g. a plan's knob). ``memfit.runtime.fit`` builds one from a
    ``TorchEstimate``, ``JaxEstimate``, ``MeasuredTerms`` or ``Plan``.

    Attributes:
        slope_bytes: Predicted bytes per unit of the knob, or ``None``.
        intercept_bytes: Predicted fixed bytes, or ``None`` (then taken as 0 with a slope, or
            derived from ``value``/``peak_bytes``).
        value: A knob value the prior speaks about, or ``None``.
        peak_bytes: The predicted peak at ``value``, or ``None`` (then ``value`` is taken as
            the predicted largest fitting value).
        uncertainty: How far the prior may be off, as a fraction of the predicted peak; the
            first probe is de-rated by it.
        local: The prior's slope was traced near the answer (at the sizes the search heads
            for): it is kept over a secant through probes that do not bracket the target,
            which can span a kink of the curve (the peak moving from the optimizer update to
            the activations) and read the slope low.

    Raises:
        ConfigError: When the prior is empty, or a number is negative, zero where it must be
            positive, or not finite.
    """

    slope_bytes: float | None = None
    intercept_bytes: float | None = None
    value: int | None = None
    peak_bytes: float | None = None
    uncertainty: float = 0.05
    local: bool = False

    def __post_init__(self) -> None:
        if self.slope_bytes is None and self.value is None:
            raise ConfigError(
                "a prior needs a slope or a value",
                key_path="prior",
                hint="give Prior(slope_bytes=..., intercept_bytes=...) or Prior(value=...)",
            )
        for name in ("slope_bytes", "intercept_bytes", "peak_bytes"):
            number = getattr(self, name)
            if number is not None and not math.isfinite(number):
                raise ConfigError(f"not a finite number: {number!r}", key_path=f"prior.{name}")
        if self.slope_bytes is not None and self.slope_bytes <= 0:
            raise ConfigError(
                f"the slope must be positive, got {self.slope_bytes!r}",
                key_path="prior.slope_bytes",
                hint="memory that does not grow with the knob cannot guide a search over it",
            )
        if self.value is not None and self.value < 1:
            raise ConfigError(f"must be at least 1, got {self.value!r}", key_path="prior.value")
        if self.peak_bytes is not None and self.peak_bytes <= 0:
            raise ConfigError(
                f"must be positive, got {self.peak_bytes!r}", key_path="prior.peak_bytes"
            )
        if not 0 <= self.uncertainty < 1:
            raise ConfigError(
                f"must be in [0, 1), got {self.uncertainty!r}", key_path="prior.uncertainty"
            )

    def model(self) -> AffineModel | None:
        """The prior as an affine model, or ``None`` when it only names a value.

        A single point without a slope becomes the proportional line through it, which, for
        a real curve with fixed bytes, over-states the slope and so errs on the safe side.
        """
        if self.slope_bytes is not None:
            if self.intercept_bytes is not None:
                return AffineModel(self.intercept_bytes, self.slope_bytes)
            if self.value is not None and self.peak_bytes is not None:
                return AffineModel(
                    self.peak_bytes - self.slope_bytes * self.value, self.slope_bytes
                )
            return AffineModel(0.0, self.slope_bytes)
        if self.value is not None and self.peak_bytes is not None:
            return AffineModel(0.0, self.peak_bytes / self.value)
        return None


def target_bytes(budget: int, margin: float) -> float:
    """The peak a chosen value may reach: the budget less the margin.

    Raises:
        ConfigError: When the budget is not positive or the margin is outside ``[0, 1)``.

    >>> target_bytes(1000, 0.05)
    950.0
    """
    if budget <= 0:
        raise ConfigError(f"the budget must be positive, got {budget!r}", key_path="budget")
    if not 0 <= margin < 1:
        raise ConfigError(
            f"the margin must be in [0, 1), got {margin!r}",
            key_path="margin",
            hint="write a fraction like 0.05 (5%)",
        )
    return budget * (1.0 - margin)


def _fits_target(probe: Probe, target: float) -> bool:
    return probe.ok and (probe.peak_bytes is None or probe.peak_bytes <= target)


def best_probe(history: Sequence[Probe], *, budget: int, margin: float) -> Probe | None:
    """The probe with the largest value that ran and left the margin, or ``None``.

    A probe that ran but whose peak is unknown counts as fitting: it ran under the device
    cap, and nothing better is known about it.

    Raises:
        ConfigError: When the budget or margin is out of range.
    """
    target = target_bytes(budget, margin)
    fitting = [p for p in history if _fits_target(p, target)]
    return max(fitting, key=lambda p: p.value) if fitting else None


def ceiling_value(history: Sequence[Probe], *, budget: int, margin: float) -> int | None:
    """The smallest value known not to fit (it ran out of memory, or broke the margin).

    Every value at or above it is out of the search (memory grows with the knob). ``None``
    when no probe has failed.

    Raises:
        ConfigError: When the budget or margin is out of range.
    """
    target = target_bytes(budget, margin)
    too_big = [p.value for p in history if not _fits_target(p, target)]
    return min(too_big) if too_big else None


def valid_values(
    *, low: int, high: int, multiple_of: int = 1, constraint: Callable[[int], bool] | None = None
) -> Callable[[int], bool]:
    """A predicate for the values the search may return.

    Raises:
        ConfigError: When ``low``, ``high`` or ``multiple_of`` is not an integer, ``low`` is
            below 1, ``high`` below ``low`` or ``multiple_of`` below 1.
    """
    for name, given in (("low", low), ("high", high), ("multiple_of", multiple_of)):
        hint = "knob values are integers (a batch size, a count of environments)"
        if isinstance(given, bool) or not isinstance(given, int):
            raise ConfigError(f"must be a whole number, got {given!r}", key_path=name, hint=hint)
        check_int_size(name, given, hint=hint)
    if low < 1:
        raise ConfigError(f"must be at least 1, got {low!r}", key_path="low")
    if high < low:
        raise ConfigError(f"must be at least low ({low}), got {high!r}", key_path="high")
    if multiple_of < 1:
        raise ConfigError(f"must be at least 1, got {multiple_of!r}", key_path="multiple_of")

    def ok(value: int) -> bool:
        if value < low or value > high or value % multiple_of:
            return False
        return constraint is None or bool(constraint(value))

    return ok


def _largest_valid_at_most(
    x: int, floor_exclusive: int, valid: Callable[[int], bool], multiple_of: int
) -> int | None:
    v = x - x % multiple_of
    while v > floor_exclusive:
        if valid(v):
            return v
        v -= multiple_of
    return None


def _smallest_valid_at_least(
    x: int, ceil_inclusive: int, valid: Callable[[int], bool], multiple_of: int
) -> int | None:
    v = x + (-x) % multiple_of
    while v <= ceil_inclusive:
        if valid(v):
            return v
        v += multiple_of
    return None


def fit_model(
    history: Sequence[Probe], *, target: float, prior: Prior | None
) -> AffineModel | None:
    """The affine model of peak over value from the measured probes (and the prior).

    Two measured probes on either side of the target give the secant between them. Without
    such a bracket, the secant through the largest probe and a probe at most half its value
    (a wide base, so that allocator rounding does not swamp the slope), or else the next
    largest, is used when the peak rose between them by at least a tenth of what is left to
    the target. Otherwise the model is
    anchored at one measured probe, with the prior's slope, or without a prior the
    proportional line through the origin.

    Args:
        history: The probes so far.
        target: The peak the chosen value may reach (bytes).
        prior: The prior, used for the slope while the measurements cannot tell it.

    Returns:
        The model, or ``None`` when there is neither a measurement nor a prior model.
    """
    return _model(history, target, prior)[0]


def _measured_points(history: Sequence[Probe]) -> list[tuple[int, int]]:
    by_value: dict[int, int] = {}
    for p in history:
        if p.ok and p.peak_bytes is not None:
            by_value[p.value] = max(p.peak_bytes, by_value.get(p.value, 0))
    return sorted(by_value.items())


def _model(
    history: Sequence[Probe], target: float, prior: Prior | None
) -> tuple[AffineModel | None, str, tuple[int, int] | None]:
    """The model, how it was made (``secant``, ``anchored``, ``prior``, ``none``), its anchor."""
    points = _measured_points(history)
    prior_model = prior.model() if prior is not None else None
    if len(points) >= 2:
        below = [pt for pt in points if pt[1] <= target]
        above = [pt for pt in points if pt[1] > target]
        if below and above:
            (v1, p1), (v2, p2) = below[-1], above[0]
            resolved = p2 > p1
        elif prior is not None and prior.local and prior_model is not None:
            resolved = False  # the local slope beats a secant that may span a kink
        else:
            v2, p2 = points[-1]
            wide = [pt for pt in points[:-1] if pt[0] <= v2 // 2]
            v1, p1 = wide[-1] if wide else points[-2]
            resolved = p2 > p1 and p2 - p1 >= _RESOLUTION * abs(target - p2)
        if resolved:
            slope = (p2 - p1) / (v2 - v1)
            return AffineModel(p2 - slope * v2, slope), "secant", None
    if points:
        below = [pt for pt in points if pt[1] <= target]
        anchor = below[-1] if below else points[0]
        anchor_value, anchor_peak = anchor
        slope = prior_model.slope_bytes if prior_model is not None else anchor_peak / anchor_value
        if slope > 0:
            return AffineModel(anchor_peak - slope * anchor_value, slope), "anchored", anchor
    if prior_model is not None:
        return prior_model, "prior", None
    return None, "none", None


def _steepen_for_failures(
    model: AffineModel, history: Sequence[Probe], budget: int, best: Probe | None
) -> AffineModel:
    """Make the model agree with the failures: a value that ran out had a peak above budget."""
    failed = [p.value for p in history if not p.ok]
    if not failed:
        return model
    first_fail = min(failed)
    if model.peak_bytes(first_fail) > budget:
        return model
    if best is not None and best.peak_bytes is not None and first_fail > best.value:
        slope = (budget - best.peak_bytes) / (first_fail - best.value)
        if slope > model.slope_bytes:
            return AffineModel(best.peak_bytes - slope * best.value, slope)
    # Keep the slope, lift the line so that the failing value reaches the budget.
    return AffineModel(budget - model.slope_bytes * first_fail, model.slope_bytes)


def next_probe(
    history: Sequence[Probe],
    *,
    low: int,
    high: int,
    budget: int,
    margin: float = 0.05,
    multiple_of: int = 1,
    constraint: Callable[[int], bool] | None = None,
    prior: Prior | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
) -> int | None:
    """The next knob value to probe, or ``None`` when the search is done.

    Args:
        history: The probes so far, in the order they ran.
        low: The smallest value allowed (at least 1).
        high: The largest value allowed.
        budget: The memory the job may use, bytes (the device cap for the probes).
        margin: The fraction of the budget the chosen value must leave free.
        multiple_of: Values must be multiples of this.
        constraint: An extra rule a value must keep (``True`` when allowed), or ``None``.
        prior: What is known before probing, or ``None``.
        tolerance: Stop when the next candidate is at most this fraction above the largest
            confirmed value.

    Returns:
        A valid value not yet probed, strictly above every confirmed value and strictly below
        every failing one; or ``None``.

    Raises:
        ConfigError: When a bound, the budget, the margin or the tolerance is out of range.
    """
    if not 0 <= tolerance < 1:
        raise ConfigError(f"must be in [0, 1), got {tolerance!r}", key_path="tolerance")
    valid = valid_values(low=low, high=high, multiple_of=multiple_of, constraint=constraint)
    target = target_bytes(budget, margin)
    best = best_probe(history, budget=budget, margin=margin)
    ceiling = ceiling_value(history, budget=budget, margin=margin)
    floor_exclusive = best.value if best is not None else low - 1
    upper = high if ceiling is None else min(high, ceiling - 1)
    if upper <= floor_exclusive:
        return None
    probed = {p.value for p in history}

    model, kind, anchor = _model(history, target, prior)
    measured = bool(_measured_points(history))
    failed_above = sorted(
        p.value for p in history if not p.ok and (best is None or p.value > best.value)
    )
    contradicted = False
    if model is not None:
        contradicted = bool(failed_above) and model.peak_bytes(failed_above[0]) <= budget
        prior_model = prior.model() if prior is not None else None
        if kind == "anchored" and anchor is not None and prior is not None and prior_model:
            # One usable measurement and the prior's slope. The prior may be off in its fixed
            # bytes (re-anchoring fixes that) or in proportion (scaling by measured /
            # predicted fixes that); take whichever is safer, and lean by the prior's
            # uncertainty (steeper going up, shallower coming down from above the target).
            anchor_value, anchor_peak = anchor
            predicted = prior_model.peak_bytes(anchor_value)
            ratio = anchor_peak / predicted if predicted > 0 else 1.0
            # Lean by the prior's uncertainty, or by the error it showed here if larger; by
            # half the uncertainty when the scaling already took the error in.
            u = prior.uncertainty
            if anchor_peak <= target:
                factor = 1.0 + (u / 2 if ratio > 1.0 else max(u, 1.0 - ratio))
                slope = model.slope_bytes * max(1.0, ratio) * factor
            else:
                factor = 1.0 + (u / 2 if ratio < 1.0 else max(u, ratio - 1.0))
                slope = model.slope_bytes * min(1.0, ratio) / factor
            model = AffineModel(anchor_peak - slope * anchor_value, slope)
        model = _steepen_for_failures(model, history, budget, best)
        limit = target
        if not measured and prior is not None:
            # Prior alone: de-rate the first guess by how far the prior may be off.
            limit = target / (1.0 + prior.uncertainty)
        x = model.largest_fitting(limit)
        # A hair of slack so that float rounding does not cost a whole value.
        goal = math.floor(x + 1e-6) if math.isfinite(x) else upper
        if kind == "anchored" and prior is None and best is not None:
            # The proportional line is a floor, not a guess: the measurements cannot tell
            # the slope yet, so grow geometrically, or bisect below a failure, at least.
            if failed_above:
                goal = max(goal, (best.value + failed_above[0]) // 2)
            else:
                goal = max(goal, _GROWTH * best.value)
    elif prior is not None and prior.value is not None and not measured and best is None:
        goal = math.floor(prior.value * (1.0 - prior.uncertainty))
    elif best is None:
        goal = low
    elif ceiling is None:
        goal = 2 * best.value
    else:
        goal = (best.value + ceiling) // 2

    # Back off from the smallest value known not to fit when the model keeps missing: after
    # an out-of-memory it did not predict, or after two or more probes in a row that did
    # not fit. The share of the open interval doubles with each miss (10%, 20%, 40%, then
    # half: bisection), so the search cannot creep down one value at a time.
    streak = 0
    for p in reversed(history):
        if _fits_target(p, target):
            break
        streak += 1
    misses = 0
    if failed_above and (model is None or contradicted):
        misses = len(failed_above)
    if streak >= 2:
        misses = max(misses, streak - 1)
    if misses and ceiling is not None:
        lower = best.value if best is not None else low - 1
        share = min(0.5, _BACKOFF * 2 ** (misses - 1))
        goal = min(goal, ceiling - max(1, math.ceil(share * (ceiling - lower))))
    goal = min(goal, upper)
    if best is None:
        # Nothing confirmed yet: never go below the smallest valid value.
        candidate = _largest_valid_at_most(goal, low - 1, valid, multiple_of)
        if candidate is None:
            candidate = _smallest_valid_at_least(max(goal, low), upper, valid, multiple_of)
    else:
        candidate = _largest_valid_at_most(goal, best.value, valid, multiple_of)
    if candidate is None or candidate in probed:
        return None
    if best is not None and candidate <= best.value * (1.0 + tolerance):
        return None
    return candidate


def island_probe(
    history: Sequence[Probe],
    *,
    aim: float,
    value: int | None,
    valid: Callable[[int], bool],
    multiple_of: int = 1,
    uncertainty: float = 0.05,
) -> int | None:
    """A value above a failure, where the search may still find one that fits, or ``None``.

    On CUDA the search follows the allocated peak and aims it at ``aim``: the allocated peak
    the allocator model reaches at its own largest fitting value ``value``. Whether a value
    fits is a matter of the reserved peak, a step function of the request sizes that need
    not be monotone in the knob (a block crossing the 1 MiB line leaves the small pool's
    segments for room in a large one already there), so a value can fit above one that did
    not, and the model's largest fitting value can lie above a run that does not fit. When
    the last probe failed with its allocated peak below the aim, the failure is the
    allocator's packing, not the allocated peak: this returns the model's largest fitting
    value de-rated by ``uncertainty`` (as the first guess is), when it lies above the failure
    and was not probed.

    >>> history = [Probe(3840, 85_900_000, False)]
    >>> island_probe(history, aim=90_400_000, value=4818, valid=lambda v: True)
    4577
    """
    if not history or value is None:
        return None
    last = history[-1]
    if last.ok or last.peak_bytes is None or last.peak_bytes >= aim:
        return None
    goal = math.floor(value * (1.0 - uncertainty))
    candidate = _largest_valid_at_most(goal, last.value, valid, multiple_of)
    if candidate is None or candidate in {p.value for p in history}:
        return None
    return candidate
