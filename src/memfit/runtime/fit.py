"""``memfit.fit``: confirm the largest knob value that fits, in one to three short probes.

:func:`fit` drives the pure search rule of :mod:`memfit.core.search` against a real device:
it calls ``run(value)`` (one short probe, e.g. two training steps at that batch size),
measures the probe's peak memory, catches an out-of-memory error as information, and asks the
rule for the next value until the rule is done.

Where the peak comes from, in this order:

* the active :func:`memfit.simulate_gpu` context on the CPU: its ``peak_allocated_bytes``
  (the budget defaults to the simulated GPU's; the simulated GPU's own size is the cap, so a
  smaller budget is a target: a probe over it runs and counts as not fitting);
* CUDA (torch): ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``, with
  the caching allocator capped at the budget by ``torch.cuda.set_per_process_memory_fraction``
  for the whole search (the previous fraction is restored afterwards), so a probe cannot take
  the machine down. A probe fits when it ran under the cap and its ``max_memory_reserved``
  left the margin. The search follows the allocated peak, which grows smoothly with the knob;
  reserved memory is a step function of it (20 MiB segments, cached blocks the allocator
  gives back at the cap), which a line through reserved peaks reads badly. The rule follows
  the allocated peaks and aims them at the allocated peak the allocator model reaches at its
  own largest fitting value under the same cap and margin (``TorchEstimate.largest_fitting``:
  a traced prior's allocations replayed at any batch size), or at the target without one,
  and never below a probe that fitted; a prior traced near the answer (``trace_prior``)
  gives the slope. Reserved memory need not grow with the knob (a block crossing the 1 MiB
  line leaves the small pool for room in a large segment already there), so a failure
  whose allocated peak is below the aim is the allocator's packing: one probe goes to the
  model's largest fitting value, de-rated as the first guess is, above it
  (:func:`memfit.core.search.island_probe`), and a failure below a value that fitted bounds
  nothing above that value. The budget defaults to what this process can
  still reach (free memory plus what its allocator already holds, within a cap already set
  on the allocator such as ``simulate_gpu(budget, device="cuda")``);
* JAX on a GPU: ``peak_bytes_in_use`` from ``device.memory_stats()``. JAX cannot reset that
  peak, so a probe's peak is known only when it rises above every earlier one (otherwise it
  is ``None`` and the rule works from the other probes). JAX cannot be capped after it has
  started; set ``XLA_PYTHON_CLIENT_MEM_FRACTION`` before it initialises.

Out-of-memory errors are recognised by :func:`memfit.runtime.oom.is_oom`; memory is freed after
the ``except`` block is left, with the traceback's frames and chained exceptions cleared, so
the failed probe's tensors really go.
"""

from __future__ import annotations

import dataclasses
import gc
import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from memfit._checks import require, require_callable, require_positive_int
from memfit._plain import plain_fields
from memfit.backends.live import (
    JaxReader,
    SimulatedReader,
    TorchCudaReader,
    jax_gpu,
    simulated_gpu,
    torch_cuda_available,
)
from memfit.core.measured import MeasuredTerms
from memfit.core.search import (
    DEFAULT_TOLERANCE,
    Prior,
    Probe,
    best_probe,
    fit_model,
    island_probe,
    next_probe,
    target_bytes,
    valid_values,
)
from memfit.errors import BackendUnavailable, ConfigError, InfeasiblePlan
from memfit.runtime.oom import forget_exception, is_oom
from memfit.units import format_bytes, parse_bytes

__all__ = ["FitResult", "Prior", "Probe", "fit", "prior_from", "trace_prior"]

if TYPE_CHECKING:
    from memfit.estimate import TorchStep
    from memfit.estimate.torch.trace import TorchEstimate

#: Largest batch the first trace for a prior runs at (fake tensors: it costs time, not memory).
FIRST_TRACE_MAX = 1024

#: Probes :func:`fit` runs at most before it returns the best confirmed value.
DEFAULT_MAX_PROBES = 16


@dataclass(frozen=True)
class FitResult:
    """What :func:`fit` found.

    Attributes:
        value: The largest value confirmed to fit, leaving the margin.
        probes: Every probe, in the order it ran: ``(value, peak_bytes, ok)``.
        predicted_peak: The peak the final affine model predicts at ``value`` (bytes), or
            ``None`` when no model could be formed (no measured peak and no prior).
        budget_bytes: The budget the probes ran under.
        margin: The fraction of the budget the value leaves free.
        device: Where the probes ran (``"simulated"``, ``"cuda:0"``, ``"jax:gpu:0"``).
    """

    value: int
    probes: tuple[Probe, ...]
    predicted_peak: int | None
    budget_bytes: int
    margin: float
    device: str

    @property
    def peak_bytes(self) -> int | None:
        """The measured peak of the probe at :attr:`value`, or ``None`` when unknown."""
        for probe in self.probes:
            if probe.value == self.value and probe.ok:
                return probe.peak_bytes
        return None

    @property
    def oom_count(self) -> int:
        """How many probes ran out of memory (each caught and used as information)."""
        return sum(1 for p in self.probes if not p.ok)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON (sizes in bytes)."""
        return plain_fields(
            self,
            probes=[p.to_dict() for p in self.probes],
            peak_bytes=self.peak_bytes,
            oom_count=self.oom_count,
        )


class _Meter(Protocol):
    """Measures one probe's peak on one backend."""

    name: str

    def default_budget(self) -> int: ...

    @contextmanager
    def capped(self, budget: int) -> Iterator[None]: ...

    def before_probe(self) -> None: ...

    def after_probe(self) -> int | None: ...

    def release(self) -> None: ...


class _SimulatedMeter:
    """The active CPU :func:`memfit.simulate_gpu` context: its budget is the cap."""

    name = "simulated"

    def __init__(self, gpu: Any) -> None:
        self._gpu = gpu
        self._reader = SimulatedReader()

    def default_budget(self) -> int:
        return int(self._gpu.budget_bytes)

    @contextmanager
    def capped(self, budget: int) -> Iterator[None]:
        if budget > self._gpu.budget_bytes:
            raise ConfigError(
                f"budget {format_bytes(budget)} is more than the simulated GPU "
                f"({format_bytes(self._gpu.budget_bytes)})",
                key_path="budget",
                hint="give a budget no larger than the simulate_gpu budget, or leave it out",
            )
        yield

    def before_probe(self) -> None:
        gc.collect()
        self._reader.reset_peak()

    def after_probe(self) -> int | None:
        return self._reader.read().peak_allocated_bytes

    def release(self) -> None:
        gc.collect()


class _CudaMeter:
    """torch's caching allocator on one CUDA device, capped at the budget."""

    def __init__(self, index: int) -> None:
        self._index = index
        self._live: TorchCudaReader | None = None
        self.name = f"cuda:{index}"
        self.last_reserved = 0

    @property
    def _reader(self) -> TorchCudaReader:
        """The device's live reader (made on first use: making it reads the device)."""
        if self._live is None:
            import torch

            self._live = TorchCudaReader(torch, self._index)
        return self._live

    def default_budget(self) -> int:
        """What this process can still reach: free plus already reserved memory, and no
        more than a cap already on the allocator (``simulate_gpu(device="cuda")`` or the
        process's own ``set_per_process_memory_fraction``), which the search's own cap
        replaces while it runs."""
        import torch

        now = self._reader.read()
        total = now.total_bytes or 0
        free = total - (now.device_used_bytes or 0)
        reachable = free + (now.reserved_bytes or 0)
        gpu = simulated_gpu()
        if gpu is not None and gpu.device_kind == self.name:
            return min(reachable, int(gpu.budget_bytes))  # exact, not through a float fraction
        fraction = float(torch.cuda.get_per_process_memory_fraction(self._index))
        return min(reachable, int(fraction * total))

    @contextmanager
    def capped(self, budget: int) -> Iterator[None]:
        from memfit.runtime.simulate import cuda_allocator_cap

        with cuda_allocator_cap(self._index, budget):
            yield

    def before_probe(self) -> None:
        import torch

        gc.collect()
        torch.cuda.empty_cache()
        self._reader.reset_peak()

    def after_probe(self) -> int | None:
        import torch

        torch.cuda.synchronize(self._index)
        now = self._reader.read()
        self.last_reserved = now.peak_reserved_bytes or 0
        return now.peak_allocated_bytes

    def release(self) -> None:
        import torch

        gc.collect()
        torch.cuda.empty_cache()


class _JaxMeter:
    """A JAX device with memory statistics (a GPU); the peak cannot be reset."""

    def __init__(self, device: Any) -> None:
        self._reader = JaxReader(device)
        self.name = f"jax:{device.platform}:{device.id}"
        self._running_peak = self._reader.read().peak_allocated_bytes or 0

    def default_budget(self) -> int:
        limit = self._reader.read().budget_bytes
        if limit is None:
            raise ConfigError(
                f"{self.name} does not report its memory limit",
                key_path="budget",
                hint="give --budget / budget= explicitly",
            )
        return int(limit)

    @contextmanager
    def capped(self, budget: int) -> Iterator[None]:
        yield

    def before_probe(self) -> None:
        gc.collect()

    def after_probe(self) -> int | None:
        peak = self._reader.read().peak_allocated_bytes
        if peak is None or peak <= self._running_peak:
            return None
        self._running_peak = int(peak)
        return int(peak)

    def release(self) -> None:
        gc.collect()


def _choose_meter(device: str | None) -> _Meter:
    """Pick where to measure: the active simulation, CUDA, or a JAX GPU."""
    sim = simulated_gpu()
    wanted = device.strip().lower() if device is not None else None
    if sim is not None and sim.device_kind == "cpu" and wanted in (None, "cpu", "simulated"):
        return _SimulatedMeter(sim)
    if wanted in ("cpu", "simulated"):
        raise BackendUnavailable(
            "a fit on the CPU needs an active memfit.simulate_gpu context to measure memory",
            hint='wrap the call in `with memfit.simulate_gpu("8GiB"):` or run on a GPU',
        )
    if sim is not None and wanted is None:
        wanted = sim.device_kind
    if wanted is None or wanted == "cuda" or wanted.startswith("cuda:"):
        torch = torch_cuda_available()
        if torch is not None:
            if wanted is None or wanted == "cuda":
                return _CudaMeter(int(torch.cuda.current_device()))
            try:
                index = int(wanted.split(":", 1)[1])
            except ValueError:
                raise ConfigError(
                    f"not a CUDA device: {device!r}", key_path="device", hint="write cuda:0"
                ) from None
            if not 0 <= index < torch.cuda.device_count():
                raise ConfigError(
                    f"no CUDA device {index} (torch sees {torch.cuda.device_count()})",
                    key_path="device",
                )
            return _CudaMeter(index)
        if wanted is not None:
            raise BackendUnavailable(
                f"{device} was asked for but torch has no CUDA device here",
                hint="use --device cpu (simulated under --budget) on a machine without a GPU",
            )
    if wanted in (None, "jax"):
        jax_device = jax_gpu()
        if jax_device is not None:
            return _JaxMeter(jax_device)
    if wanted not in (None, "jax"):
        raise ConfigError(
            f"unknown device {device!r}",
            key_path="device",
            hint="use cuda, cuda:N, cpu (under memfit.simulate_gpu) or jax",
        )
    raise BackendUnavailable(
        "no device to measure the probes on: no active simulate_gpu, no CUDA, no JAX GPU",
        hint='run on a GPU, or inside `with memfit.simulate_gpu("8GiB"):` on the CPU',
    )


def _number(obj: Any, *names: str) -> float | None:
    for name in names:
        value = getattr(obj, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def prior_from(
    prior: Any, *, knob: str | None = None, reserved: bool = False, tensors: bool = False
) -> Prior | None:
    """Turn what memfit predicted into a search :class:`~memfit.core.search.Prior`.

    Accepts a :class:`~memfit.core.search.Prior`, a ``TorchEstimate`` (its ``fit``, or its
    ``reserved_fit`` when the probes measure reserved memory: intercept and slope per item),
    a ``JaxEstimate`` (one compiled point: its batch size and executable peak), a
    :class:`~memfit.core.measured.MeasuredTerms`, the planner's ``Plan`` (its knob value and
    predicted bytes), or a plain ``int`` (a predicted largest fitting value).

    Args:
        prior: The prediction, or ``None``.
        knob: The knob a ``Plan`` prior is read at (needed when the plan has several knobs).
        reserved: The probes measure reserved memory: prefer a reserved-level fit.
        tensors: The probes count tensors only (:func:`memfit.simulate_gpu`): prefer a
            ``TorchEstimate``'s ``tensor_fit``, without the cuBLAS workspace a GPU adds.

    Returns:
        The prior, or ``None`` when ``prior`` is ``None``.

    Raises:
        ConfigError: When the prediction is of a kind memfit cannot read, or a ``Plan`` has
            several knobs and ``knob`` does not name one of them.
    """
    if prior is None or isinstance(prior, Prior):
        return prior
    if isinstance(prior, bool):
        raise ConfigError(f"not a prior: {prior!r}", key_path="prior")
    if isinstance(prior, int):
        return Prior(value=prior)
    if isinstance(prior, MeasuredTerms):
        return Prior(
            slope_bytes=prior.per_item_bytes,
            intercept_bytes=float(sum(prior.fixed_bytes.values())),
            uncertainty=_uncertainty(prior.residual_bytes, prior.peak_bytes(1)),
        )
    model = getattr(prior, "reserved_fit", None) if reserved else None
    if model is None and tensors:
        model = getattr(prior, "tensor_fit", None)
    if model is None:
        model = getattr(prior, "fit", None)
    if model is not None and not callable(model):
        slope = _number(model, "slope_bytes", "slope", "per_item_bytes")
        intercept = _number(model, "intercept_bytes", "intercept", "fixed_bytes")
        if slope is not None and slope > 0:
            residual = _number(model, "residual_bytes", "residual")
            return Prior(
                slope_bytes=slope,
                intercept_bytes=intercept,
                uncertainty=_uncertainty(residual, (intercept or 0.0) + slope),
            )
    point_value = _number(prior, "batch_size")
    point_peak = _number(prior, "executable_peak_bytes")
    if point_value is not None and point_peak is not None and point_value >= 1:
        return Prior(value=int(point_value), peak_bytes=point_peak)
    knobs = getattr(prior, "knobs", None)
    predicted = _number(prior, "predicted_bytes")
    if isinstance(knobs, Mapping) and predicted is not None:
        numeric = {k: v for k, v in knobs.items() if isinstance(v, int) and v >= 1}
        if knob is None and len(numeric) == 1:
            knob = next(iter(numeric))
        if knob is None or knob not in numeric:
            raise ConfigError(
                f"the plan has knobs {sorted(numeric)}; say which one the fit searches",
                key_path="knob",
                hint="pass knob=NAME",
            )
        return Prior(value=numeric[knob], peak_bytes=predicted)
    raise ConfigError(
        f"memfit cannot read a prior from {type(prior).__name__}",
        key_path="prior",
        hint="pass a TorchEstimate, JaxEstimate, MeasuredTerms, Plan, Prior or an int",
    )


def trace_prior(
    step: TorchStep,
    *,
    low: int,
    high: int,
    budget: int,
    margin: float = 0.05,
    device: str = "cpu",
    runtime: Mapping[str, str] | str | None = None,
) -> TorchEstimate | None:
    """Trace a PyTorch step with fake tensors for a prior; again near the answer if needed.

    A step's peak is often the optimizer update at small batches and the activations at
    large ones, so a line fitted across that kink can be far off near the answer. The first
    trace spans ``low`` to ``min(high, 1024)``; a second one is then taken at a half, three
    quarters and all of the answer the first one predicts, and its line is the prior.

    Args:
        step: The :class:`memfit.estimate.TorchStep`.
        low: The smallest knob value.
        high: The largest knob value.
        budget: The budget the fit will run under (bytes).
        margin: The fraction of the budget to leave free.
        device: Where the probes will run: ``"cpu"`` (a simulated GPU: traced on the CPU,
            tensors only) or ``"cuda[:N]"`` (traced on the fake CUDA device where torch has
            CUDA, else on the CPU; GPU figures with the cuBLAS workspace).
        runtime: The target's software, for the CUDA context in the prior's
            ``device_used_peak`` (see :func:`memfit.estimate_torch`).

    Returns:
        The estimate to pass as ``prior=``, or ``None`` when the trace finds no memory that
        grows with the knob.

    Raises:
        EstimateError: When the step cannot be traced (an op without a fake kernel, a
            data-dependent shape); the message names the op.
    """
    import torch

    from memfit.estimate.bridge import knob_trace_values
    from memfit.estimate.torch.trace import estimate_torch

    # Fake CUDA tensors need a CUDA build of torch; elsewhere the CUDA step traces on the CPU
    # (its GPU figures then assume the CPU's kernel choices, as estimate_torch says).
    on_cuda = device.startswith("cuda")
    built = bool(torch.backends.cuda.is_built())  # type: ignore[no-untyped-call]
    trace_device = "cuda" if on_cuda and built else "cpu"

    def trace(sizes: list[int]) -> TorchEstimate:
        return estimate_torch(
            step.build,
            step.step,
            step.make_batch,
            sizes,
            device=trace_device,
            batch_knob=step.batch_knob,
            runtime=runtime,
        )

    sizes = knob_trace_values(low, min(high, max(low, FIRST_TRACE_MAX)))
    estimate = trace(sizes)
    line = estimate.fit if on_cuda else estimate.tensor_fit
    if line is None or line.slope <= 0:
        return None
    predicted = (budget * (1.0 - margin) - line.intercept) / line.slope
    if not math.isfinite(predicted) or predicted < low:
        return estimate
    answer = min(high, int(predicted))
    near = sorted({max(low, answer // 2), max(low, (3 * answer) // 4), answer})
    if set(near) <= set(sizes):
        return estimate
    return trace(near)


def _uncertainty(residual: float | int | None, scale: float) -> float:
    """The prior's de-rating: 5%, or more when the fit's residual says it is rougher."""
    base = 0.05
    if residual is None or scale <= 0:
        return base
    return min(0.5, max(base, 2.0 * float(residual) / scale))


def _run_probe(
    run: Callable[[int], object], value: int, meter: _Meter, reserved_target: int | None = None
) -> Probe:
    """Run one probe; an out-of-memory error is caught and recorded, never re-raised. With
    ``reserved_target`` (CUDA), a probe whose reserved peak went past it does not fit."""
    meter.before_probe()
    failed = False
    try:
        run(value)
    except Exception as exc:
        if not is_oom(exc):
            raise
        failed = True
        forget_exception(exc)
    # Outside the except block: the exception and its frames are gone, so memory can go too.
    peak = meter.after_probe()
    if failed:
        meter.release()
    elif reserved_target is not None and getattr(meter, "last_reserved", 0) > reserved_target:
        failed = True  # ran under the cap, but did not leave the margin
    return Probe(value=value, peak_bytes=peak, ok=not failed)


def _less_collectives(budget_bytes: int, prior: Any) -> int:
    """The device's budget less what the collectives of a prior made for several GPUs
    (``estimate_torch(..., gpu="4xRTX 4090")``) hold on every device: torch makes its NCCL
    communicator at the first collective, after a fit run before training, and XLA at the
    first step that has one, so the default budget leaves their share free.

    Raises:
        InfeasiblePlan: When the collectives alone take the whole budget.
    """
    several: Any = getattr(prior, "collectives", None)
    share = int(getattr(several, "every_device_bytes", 0) or 0)
    if several is None or share <= 0:
        return budget_bytes
    if share >= budget_bytes:
        raise InfeasiblePlan(
            f"the collective terms of {several.count} GPUs take {format_bytes(share)}, the "
            f"whole budget of {format_bytes(budget_bytes)}",
            smallest_bytes=share,
            budget_bytes=budget_bytes,
            binding_term="nccl",
            hint="see memfit env --gpu NxCARD for NCCL settings that shrink them",
        )
    return budget_bytes - share


def _allocated_budget(
    prior: Any, cap: int, target: int, low: int, high: int
) -> tuple[int, int | None]:
    """On CUDA: the allocated peak the search aims at, from the prior's allocator replay
    under the same cap (its allocated peak at its largest fitting value), else the target;
    and that largest fitting value (``None`` without a replay)."""
    largest = getattr(prior, "largest_fitting", None)
    if callable(largest):
        got = largest(cap, low=low, high=high, target_bytes=target)
        if got is not None and getattr(got, "allocated_peak", 0) > 0:
            return int(got.allocated_peak), int(got.value)
    return target, None


def _above_best(history: list[Probe], budget: int, margin: float) -> list[Probe]:
    """The probes the search rule reads: a failure below a value that fitted is the caching
    allocator's packing (its reserved peak need not grow with the knob), not a ceiling for
    the values above that one; it is left out."""
    best = best_probe(history, budget=budget, margin=margin)
    if best is None:
        return history
    return [p for p in history if p.ok or p.value > best.value]


def fit(
    run: Callable[[int], object],
    *,
    low: int,
    high: int,
    budget: int | str | None = None,
    margin: float = 0.05,
    multiple_of: int = 1,
    constraint: Callable[[int], bool] | None = None,
    prior: Any = None,
    knob: str | None = None,
    device: str | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    max_probes: int = DEFAULT_MAX_PROBES,
) -> FitResult:
    """Find the largest knob value whose peak memory fits, confirmed on the device.

    Args:
        run: Runs one short probe at a knob value (e.g. two training steps at that batch
            size). It should leave no tensors behind that it allocated.
        low: The smallest value allowed (at least 1).
        high: The largest value allowed.
        budget: The memory the job may use (bytes or a size text); ``None`` takes what the
            device offers (the simulated GPU's budget; on CUDA free plus already reserved),
            less the collective terms of a prior made for several GPUs (its
            ``collectives``: NCCL's communicators, made after the fit).
        margin: The fraction of the budget the chosen value must leave free.
        multiple_of: Values must be multiples of this.
        constraint: An extra rule a value must keep, or ``None``.
        prior: What memfit predicted (``TorchEstimate``, ``JaxEstimate``, ``MeasuredTerms``,
            ``Plan``, :class:`~memfit.core.search.Prior` or an int); the first probe starts
            from it. ``None``: the first probe is the smallest valid value.
        knob: The knob name, to read a ``Plan`` prior with several knobs.
        device: ``None`` (the active simulated GPU, else CUDA, else a JAX GPU), ``"cpu"``
            (the active simulated GPU), ``"cuda"``, ``"cuda:N"`` or ``"jax"``.
        tolerance: Stop when the next candidate is at most this fraction above the best
            confirmed value.
        max_probes: Probes to run at most.

    Returns:
        The :class:`FitResult`.

    Raises:
        ConfigError: When ``run`` is not callable, or a bound, the budget, the margin, the
            prior or ``max_probes`` is invalid.
        BackendUnavailable: When there is nothing to measure on (no simulated GPU, CUDA or
            JAX GPU).
        InfeasiblePlan: When not even the smallest valid value fits the budget.
        Exception: Whatever ``run`` raises that is not an out-of-memory error.

    >>> import torch, memfit
    >>> def run(batch: int) -> None:
    ...     x = torch.ones(batch, 1024)  # 4 KiB per item
    ...     (x * 2).sum()
    >>> with memfit.simulate_gpu("1MiB"):
    ...     result = fit(run, low=1, high=4096, margin=0.0)
    >>> result.value, len(result.probes) <= 4
    (127, True)
    """
    require("budget", budget, "size", optional=True)
    require("margin", margin, "number")
    require("constraint", constraint, "callable", optional=True)
    require("knob", knob, "str", optional=True)
    require("device", device, "str", optional=True)
    require("tolerance", tolerance, "number")
    require_callable(
        "run", run, hint="pass a function run(value) -> None that runs one short probe"
    )
    require_positive_int("max_probes", max_probes)
    valid_values(low=low, high=high, multiple_of=multiple_of, constraint=constraint)
    meter = _choose_meter(device)
    search_prior = prior_from(prior, knob=knob, tensors=isinstance(meter, _SimulatedMeter))
    budget_bytes = parse_bytes(budget) if budget is not None else meter.default_budget()
    if budget is None:
        budget_bytes = _less_collectives(budget_bytes, prior)
    target = target_bytes(budget_bytes, margin)
    cuda = isinstance(meter, _CudaMeter)
    reserved_target = math.floor(target) if cuda else None
    aim = math.floor(target)
    model_value = None  # the allocator model's largest fitting value (CUDA, traced prior)
    if cuda:
        aim, model_value = _allocated_budget(prior, budget_bytes, aim, low, high)
        if search_prior is not None and getattr(prior, "sequence", None) is not None:
            # traced near the answer (trace_prior): its slope is the one to extrapolate with
            search_prior = dataclasses.replace(search_prior, local=True)
    history: list[Probe] = []
    looking, settled = False, aim
    islands = 0  # probes above a failure the allocator's packing made (island_probe)
    valid = valid_values(low=low, high=high, multiple_of=multiple_of, constraint=constraint)

    def search_budget() -> tuple[int, float]:
        """(budget, margin) the rule reads: on CUDA, the allocated-level aim (whether a
        probe fits is already in its ``ok``), raised to any probe that fitted."""
        if not cuda:
            return budget_bytes, margin
        fitted = [p.peak_bytes for p in history if p.ok and p.peak_bytes is not None]
        return max([aim, *fitted]), 0.0

    with meter.capped(budget_bytes):
        while len(history) < max_probes:
            if cuda and not islands:
                # A failure below the aim is the reserved peak's steps, not the allocated
                # peak: one probe where the allocated line reaches the aim, above it.
                island = island_probe(
                    history,
                    aim=aim,
                    value=model_value,
                    valid=valid,
                    multiple_of=multiple_of,
                    uncertainty=search_prior.uncertainty if search_prior is not None else 0.05,
                )
                if island is not None:
                    islands += 1
                    history.append(_run_probe(run, island, meter, reserved_target))
                    continue
            rule_budget, rule_margin = search_budget()
            value = next_probe(
                _above_best(history, rule_budget, rule_margin),
                low=low,
                high=high,
                budget=rule_budget,
                margin=rule_margin,
                multiple_of=multiple_of,
                constraint=constraint,
                prior=search_prior,
                tolerance=tolerance,
            )
            if value is None:
                if not history:
                    raise ConfigError(
                        f"no value in {low}..{high} is a multiple of {multiple_of} "
                        "and keeps the constraint",
                        key_path="constraint",
                        hint="widen low/high or relax the constraint",
                    )
                room = math.floor(target) - aim
                if cuda and not looking and all(p.ok for p in history) and room >= 20 * 2**20:
                    # Reached the model's aim without a failure, and the model left at least
                    # a large segment (20 MiB) of the target unused there: the device may
                    # pack the allocations better. Look halfway to the target (a probe under
                    # the cap costs at most an out-of-memory it survives).
                    looking, settled = True, aim
                    aim = (aim + math.floor(target)) // 2 + 1
                    continue
                break
            history.append(_run_probe(run, value, meter, reserved_target))
            if looking:
                looking = False
                if not history[-1].ok:
                    aim = settled  # the model's aim was right: back to it
    rule_budget, rule_margin = search_budget()
    best = best_probe(history, budget=rule_budget, margin=rule_margin)
    if best is None:
        smallest = min(history, key=lambda p: p.value) if history else None
        raise InfeasiblePlan(
            f"no value from {low} up fits {format_bytes(budget_bytes)} "
            f"less a {margin:.0%} margin on {meter.name}",
            smallest_bytes=smallest.peak_bytes if smallest is not None and smallest.ok else None,
            budget_bytes=budget_bytes,
            binding_term=None,
            hint="lower low, free memory on the device, or raise the budget",
        )
    model = fit_model(history, target=target_bytes(rule_budget, rule_margin), prior=search_prior)
    predicted = None
    if model is not None:
        estimate = model.peak_bytes(best.value)
        predicted = round(estimate) if math.isfinite(estimate) else None
    return FitResult(
        value=best.value,
        probes=tuple(history),
        predicted_peak=predicted,
        budget_bytes=budget_bytes,
        margin=margin,
        device=meter.name,
    )
