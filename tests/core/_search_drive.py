"""The search rule of ``memfit fit`` driven against a fake device, checking its promises."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from memfit.core.search import Prior, Probe, ceiling_value, next_probe, target_bytes


@dataclass
class FakeDevice:
    """A device whose step at ``value`` peaks at ``peak(value)`` bytes, capped at ``budget``.

    A probe over the cap runs out of memory: it reports the cap as the peak seen before the
    failure (as a capped allocator would) and ``ok=False``. ``measures=False`` is a backend
    that cannot report peaks at all.
    """

    peak: Callable[[int], int]
    budget: int
    measures: bool = True
    calls: list[int] = field(default_factory=list)

    def run(self, value: int) -> Probe:
        self.calls.append(value)
        need = self.peak(value)
        ok = need <= self.budget
        seen = need if ok else self.budget
        return Probe(value, seen if self.measures else None, ok)

    def true_max(
        self, *, low: int, high: int, margin: float, valid: Callable[[int], bool] = lambda v: True
    ) -> int | None:
        """The largest valid value leaving the margin, by exhaustive search."""
        target = target_bytes(self.budget, margin)
        best = None
        for v in range(low, high + 1):
            if valid(v) and self.peak(v) <= target:
                best = v
        return best


def drive(
    device: FakeDevice,
    *,
    low: int,
    high: int,
    margin: float = 0.05,
    multiple_of: int = 1,
    constraint: Callable[[int], bool] | None = None,
    prior: Prior | None = None,
    max_probes: int = 100,
) -> list[Probe]:
    """Run the rule to the end (or ``max_probes``), checking its promises at every step."""
    history: list[Probe] = []
    while len(history) < max_probes:
        value = next_probe(
            history,
            low=low,
            high=high,
            budget=device.budget,
            margin=margin,
            multiple_of=multiple_of,
            constraint=constraint,
            prior=prior,
        )
        if value is None:
            break
        assert value not in {p.value for p in history}, "probed twice"
        ceiling = ceiling_value(history, budget=device.budget, margin=margin)
        assert ceiling is None or value < ceiling, "returned a value known not to fit"
        assert low <= value <= high and value % multiple_of == 0
        assert constraint is None or constraint(value)
        history.append(device.run(value))
    return history
