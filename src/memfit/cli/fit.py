"""``memfit fit``: confirm the largest batch that fits, on the device, in a few short probes.

``memfit fit WORKLOAD --device cuda:0`` takes a workload file (or bundled name) that names a
``factory: module:function`` returning a :class:`memfit.estimate.TorchStep`, or the
``module:function`` itself. It traces the step with fake tensors for a prior (unless
``--no-prior``), builds the model and optimizer on the device, runs :func:`memfit.fit` with
``--steps`` real steps per probe, and restores the model's and the optimizer's state
afterwards (host copies of their ``state_dict``). On a machine without a GPU,
``--device cpu --budget 2GiB`` runs the probes under :func:`memfit.simulate_gpu`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from memfit.cli._common import JSON_OPTION, err_console, out_console, print_json
from memfit.errors import ConfigError
from memfit.units import format_bytes, parse_bytes, parse_fraction

if TYPE_CHECKING:
    from memfit.core.workload import Workload

__all__ = ["fit_command", "register"]

#: Largest value searched when neither the workload nor ``--high`` bounds the knob.
DEFAULT_HIGH = 65536


def _needs_budget() -> ConfigError:
    return ConfigError(
        "--device cpu needs --budget (the size of the simulated GPU)",
        key_path="--budget",
        hint="e.g. --budget 2GiB",
    )


def _is_factory_spec(ref: str) -> bool:
    """``module:function`` rather than a file or a bundled workload name."""
    if Path(ref).exists():
        return False
    module, sep, func = ref.partition(":")
    return bool(sep and module and func and "/" not in module and not module.endswith(".yaml"))


def _load(ref: str) -> tuple[str, Workload | None]:
    """The factory spec and the workload (``None`` when ``ref`` is the factory itself)."""
    if _is_factory_spec(ref):
        return ref, None
    from memfit.core.workload import load_workload

    workload = load_workload(ref)
    if not workload.factory:
        raise ConfigError(
            f"workload {workload.name!r} names no factory",
            key_path="factory",
            hint="add factory: module:function returning memfit.estimate.TorchStep, "
            "or pass module:function directly",
        )
    return workload.factory, workload


def _domain(
    workload: Workload | None, knob: str, low: int | None, high: int | None
) -> tuple[int, int, Callable[[int], bool] | None, str]:
    """``low``, ``high``, the allowed-values rule and its description for the knob."""
    spec = workload.knobs.get(knob) if workload is not None else None
    if spec is None:
        if workload is not None and knob in workload.settings and low is None and high is None:
            raise ConfigError(
                f"{knob!r} is a fixed setting of workload {workload.name!r}, not a knob",
                key_path="--knob",
                hint="give --low/--high to search it anyway, or make it a knob",
            )
        lo = 1 if low is None else low
        hi = DEFAULT_HIGH if high is None else high
        return lo, hi, None, f"{lo}..{hi}"
    values = frozenset(spec.values())
    lo = min(values) if low is None else low
    hi = max(values) if high is None else high
    return lo, hi, values.__contains__, spec.describe()


def _device(text: str) -> str:
    kind = text.strip().lower()
    if kind in ("cpu", "cuda") or (kind.startswith("cuda:") and kind[5:].isdigit()):
        return kind
    raise ConfigError(
        f"unknown device {text!r}", key_path="--device", hint="use cpu (simulated) or cuda:N"
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


def _build(step: Any, torch_device: Any, budget: int) -> tuple[Any, Any]:
    """``step.build()`` on the device; the model not fitting at all is the user's answer.

    Raises:
        InfeasiblePlan: When building the model and optimizer runs out of memory.
        ConfigError: When ``build()`` fails otherwise.
    """
    import torch

    from memfit.errors import InfeasiblePlan
    from memfit.runtime.oom import forget_exception, is_oom

    message: str | None = None
    try:
        with torch.device(torch_device):
            return step.build()  # type: ignore[no-any-return]
    except Exception as exc:
        if not is_oom(exc):
            raise ConfigError(
                f"the factory's build() failed: {type(exc).__name__}: {exc}",
                key_path="factory",
                hint="build() returns (model, optimizer); rerun with --debug for the traceback",
            ) from exc
        message = forget_exception(exc)
    raise InfeasiblePlan(
        f"the model and optimizer alone do not fit in {format_bytes(budget)}: "
        f"{message.splitlines()[0] if message else 'out of memory'}",
        smallest_bytes=None,
        budget_bytes=budget,
        binding_term="parameters",
        hint="raise --budget, use a larger GPU, or a smaller model (memfit plan tells how much)",
    )


def _probe_table(result_data: dict[str, Any], knob: str, budget: int, margin: float) -> Table:
    table = Table(title=f"probes (budget {format_bytes(budget)}, margin {margin:.0%})")
    table.add_column("#", justify="right")
    table.add_column(knob, justify="right")
    table.add_column("peak", justify="right")
    table.add_column("share", justify="right")
    table.add_column("result")
    for i, probe in enumerate(result_data["probes"], start=1):
        peak = probe["peak_bytes"]
        share = f"{peak / budget:.1%}" if peak is not None else "?"
        if not probe["ok"]:
            outcome = "[red]out of memory[/]"
        elif peak is not None and peak > budget * (1.0 - margin):
            outcome = "[yellow]ran, above the margin[/]"
        else:
            outcome = "[green]fits[/]"
        table.add_row(
            str(i),
            str(probe["value"]),
            format_bytes(peak) if peak is not None else "?",
            share,
            outcome,
        )
    return table


def fit_command(
    workload_ref: str = typer.Argument(
        ...,
        metavar="WORKLOAD",
        help="A workload file or bundled name with factory: module:function, or the "
        "module:function itself (returning memfit.estimate.TorchStep).",
    ),
    device: str = typer.Option(
        ..., "--device", help="cuda, cuda:N, or cpu (probes run under a simulated GPU)."
    ),
    budget: str | None = typer.Option(
        None,
        "--budget",
        help="Memory the job may use (e.g. 2GiB). Default on CUDA: what the process can "
        "still reach; required with --device cpu.",
    ),
    knob: str | None = typer.Option(
        None, "--knob", help="The knob to search (default: the factory's batch knob)."
    ),
    low: int | None = typer.Option(None, "--low", min=1, help="Smallest value to try."),
    high: int | None = typer.Option(None, "--high", min=1, help="Largest value to try."),
    multiple_of: int = typer.Option(1, "--multiple-of", min=1, help="Values must divide by."),
    margin: str = typer.Option("5%", "--margin", help="Share of the budget to leave free."),
    steps: int = typer.Option(2, "--steps", min=1, help="Real steps per probe."),
    no_prior: bool = typer.Option(
        False, "--no-prior", help="Do not trace the step for a first guess."
    ),
    json_out: bool = JSON_OPTION,
) -> None:
    """Find the largest batch (knob value) that fits, confirmed on the device in a few probes."""
    from memfit.estimate import JaxStep, TorchStep
    from memfit.estimate.bridge import make_step

    dev = _device(device)
    margin_value = parse_fraction(margin)
    budget_bytes = parse_bytes(budget) if budget is not None else None
    spec, workload = _load(workload_ref)
    step = make_step(spec, key_path="factory")
    if isinstance(step, JaxStep) or not isinstance(step, TorchStep):
        raise ConfigError(
            f"{spec} returned a {type(step).__name__}; memfit fit runs PyTorch steps",
            key_path="factory",
            hint="for JAX, call memfit.fit(run, ...) with your own probe function",
        )
    if knob is not None and knob != step.batch_knob:
        raise ConfigError(
            f"{spec} varies only its batch knob {step.batch_knob!r} (make_batch(n)); "
            f"it cannot search {knob!r}",
            key_path="--knob",
            hint=f"leave --knob out, or use --knob {step.batch_knob}",
        )
    knob_name = step.batch_knob
    lo, hi, constraint, described = _domain(workload, knob_name, low, high)
    # Checked before the (slow) trace: bounds that leave nothing to search, an empty budget.
    from memfit.core.search import valid_values

    valid_values(low=lo, high=hi, multiple_of=multiple_of, constraint=constraint)
    if budget_bytes is not None and budget_bytes <= 0:
        raise ConfigError(
            f"the budget must be positive, got {budget!r}",
            key_path="--budget",
            hint="e.g. --budget 2GiB",
        )

    import torch

    from memfit.runtime.fit import fit, trace_prior
    from memfit.runtime.oom import is_oom
    from memfit.runtime.simulate import SimulatedGpu, simulate_gpu

    if dev == "cpu":
        if budget_bytes is None:
            raise _needs_budget()
        search_budget = budget_bytes
        torch_device = torch.device("cpu")
    else:
        if not torch.cuda.is_available():
            from memfit.errors import BackendUnavailable

            raise BackendUnavailable(
                f"--device {device} but torch sees no CUDA device",
                hint="use --device cpu --budget SIZE to run the probes on a simulated GPU",
            )
        torch_device = torch.device(dev)
        if budget_bytes is None:
            free, _total = torch.cuda.mem_get_info(torch_device)
            search_budget = int(free) + int(torch.cuda.memory_reserved(torch_device))
        else:
            search_budget = budget_bytes
    prior = None
    if not no_prior:
        # Before the simulated GPU starts counting: fake tensors occupy no device memory.
        err_console.print(f"tracing {spec} with fake tensors for a first guess ...")
        prior = trace_prior(
            step, low=lo, high=hi, budget=search_budget, margin=margin_value, device=dev
        )

    with contextlib.ExitStack() as stack:
        sim: SimulatedGpu | None = None
        if dev == "cpu":
            sim = stack.enter_context(simulate_gpu(search_budget))
        model, optimizer = _build(step, torch_device, search_budget)

        def off_device() -> contextlib.AbstractContextManager[None]:
            return sim.paused() if sim is not None else contextlib.nullcontext()

        def run(value: int) -> None:
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
                            f"{spec}'s step failed at {knob_name}={value}: "
                            f"{type(exc).__name__}: {exc}",
                            key_path="factory",
                            hint="check that build/make_batch/step run as they are on this "
                            "machine; rerun with --debug (or read the chained exception) "
                            "for the traceback",
                        ) from exc

        with _restored(model, optimizer, off_device):
            result = fit(
                run,
                low=lo,
                high=hi,
                budget=search_budget,
                margin=margin_value,
                multiple_of=multiple_of,
                constraint=constraint,
                prior=prior,
                device=dev,
            )
    data = result.to_dict()
    data.update(
        knob=knob_name,
        factory=spec,
        workload=workload.name if workload is not None else None,
        domain=described,
        steps_per_probe=steps,
        prior=(
            {"intercept_bytes": prior.fit.intercept, "slope_bytes": prior.fit.slope}
            if prior is not None and prior.fit is not None
            else None
        ),
        state_restored=True,
    )
    if json_out:
        print_json(data)
        return
    out_console.print(_probe_table(data, knob_name, result.budget_bytes, result.margin))
    peak = result.peak_bytes
    peak_text = format_bytes(peak) if peak is not None else "unknown"
    out_console.print(
        f"[bold]{knob_name} = {result.value}[/] on {result.device}: peak {peak_text} of "
        f"{format_bytes(result.budget_bytes)} (margin {result.margin:.0%}), "
        f"{len(result.probes)} probe(s), {result.oom_count} out-of-memory caught"
    )
    err_console.print("note: model and optimizer state restored to before the probes")


def register(app: typer.Typer) -> None:
    """Add ``memfit fit`` to ``app``."""
    app.command("fit")(fit_command)
