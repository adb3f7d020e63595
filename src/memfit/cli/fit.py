"""``memfit fit``: confirm the largest batch that fits, on the device, in a few short probes.

``memfit fit WORKLOAD --device cuda:0`` takes a workload file (or bundled name) that names a
``factory: module:function`` returning a :class:`memfit.estimate.TorchStep`, or the
``module:function`` itself. The work is :func:`memfit.runtime.fit_step.fit_step` (trace for a
prior unless ``--no-prior``, build on the device, probe, restore the model's and the
optimizer's state); this module reads the options, takes the knob's domain from the workload,
and prints. On a machine without a GPU, ``--device cpu --budget 2GiB`` runs the probes under
:func:`memfit.simulate_gpu`. What the user's code prints goes to stderr, so ``--json`` keeps
stdout to one JSON document.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from memfit._plain import plural
from memfit.cli._common import (
    JSON_OPTION,
    RUNTIME_OPTION,
    err_console,
    out_console,
    print_json,
    safe,
    user_code,
)
from memfit.cli._progress import status
from memfit.errors import ConfigError
from memfit.runtime.fit_step import DEFAULT_HIGH
from memfit.units import format_bytes, parse_bytes, parse_fraction

if TYPE_CHECKING:
    from memfit.core.workload import Workload

__all__ = ["fit_command", "register"]


def _needs_budget() -> ConfigError:
    return ConfigError(
        "--device cpu needs --budget (the size of the simulated GPU)",
        key_path="--budget",
        hint="e.g. --budget 2GiB",
    )


def _is_existing_path(ref: str) -> bool:
    """Whether ``ref`` names an existing file (a name the system cannot look up, too long
    say, names none)."""
    try:
        return Path(ref).exists()
    except OSError:
        return False


def _is_factory_spec(ref: str) -> bool:
    """``module:function`` rather than a file or a bundled workload name."""
    if _is_existing_path(ref):
        return False
    module, sep, func = ref.partition(":")
    return bool(sep and module and func and "/" not in module and not module.endswith(".yaml"))


def _load(ref: str) -> tuple[str, Workload | None]:
    """The factory spec and the workload (``None`` when ``ref`` is the factory itself)."""
    if _is_factory_spec(ref):
        return ref, None
    from memfit.core.workload import load_workload

    workload = load_workload(ref)
    if workload.framework != "torch" and not workload.factory:
        raise ConfigError(
            f"memfit fit runs PyTorch steps; workload {workload.name!r} is a "
            f"{workload.framework} workload",
            key_path="factory",
            hint=f"plan it with `memfit plan {ref} --gpu ...`; to confirm a JAX job on the "
            "device, call memfit.fit(run, low=..., high=...) with your own probe function",
        )
    if not workload.factory:
        raise ConfigError(
            f"workload {workload.name!r} names no factory (memfit fit runs a PyTorch step "
            "on the device)",
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
    if kind in ("cpu", "cuda") or (
        kind.startswith("cuda:") and kind[5:].isdecimal() and kind[5:].isascii()
    ):
        return kind
    raise ConfigError(
        f"unknown device {text!r}", key_path="--device", hint="use cpu (simulated) or cuda:N"
    )


def _probe_table(result_data: dict[str, Any], knob: str, budget: int, margin: float) -> Table:
    table = Table(title=f"probes (budget {format_bytes(budget)}, margin {margin:.0%})")
    table.add_column("#", justify="right")
    table.add_column(safe(knob), justify="right")
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
    runtime: str | None = RUNTIME_OPTION,
    json_out: bool = JSON_OPTION,
) -> None:
    """Find the largest batch (knob value) that fits, confirmed on the device in a few probes."""
    from memfit.core.search import valid_values
    from memfit.estimate import TorchStep
    from memfit.estimate.bridge import make_step
    from memfit.runtime.fit_step import fit_step

    dev = _device(device)
    margin_value = parse_fraction(margin, key_path="--margin")
    budget_bytes = _budget(budget)
    if dev == "cpu" and budget_bytes is None:
        raise _needs_budget()
    spec, workload = _load(workload_ref)
    with user_code(spec):
        step = make_step(spec, key_path="factory")
    if not isinstance(step, TorchStep):
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
    # Checked before the (slow) trace: bounds that leave nothing to search.
    valid_values(low=lo, high=hi, multiple_of=multiple_of, constraint=constraint)
    first = f"fitting {knob_name} on {dev}: " + (
        "a first guess from a fake-tensor trace, then probes on the device"
        if not no_prior
        else "probing on the device"
    )
    with status(first, quiet=json_out) as say, user_code(spec):
        found = fit_step(
            step,
            device=dev,
            budget=budget_bytes,
            low=lo,
            high=hi,
            multiple_of=multiple_of,
            constraint=constraint,
            margin=margin_value,
            steps=steps,
            prior=not no_prior,
            runtime=runtime,
            progress=say,
        )
    result = found.result
    data = found.to_dict()
    data.update(
        factory=spec,
        workload=workload.name if workload is not None else None,
        domain=described,
    )
    context_note = _simulated_context_note(dev)
    if context_note is not None:
        data["context_counted"] = False
        data.setdefault("notes", [])
        data["notes"] = [*data["notes"], context_note]
    if json_out:
        print_json(data)
        return
    out_console.print(_probe_table(data, knob_name, result.budget_bytes, result.margin))
    peak = result.peak_bytes
    peak_text = format_bytes(peak) if peak is not None else "unknown"
    out_console.print(
        f"[bold]{safe(knob_name)} = {result.value}[/] on {safe(result.device)}: peak "
        f"{peak_text} of {format_bytes(result.budget_bytes)} (margin {result.margin:.0%}), "
        f"{plural(len(result.probes), 'probe')}, {result.oom_count} out-of-memory caught"
    )
    err_console.print("note: model and optimizer state restored to before the probes")
    if context_note is not None:
        err_console.print(f"note: {context_note}", soft_wrap=True)


def _simulated_context_note(device: str) -> str | None:
    """On the CPU the budget is the simulated GPU's memory for the job's tensors: say that
    no CUDA context is counted in it, and what a real card's context would take."""
    if device != "cpu":
        return None
    from memfit.hardware.runtime import cuda_context

    context = cuda_context(None)
    return (
        "no CUDA context is counted: the budget is the simulated GPU's memory for the job's "
        f"tensors; on a real card its CUDA context (about {format_bytes(context.bytes)} with "
        "lazy module loading, more with eager loading) comes out of the same memory first, so "
        "give --budget the card's memory less it (memfit plan counts it for a named card)"
    )


def _budget(text: str | None) -> int | None:
    """``--budget`` in bytes (``None`` when not given).

    Raises:
        ConfigError: When it is not a size, or not positive.
    """
    if text is None:
        return None
    try:
        value = parse_bytes(text)
    except ConfigError as exc:
        raise ConfigError(exc.message, key_path="--budget", hint=exc.hint) from exc
    if value <= 0:
        raise ConfigError(
            f"the budget must be positive, got {text!r}",
            key_path="--budget",
            hint="e.g. --budget 2GiB",
        )
    return value


def register(app: typer.Typer) -> None:
    """Add ``memfit fit`` to ``app``."""
    app.command("fit")(fit_command)
