"""Fit a PyTorch step on its device: the largest batch that fits, with the state restored.

:func:`fit_step` is what ``memfit fit`` runs, as a function: it takes a
:class:`memfit.estimate.TorchStep` (or the ``module:function`` that returns one), traces it
with fake tensors for a first guess (unless ``prior=False``), builds the model and optimizer
on the device, runs :func:`memfit.fit` with ``steps`` real steps per probe, and restores the
model's and the optimizer's state afterwards (host copies of their ``state_dict``, taken
before the first probe). An out-of-memory error while building means the model alone does not
fit (:class:`~memfit.errors.InfeasiblePlan`); any other failure of the user's code is a
:class:`~memfit.errors.ConfigError` that names the factory, with the original exception
chained.

On a machine without a GPU, ``device="cpu"`` with a ``budget`` runs the probes under
:func:`memfit.simulate_gpu`, so the search itself can be rehearsed anywhere.

>>> import torch
>>> from memfit.estimate import TorchStep
>>> def build():
...     model = torch.nn.Linear(64, 64)
...     return model, torch.optim.SGD(model.parameters(), lr=0.1)
>>> def step(model, optimizer, batch):
...     model(batch).sum().backward()
...     optimizer.step()
...     optimizer.zero_grad(set_to_none=True)
>>> torch_step = TorchStep(build=build, step=step, make_batch=lambda n: torch.ones(n, 64))
>>> found = fit_step(torch_step, device="cpu", budget="1MiB", high=4096, prior=False)
>>> found.knob, found.result.device, 0 < found.result.value <= 4096
('batch_size', 'simulated', True)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memfit._checks import require_count
from memfit.errors import BackendUnavailable, ConfigError, InfeasiblePlan
from memfit.runtime.fit import FitResult, fit, trace_prior
from memfit.units import format_bytes, parse_bytes

if TYPE_CHECKING:
    from memfit.estimate import TorchStep
    from memfit.estimate.torch.trace import TorchEstimate

__all__ = ["DEFAULT_HIGH", "FitStepResult", "fit_step"]

#: Largest value searched when the caller gives no ``high``.
DEFAULT_HIGH = 65536


@dataclass(frozen=True)
class FitStepResult:
    """What :func:`fit_step` found.

    Attributes:
        result: The search's :class:`~memfit.runtime.fit.FitResult` (value, probes, peak).
        knob: The knob searched: the step's batch knob.
        prior: The fake-tensor trace the search started from, or ``None``.
        steps_per_probe: Real steps each probe ran.
    """

    result: FitResult
    knob: str
    prior: TorchEstimate | None
    steps_per_probe: int

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON: the result's fields plus ``knob``, ``steps_per_probe``,
        ``prior`` (intercept and slope in bytes, and the CUDA context its device-level
        figures assume; or ``None``) and ``state_restored``."""
        data = self.result.to_dict()
        fitted = self.prior.fit if self.prior is not None else None
        context = self.prior.context if self.prior is not None else None
        data.update(
            knob=self.knob,
            steps_per_probe=self.steps_per_probe,
            prior=(
                {
                    "intercept_bytes": fitted.intercept,
                    "slope_bytes": fitted.slope,
                    "context": None if context is None else context.to_dict(),
                }
                if fitted is not None
                else None
            ),
            state_restored=True,
        )
        return data


def _torch_step(step: Any) -> TorchStep:
    """The :class:`TorchStep` itself, or the one a ``module:function`` factory returns.

    Raises:
        ConfigError: When the factory cannot be loaded, or returns a JAX step or anything
            else than a :class:`TorchStep`.
    """
    from memfit.estimate import TorchStep
    from memfit.estimate.bridge import make_step

    spec = make_step(step, key_path="factory") if isinstance(step, str) else step
    if not isinstance(spec, TorchStep):
        raise ConfigError(
            f"{step if isinstance(step, str) else 'the step'} is a {type(spec).__name__}; "
            "fitting on the device runs PyTorch steps (memfit.estimate.TorchStep)",
            key_path="factory",
            hint="for JAX, call memfit.fit(run, ...) with your own probe function",
        )
    return spec


def _device_name(device: str) -> str:
    kind = device.strip().lower() if isinstance(device, str) else ""
    if kind in ("cpu", "cuda") or (kind.startswith("cuda:") and kind[5:].isdecimal()):
        return kind
    raise ConfigError(
        f"unknown device {device!r}", key_path="device", hint="use cpu (simulated) or cuda:N"
    )


def _host_copy(obj: Any) -> Any:
    """A deep copy of a state dict with every tensor copied to the host."""
    import torch
    from torch.utils._pytree import tree_map

    def copy(leaf: Any) -> Any:
        if isinstance(leaf, torch.Tensor):
            return leaf.detach().to("cpu", copy=True)
        return leaf

    return tree_map(copy, obj)


@contextlib.contextmanager
def _restored(model: Any, optimizer: Any, off_device: Callable[[], Any]) -> Iterator[None]:
    """Restore the model's and the optimizer's state on exit (host copies taken on entry)."""
    with off_device():
        model_state = _host_copy(model.state_dict()) if hasattr(model, "state_dict") else None
        optim_state = (
            _host_copy(optimizer.state_dict()) if hasattr(optimizer, "state_dict") else None
        )
    try:
        yield
    finally:
        if hasattr(model, "zero_grad"):
            model.zero_grad(set_to_none=True)
        if model_state is not None:
            model.load_state_dict(model_state)
        if optim_state is not None:
            optimizer.load_state_dict(optim_state)


def _build(step: TorchStep, torch_device: Any, budget: int) -> tuple[Any, Any]:
    """``step.build()`` on the device; the model not fitting at all is the user's answer.

    Raises:
        InfeasiblePlan: When building the model and optimizer runs out of memory.
        ConfigError: When ``build()`` fails otherwise.
    """
    import torch

    from memfit.runtime.oom import forget_exception, is_oom

    message: str | None = None
    try:
        with torch.device(torch_device):
            return step.build()
    except Exception as exc:
        if not is_oom(exc):
            raise ConfigError(
                f"the factory's build() failed: {type(exc).__name__}: {exc}",
                key_path="factory",
                hint="build() returns (model, optimizer); rerun with --debug (or read the "
                "chained exception) for the traceback",
            ) from exc
        message = forget_exception(exc)
    raise InfeasiblePlan(
        f"the model and optimizer alone do not fit in {format_bytes(budget)}: "
        f"{message.splitlines()[0] if message else 'out of memory'}",
        smallest_bytes=None,
        budget_bytes=budget,
        binding_term="parameters",
        hint="raise the budget (--budget), use a larger GPU, or a smaller model "
        "(memfit plan tells how much)",
    )


def _search_budget(device: str, budget: int | None) -> tuple[int, Any]:
    """The budget the probes run under, and the torch device they run on.

    Raises:
        ConfigError: When ``device`` is ``"cpu"`` and no budget is given.
        BackendUnavailable: When CUDA is asked for and torch sees none.
    """
    import torch

    if device == "cpu":
        if budget is None:
            raise ConfigError(
                "a fit on the CPU needs a budget: the size of the simulated GPU",
                key_path="budget",
                hint="e.g. budget='2GiB' (memfit fit --device cpu --budget 2GiB)",
            )
        return budget, torch.device("cpu")
    if not torch.cuda.is_available():
        raise BackendUnavailable(
            f"device {device} but torch sees no CUDA device",
            hint="use device cpu with a budget (--device cpu --budget SIZE) to run the probes "
            "on a simulated GPU",
        )
    torch_device = torch.device(device)
    if budget is not None:
        return budget, torch_device
    from memfit.backends.live import TorchCudaReader

    now = TorchCudaReader(torch, torch_device.index or 0).read()
    free = (now.total_bytes or 0) - (now.device_used_bytes or 0)
    return free + (now.reserved_bytes or 0), torch_device


def fit_step(
    step: TorchStep | str,
    *,
    device: str,
    budget: int | str | None = None,
    low: int = 1,
    high: int = DEFAULT_HIGH,
    multiple_of: int = 1,
    constraint: Callable[[int], bool] | None = None,
    margin: float = 0.05,
    steps: int = 2,
    prior: bool = True,
    runtime: Mapping[str, str] | str | None = None,
    progress: Callable[[str], None] | None = None,
) -> FitStepResult:
    """Find the largest batch of a PyTorch step that fits, confirmed on the device.

    Args:
        step: A :class:`memfit.estimate.TorchStep`, or the ``"module:function"`` that
            returns one (imported from the current directory, as ``memfit fit`` does).
        device: ``"cuda"``, ``"cuda:N"``, or ``"cpu"`` (probes under a simulated GPU of
            ``budget``).
        budget: Memory the job may use (bytes or a size text). Default on CUDA: what this
            process can still reach (free plus what its allocator holds); required on
            ``"cpu"``.
        low: The smallest batch to try.
        high: The largest batch to try.
        multiple_of: Batches must be multiples of this.
        constraint: An extra rule a batch must keep (the workload's knob values), or
            ``None``.
        margin: Share of the budget to leave free.
        steps: Real steps each probe runs.
        prior: Trace the step with fake tensors first, for a first guess.
        runtime: The target's software, for the CUDA context in the prior's figures
            (see :func:`memfit.estimate_torch`).
        progress: Called with a short sentence as the trace and each probe start (a status
            line's updater); ``None``: silent.

    Returns:
        The :class:`FitStepResult`; the model's and the optimizer's state are as before.

    Raises:
        ConfigError: When the device, the budget, a bound or ``steps`` is invalid, no value
            in ``low..high`` keeps the rules, or the user's factory, ``build()``,
            ``make_batch()`` or ``step()`` fails (other than by running out of memory).
        BackendUnavailable: When CUDA is asked for and torch sees none.
        InfeasiblePlan: When the model and optimizer alone, or the smallest batch, do not
            fit the budget.
        EstimateError: When the trace for the prior fails (an op without a fake kernel).
    """
    from memfit.core.search import valid_values

    dev = _device_name(device)
    require_count("steps", steps, lo=1)
    budget_bytes = parse_bytes(budget) if budget is not None else None
    if budget_bytes is not None and budget_bytes <= 0:
        raise ConfigError(
            f"the budget must be positive, got {budget!r}", key_path="budget", hint="e.g. 2GiB"
        )
    torch_step = _torch_step(step)
    knob = torch_step.batch_knob
    # Checked before the (slow) trace: bounds that leave nothing to search.
    valid_values(low=low, high=high, multiple_of=multiple_of, constraint=constraint)
    search_budget, torch_device = _search_budget(dev, budget_bytes)
    estimate = None
    if prior:
        if progress is not None:
            progress(f"tracing {knob} with fake tensors for a first guess")
        # Before the simulated GPU starts counting: fake tensors occupy no device memory.
        estimate = trace_prior(
            torch_step,
            low=low,
            high=high,
            budget=search_budget,
            margin=margin,
            device=dev,
            runtime=runtime,
        )
    result = _probe(
        torch_step,
        dev,
        torch_device,
        search_budget,
        low=low,
        high=high,
        multiple_of=multiple_of,
        constraint=constraint,
        margin=margin,
        steps=steps,
        prior=estimate,
        progress=progress,
    )
    return FitStepResult(result=result, knob=knob, prior=estimate, steps_per_probe=steps)


def _probe(
    step: TorchStep,
    dev: str,
    torch_device: Any,
    budget: int,
    *,
    low: int,
    high: int,
    multiple_of: int,
    constraint: Callable[[int], bool] | None,
    margin: float,
    steps: int,
    prior: TorchEstimate | None,
    progress: Callable[[str], None] | None = None,
) -> FitResult:
    """Build on the device and run :func:`memfit.fit`, restoring the state afterwards."""
    import torch

    from memfit.runtime.oom import is_oom
    from memfit.runtime.simulate import SimulatedGpu, simulate_gpu

    knob = step.batch_knob
    with contextlib.ExitStack() as stack:
        sim: SimulatedGpu | None = None
        if dev == "cpu":
            sim = stack.enter_context(simulate_gpu(budget))
        model, optimizer = _build(step, torch_device, budget)

        def off_device() -> contextlib.AbstractContextManager[None]:
            return sim.paused() if sim is not None else contextlib.nullcontext()

        probes = [0]

        def run(value: int) -> None:
            probes[0] += 1
            if progress is not None:
                progress(f"probe {probes[0]}: {knob}={value} on {dev}")
            if hasattr(model, "zero_grad"):
                model.zero_grad(set_to_none=True)
            with torch.device(torch_device):
                for _ in range(steps):
                    try:
                        step.step(model, optimizer, step.make_batch(value))
                    except Exception as exc:
                        if is_oom(exc):
                            raise  # memfit.fit counts it as a probe that does not fit
                        raise ConfigError(
                            f"the step failed at {knob}={value}: {type(exc).__name__}: {exc}",
                            key_path="factory",
                            hint="check that build/make_batch/step run as they are on this "
                            "machine; rerun with --debug (or read the chained exception) "
                            "for the traceback",
                        ) from exc

        with _restored(model, optimizer, off_device):
            return fit(
                run,
                low=low,
                high=high,
                budget=budget,
                margin=margin,
                multiple_of=multiple_of,
                constraint=constraint,
                prior=prior,
                device=dev,
            )
