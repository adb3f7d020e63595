"""The workloads of ``bench/fit_search.py`` and its replayed-allocator comparison: ``memfit.fit``
against the allocator model under a cap, with what a fake-tensor trace does not see on a real
GPU added on purpose. ``bench/fit_search.py --replayed`` runs every case and writes the table;
tests/estimate/torch/test_fit_allocator_model.py runs a few."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from memfit.errors import InfeasiblePlan
from memfit.estimate import TorchStep
from memfit.runtime import fit as fit_mod
from memfit.runtime.fit import fit, trace_prior
from memfit.units import MiB


def _mlp_build() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
    )
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def _mlp_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 64), torch.randint(0, 10, (n,))


def _cnn_build() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 10),
    )
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def _cnn_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 3, 8, 8), torch.randint(0, 10, (n,))


class _TinyTransformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(100, 32)
        self.layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.head = nn.Linear(32, 100)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.layer(self.embed(tokens)))


def _transformer_build() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = _TinyTransformer()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def _transformer_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randint(0, 100, (n, 16)), torch.randint(0, 100, (n, 16))


def _step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: Any) -> None:
    x, y = batch
    logits = model(x)
    loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


@dataclass(frozen=True)
class Workload:
    name: str
    step: TorchStep
    budgets: tuple[int, ...]  # simulated budgets, bytes


WORKLOADS = (
    Workload("mlp-adam", TorchStep(_mlp_build, _step, _mlp_batch), (3 * MiB, 4 * MiB, 6 * MiB)),
    Workload("cnn-bn-sgd", TorchStep(_cnn_build, _step, _cnn_batch), (4 * MiB, 8 * MiB, 12 * MiB)),
    Workload(
        "transformer-adamw",
        TorchStep(_transformer_build, _step, _transformer_batch),
        (6 * MiB, 10 * MiB, 16 * MiB),
    ),
)


HIGH = 8192  # the largest batch any method may try (Lightning's max_val)


def bisect_fits(fits: Callable[[int], bool]) -> int:
    """The largest batch in ``[0, HIGH]`` that a bisection finds to fit (0: none does). ``fits``
    need not be monotone: the callers scan above the result."""
    lo, hi = 0, HIGH
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


#: Perturbations of the traced sequence: what the real GPU adds that the trace cannot see.
PERTURBATIONS = {
    "exact": "the trace's own allocations",
    "mild": "activations 3% larger, a kernel workspace (0.5 MiB + 64 B per item) around every "
    "tenth allocation",
    "unknown-ws": "mild, and an 8.125 MiB workspace the trace knows nothing of, all run long",
}


REPLAYED_AT = (768, 2304, 6144)


def perturbed(traced: Any, kind: str) -> Any:
    """The traced :class:`~memfit.estimate.torch._sequence.SequenceModel` as a real GPU runs it."""
    from memfit.estimate.torch._sequence import SequenceModel

    if kind == "exact":
        return traced
    allocs: list[bool] = []
    records: list[int] = []
    intercepts: list[float] = []
    slopes: list[float] = []
    extra = max(traced.records) + 1
    if kind == "unknown-ws":
        allocs.append(True)
        records.append(extra)
        intercepts.append(8.125 * MiB)
        slopes.append(0.0)
        extra += 1
    count = 0
    for is_alloc, record, a, b in zip(
        traced.allocs, traced.records, traced.intercepts, traced.slopes, strict=True
    ):
        allocs.append(is_alloc)
        records.append(record)
        intercepts.append(a)
        slopes.append(b * 1.03)
        if is_alloc:
            count += 1
            if count % 10 == 0:
                for flag in (True, False):
                    allocs.append(flag)
                    records.append(extra)
                    intercepts.append(0.5 * MiB)
                    slopes.append(64.0)
                extra += 1
    return SequenceModel(tuple(allocs), tuple(records), tuple(intercepts), tuple(slopes))


class ReplayedCuda(fit_mod._CudaMeter):
    """memfit.fit's CUDA meter, with the allocator model under the cap as the GPU."""

    def __init__(self, gpu: Any, budget: int) -> None:
        super().__init__(0)
        self.name = "cuda:replayed"
        self.gpu = gpu
        self.budget = budget
        self.cap: int | None = None
        self.peaks = (0, 0)

    def default_budget(self) -> int:
        return self.budget

    @contextmanager
    def capped(self, budget: int) -> Iterator[None]:
        self.cap = budget
        try:
            yield
        finally:
            self.cap = None

    def before_probe(self) -> None:
        self.peaks = (0, 0)

    def after_probe(self) -> int | None:
        self.last_reserved = self.peaks[1]
        return self.peaks[0]

    def release(self) -> None:
        pass

    def run(self, value: int) -> None:
        got = self.gpu.replay(value, limit_bytes=self.cap)
        self.peaks = (got.allocated_peak, got.reserved_peak)
        if not got.fits:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB")


def replayed_true_max(gpu: Any, budget: int, margin: float) -> int:
    """The largest batch that runs under the cap with its reserved peak within the margin:
    a bisection, then every batch up to 35% above it: a step function need not be monotone
    (a batch can run where a smaller one broke the margin, its segments packed otherwise)."""
    target = int(budget * (1 - margin))

    def fits(v: int) -> bool:
        return bool(gpu.replay(v, limit_bytes=budget, target_bytes=target).fits)

    lo = bisect_fits(fits)
    best = lo
    for v in range(lo + 1, min(HIGH, int(lo * 1.35) + 1) + 1):
        if fits(v):
            best = v
    return best


def reserved_line_search(gpu: Any, budget: int, margin: float, prior: Any) -> tuple[int, int]:
    """The H100 run's rule: the affine search over reserved peaks with the reserved-level
    prior, under the cap; returns (value, probes)."""
    from memfit.core.search import Probe, best_probe, next_probe

    search_prior = fit_mod.prior_from(prior, reserved=True)
    history: list[Any] = []
    while len(history) < 16:
        value = next_probe(
            history, low=1, high=HIGH, budget=budget, margin=margin, prior=search_prior
        )
        if value is None:
            break
        got = gpu.replay(value, limit_bytes=budget)
        history.append(Probe(value, got.reserved_peak, got.fits))
    best = best_probe(history, budget=budget, margin=margin)
    return (best.value if best is not None else 0), len(history)


def replayed_case(workload: Workload, kind: str, at: int, margin: float) -> dict[str, Any]:
    """One workload, perturbation, budget and margin on the replayed allocator."""
    from memfit.estimate.torch.trace import estimate_torch

    step = workload.step
    base = estimate_torch(
        step.build, step.step, step.make_batch, [1024, 4096], kernel_scratch=False
    )
    assert base.sequence is not None
    gpu = perturbed(base.sequence, kind)
    # the budget at which ``at`` just keeps the margin (rounded up: rounded down, ``at``
    # itself would break the margin by a byte and sit on the edge of a segment step)
    reserved = gpu.replay(at).reserved_peak
    budget = math.ceil(reserved / (1 - margin))
    while math.floor(budget * (1 - margin)) < reserved:
        budget += 1
    truth = replayed_true_max(gpu, budget, margin)
    prior = trace_prior(step, low=1, high=HIGH, budget=budget, margin=margin, device="cuda")
    meter = ReplayedCuda(gpu, budget)
    chooser = fit_mod._choose_meter
    fit_mod._choose_meter = lambda device: meter  # type: ignore[assignment]
    try:
        result = fit(meter.run, low=1, high=HIGH, budget=budget, margin=margin, prior=prior)
        value, probes, ooms = result.value, len(result.probes), result.oom_count
    except InfeasiblePlan:
        value, probes, ooms = 0, 0, 0
    finally:
        fit_mod._choose_meter = chooser  # type: ignore[assignment]
    old_value, old_probes = reserved_line_search(gpu, budget, margin, prior)
    return {
        "workload": workload.name,
        "perturbation": kind,
        "budget_at": at,
        "budget_bytes": budget,
        "margin": margin,
        "true_max": truth,
        "value": value,
        "probes": probes,
        "ooms": ooms,
        "fraction": round(value / truth, 4) if truth else None,
        "above_max": value > truth,
        "reserved_line_value": old_value,
        "reserved_line_probes": old_probes,
        "reserved_line_fraction": round(old_value / truth, 4) if truth else None,
    }
