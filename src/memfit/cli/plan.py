"""``memfit plan``, ``memfit check`` and ``memfit examples``.

* ``memfit plan WORKLOAD --gpu NAME|SIZE|local [--set knob=value ...] [--margin 10%] [--json]
  [--write fitted.yaml]``: the breakdown term by term, the chosen knobs, what limits them,
  and the allocator settings the plan assumes.
* ``memfit plan WORKLOAD --all-gpus [--json]``: the tier table over :data:`TIER_GPUS`
  (JSON ``{"plans": [...]}``).
* ``memfit check WORKLOAD [--set ...]``: the rules alone, with the nearest valid settings;
  exit 1 when any rule is broken.
* ``memfit examples [--json]``: the bundled workloads.
"""

from __future__ import annotations

import contextlib
from typing import Any

import typer
import yaml
from rich.table import Table

from memfit._checks import parse_int
from memfit.allocator.xla_fraction import DEFAULT_MARGIN, FRACTION_VARIABLES
from memfit.cli._common import (
    JSON_OPTION,
    RUNTIME_OPTION,
    err_console,
    out_console,
    print_json,
    safe,
    user_code,
)
from memfit.cli._files import (
    FORCE_OPTION,
    STDIN,
    Output,
    read_input_text,
)
from memfit.cli._progress import status
from memfit.core._workload_load import MAX_WORKLOAD_BYTES
from memfit.core.constraints import Violation, check, parse_set
from memfit.core.plan import Plan
from memfit.core.workload import Workload, bundled_names, load_workload, parse_workload
from memfit.errors import ConfigError, InfeasiblePlan, did_you_mean
from memfit.hardware.catalog import GpuSpec
from memfit.units import format_bytes, parse_bytes, parse_fraction

__all__ = ["fitted_workload", "load_workload_arg", "parse_overrides", "register"]

WORKLOAD_ARG: str = typer.Argument(
    ...,
    metavar="WORKLOAD",
    help="A workload file, a bundled name (memfit examples), or - to read it from stdin.",
)
SET_OPTION: list[str] = typer.Option(
    [],
    "--set",
    metavar="NAME=INT",
    help="Pin a knob, or change a number under the workload's settings:, to a whole number "
    "(e.g. --set num_envs=2048); repeatable. Other fields are edited in the workload file.",
)


def load_workload_arg(ref: str) -> Workload:
    """The workload a command names: a file, a bundled name, or ``-`` for standard input.

    Raises:
        ConfigError: When it cannot be read or is not a valid workload.
    """
    if ref == STDIN:
        text, source = read_input_text(
            STDIN, what="the workload", stdin=True, max_bytes=MAX_WORKLOAD_BYTES
        )
        return parse_workload(text, source=source, default_name="stdin")
    return load_workload(ref)


def parse_overrides(workload: Workload, items: list[str]) -> dict[str, int]:
    """``--set NAME=INT`` items for ``workload``: the name first, then the value.

    Raises:
        ConfigError: When a name is neither a knob nor a setting of the workload (a field
            such as ``precision`` is named as such), or a value is not a positive integer.
    """
    known = sorted(set(workload.knobs) | set(workload.settings))
    for item in items:
        name = item.partition("=")[0].strip()
        if name and "=" in item and name not in known:
            takes = f"--set takes the knobs and settings: {', '.join(known) or 'none here'}"
            if name in type(workload).model_fields:
                hint = f"{name} is a field of the workload file: edit it there; {takes}"
            else:
                hint = did_you_mean(name, known, otherwise=takes) or takes
            raise ConfigError(
                f"{name!r} is neither a knob nor a setting of {workload.name}",
                key_path=f"--set {name}",
                hint=hint,
            )
    return parse_set(items)


def _factory_code(workload: Workload) -> contextlib.AbstractContextManager[None]:
    """Around planning: a measured workload runs its factory, the user's code (its prints go
    to stderr; a ``sys.exit`` in it is an error)."""
    return user_code(workload.factory) if workload.factory else contextlib.nullcontext()


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def _knob_text(knobs: dict[str, int | str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in knobs.items()) or "(fixed)"


def _limited_text(binding: str | None) -> str:
    if binding == "knob ranges":
        return "knob range, not memory"
    return binding or "-"


def _context_text(context: dict[str, Any], framework: str = "torch") -> str:
    """What the context term assumed: loading mode and why, versions, architecture (a JAX
    job's line leaves torch out: JAX brings its own CUDA libraries)."""
    rt = context["runtime"]
    names: tuple[tuple[str, str], ...] = (("CUDA", "cuda"), ("driver", "driver"))
    if framework != "jax":
        names = (("torch", "torch"), *names)
    versions = ", ".join(f"{name} {rt[key] or 'unknown'}" for name, key in names)
    arch = context["arch"] or "unknown architecture"
    target = "cuda=...,module_loading=lazy|eager"
    if framework != "jax":
        target = "torch=...," + target
    return (
        f"{format_bytes(context['bytes'])} with {rt['module_loading']} module loading "
        f"({rt['loading_reason']}); {versions}; {arch}. Another target: --runtime {target}"
    )


def _print_plan(workload: Workload, result: Plan) -> None:
    console = out_console
    status = "[bold red]does not fit[/]"
    if result.fits:
        status = (
            "[green]fits[/]"
            if result.high_fits
            else "[yellow]the estimate fits; its high end does not[/]"
        )
    console.print(f"[bold]{safe(workload.name)}[/] on [bold]{safe(result.gpu)}[/]: {status}")
    total = (
        f" ({format_bytes(result.gpu_total_bytes)} total)"
        if result.gpu_total_bytes is not None
        else ""
    )
    if result.pool_bytes is not None:
        setting = next(
            (f"{k}={v}" for k, v in result.environment.items() if k in FRACTION_VARIABLES),
            "the workload's jax.mem_fraction",
        )
        console.print(
            f"  the job needs {format_bytes(result.used_bytes)} with its CUDA context; XLA "
            f"preallocates {format_bytes(result.pool_bytes)} "
            f"({setting}) and the job's buffers fit inside it"
            if result.fits
            else f"  the job needs {format_bytes(result.used_bytes)} with its CUDA context; "
            f"its buffers do not fit XLA's pool of {format_bytes(result.pool_bytes)}",
            soft_wrap=True,
        )
        console.print(
            f"  headroom inside the pool: {format_bytes(result.headroom_bytes)}; on the card: "
            f"{format_bytes(result.predicted_bytes)} of a {format_bytes(result.budget_bytes)} "
            f"budget{total}",
            soft_wrap=True,
        )
    else:
        console.print(
            f"  predicted peak {format_bytes(result.predicted_bytes)} of a "
            f"{format_bytes(result.budget_bytes)} budget{total}; headroom "
            f"{format_bytes(result.headroom_bytes)}",
            soft_wrap=True,
        )
    low, high = result.band
    console.print(
        f"  band: {format_bytes(low)} to {format_bytes(high)} for the job's "
        f"{format_bytes(result.used_bytes)} (how far each basis has been off); "
        f"{result.basis}",
        soft_wrap=True,
    )
    if result.host_bytes:
        console.print(
            f"  in host RAM besides: {format_bytes(result.host_bytes)} (the replay buffer, "
            "as Stable-Baselines3 and CleanRL keep it)",
            soft_wrap=True,
        )
    table = Table(title="Predicted peak, term by term", title_justify="left")
    table.add_column("term")
    table.add_column("size", justify="right")
    table.add_column("MiB", justify="right")
    table.add_column("share", justify="right")
    table.add_column("basis")
    rows = sorted(result.breakdown.items(), key=lambda kv: -kv[1])
    rows.sort(key=lambda kv: kv[0] == "jax_pool_unused")  # the pool's free part last
    for name, nbytes in rows:
        label = "jax_pool_unused (headroom)" if name == "jax_pool_unused" else name
        table.add_row(
            safe(label),
            format_bytes(nbytes),
            f"{nbytes / 2**20:,.1f}",
            _share(nbytes, result.predicted_bytes),
            result.sources.get(name, "assumed"),
        )
    table.add_row(
        "[bold]total[/]",
        f"[bold]{format_bytes(result.predicted_bytes)}[/]",
        f"{result.predicted_bytes / 2**20:,.1f}",
        "100.0%",
        "",
    )
    console.print(table)
    if result.context is not None and result.breakdown.get("cuda_context"):
        context = _context_text(result.context, workload.framework)
        console.print(f"  cuda_context: {safe(context)}", soft_wrap=True)
    knobs = Table(title="Chosen knobs", title_justify="left")
    knobs.add_column("knob")
    knobs.add_column("value", justify="right")
    for name, value in result.knobs.items():
        knobs.add_row(safe(name), str(value))
    console.print(knobs)
    if result.binding is not None:
        console.print(f"Limited by: [bold]{safe(_limited_text(result.binding))}[/]")
    if result.alternatives:
        console.print("Next best:")
        for alt in result.alternatives:
            used = alt.get("used_bytes", alt["predicted_bytes"])
            host = alt.get("host_bytes") or 0
            needs = f"needs {format_bytes(used)}"
            if host:  # state in host RAM: what each needs there is what tells them apart
                needs = f"needs {format_bytes(host)} of host RAM, device {format_bytes(used)}"
            console.print(
                f"  {safe(_knob_text(alt['knobs']))}  ({needs}, objective {alt['objective']:,.0f})",
                soft_wrap=True,
            )
    if result.would_fit:
        console.print("What would fit instead:")
        for option in result.would_fit:
            if not option.get("fits"):
                why = option.get("binding")
                if why == "host_memory" and result.host_budget_bytes is not None:
                    why = f"over the host RAM's {format_bytes(result.host_budget_bytes)} budget"
                elif why:
                    why = f"limited by {why}"
                reason = f" ({why})" if why else ""
                console.print(
                    f"  {safe(option['change'])}: does not fit either{safe(reason)}",
                    soft_wrap=True,
                )
                continue
            host = option.get("host_bytes") or 0
            host_text = f", {format_bytes(host)} of host RAM" if host else ""
            console.print(
                f"  {safe(option['change'])}: {safe(_knob_text(option['knobs']))} "
                f"(device {format_bytes(option['predicted_bytes'])}{host_text})",
                soft_wrap=True,
            )
    for note in result.notes:
        console.print(f"Note: {safe(note)}", soft_wrap=True)
    from memfit.allocator.settings import render_shell

    if result.environment:
        console.print("Allocator settings to run it with:")
        for line in render_shell(result.environment).splitlines():
            console.print(f"  {safe(line)}", soft_wrap=True)


def fitted_workload(
    workload: Workload,
    result: Plan,
    overrides: dict[str, int],
    planned_for: dict[str, Any] | None = None,
) -> str:
    """The workload as YAML with every knob pinned to the plan's value: a file that
    ``memfit plan FILE`` loads again (and plans to the same configuration).

    What the plan relied on is kept with it: the GPU, margin and runtime it was planned for
    (``planned_for``: ``memfit plan FILE`` needs no ``--gpu`` then), the host RAM it checked
    a host buffer against (``host_memory_bytes``), the replay buffer's chosen placement, and,
    as comments, the predicted peak and the allocator settings.
    """
    from memfit.core.evaluate import family_for

    data = workload.model_dump(mode="json", exclude_none=True, exclude={"source"})
    data.pop("variants", None)
    settings = dict(workload.settings)
    settings.update({k: v for k, v in overrides.items() if k in workload.settings})
    data["settings"] = settings
    knobs = data.get("knobs", {})
    for name, value in result.knobs.items():
        if name in knobs and isinstance(value, int):
            spec = {k: v for k, v in knobs[name].items() if k in ("priority", "description")}
            knobs[name] = {"choices": [value], "default": value, **spec}
    family = family_for(workload)
    placed = result.knobs.get(family.placement_knob or "")
    if isinstance(placed, str) and isinstance(data.get("replay"), dict):
        data["replay"]["placement"] = placed
    if result.host_memory_bytes is not None:
        data["host_memory_bytes"] = result.host_memory_bytes
    if planned_for is not None:
        data["planned_for"] = {k: v for k, v in planned_for.items() if v is not None}
    head = [
        f"# memfit plan {workload.name} --write: fitted for {result.gpu}",
        f"# predicted peak {format_bytes(result.predicted_bytes)} of a "
        f"{format_bytes(result.budget_bytes)} budget"
        + (f"; host RAM {format_bytes(result.host_bytes)}" if result.host_bytes else ""),
    ]
    if result.host_memory_bytes is not None:
        head.append(
            f"# host RAM the plan relied on: {format_bytes(result.host_memory_bytes)} "
            "(host_memory_bytes below)"
        )
    for key, value in result.environment.items():
        head.append(f"# run with: export {key}={value}")
    head.append("# every knob is pinned to the planned value; widen a knob's range to plan again")
    return "\n".join(head) + "\n" + yaml.safe_dump(data, sort_keys=False)


def _write_fitted(
    out: Output,
    workload: Workload,
    result: Plan,
    overrides: dict[str, int],
    planned_for: dict[str, Any],
) -> None:
    out.write(fitted_workload(workload, result, overrides, planned_for))


def _short_gpu(name: str) -> str:
    """``"NVIDIA GeForce RTX 4070"`` -> ``"RTX 4070"`` for narrow tables."""
    for prefix in ("NVIDIA GeForce ", "NVIDIA ", "Tesla "):
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def _infeasible_row(spec: GpuSpec, exc: InfeasiblePlan) -> dict[str, Any]:
    return {
        "gpu": spec.name,
        "budget_bytes": exc.budget_bytes,
        "predicted_bytes": exc.smallest_bytes,
        "fits": False,
        "knobs": {},
        "breakdown": {},
        "binding": exc.binding_term,
        "alternatives": [],
        "gpu_total_bytes": spec.total_bytes,
        "pool_bytes": None,
        "host_bytes": 0,
        "used_bytes": exc.smallest_bytes,
        "headroom_bytes": None,
        "environment": {},
        "notes": [],
        "would_fit": [],
        "error": exc.to_dict(),
    }


#: ``--tiers 8,12``: the card each memory tier (GB) stands for (as examples/brax_ppo/run.py
#: reads it); a tier not listed plans for an anonymous card of that many GB.
TIER_CARDS: dict[int, str] = {
    4: "GTX 1650",
    8: "RTX 3060 Ti",
    12: "RTX 4070",
    16: "RTX 4080",
    24: "RTX 4090",
    32: "RTX 5090",
    40: "A100 40GB",
    80: "A100 80GB",
}


def tier_gpus(text: str) -> list[str]:
    """``--tiers 8,12,16``: the card of each memory tier (:data:`TIER_CARDS`), ``NGB`` for
    another tier.

    Raises:
        ConfigError: When an entry is not a whole number of GB from 1 to 4096.

    >>> tier_gpus("8, 12,48")
    ['RTX 3060 Ti', 'RTX 4070', '48GB']
    """
    out: list[str] = []
    for part in text.split(","):
        tier = parse_int(
            "--tiers",
            part.strip(),
            lo=1,
            hi=4096,
            hint="give memory tiers in GB, comma-separated: --tiers 8,12,16,24",
        )
        out.append(TIER_CARDS.get(tier, f"{tier}GB"))
    return out


def _fraction_of(result: Plan) -> str:
    """The XLA memory fraction a JAX plan sets (``"0.90"``), or ``"-"``."""
    for name in FRACTION_VARIABLES:
        if name in result.environment:
            return str(result.environment[name])
    return "-"


def _raise_note(specs: list[GpuSpec], results: list[Any]) -> str | None:
    """Where knob ranges or a rule (not memory) limit the plan: which knob maxima to raise,
    and on which cards."""
    import re

    cards: list[str] = []
    raise_what: list[str] = []
    for spec, r in zip(specs, results, strict=True):
        if isinstance(r, InfeasiblePlan) or r.binding is None:
            continue
        if r.binding != "knob ranges" and not r.binding.startswith("rule: "):
            continue
        found = [m for n in r.notes for m in re.findall(r"knobs\.[\w.]+?\.max", n)]
        if not found:
            continue
        cards.append(_short_gpu(spec.name))
        raise_what.extend(k for k in found if k not in raise_what)
    if not cards:
        return None
    shown = ", ".join(cards[:4]) + (f" and {len(cards) - 4} more" if len(cards) > 4 else "")
    return (
        f"knob ranges or a rule, not memory, limit the plan on {shown}: raise "
        f"{' or '.join(raise_what)} in the workload to plan more there"
    )


def _tiers(
    workload: Workload,
    overrides: dict[str, int],
    margin: float,
    as_json: bool,
    measure: str = "auto",
    runtime: str | None = None,
    gpus: list[str] | None = None,
) -> None:
    from memfit.core.evaluate import family_for
    from memfit.planning import TIER_GPUS, plan_tiers, resolve_gpu

    cards = list(TIER_GPUS) if gpus is None else gpus
    with (
        status(f"planning {workload.name} for {len(cards)} GPUs", quiet=as_json) as say,
        _factory_code(workload),
    ):
        results = plan_tiers(
            workload,
            cards,
            overrides,
            margin,
            measure=measure,
            progress=say,
            runtime=runtime,
        )
    specs = [resolve_gpu(g) for g in cards]
    if as_json:
        rows = [
            _infeasible_row(spec, r) if isinstance(r, InfeasiblePlan) else r.to_dict()
            for spec, r in zip(specs, results, strict=True)
        ]
        print_json({"workload": workload.name, "plans": rows})
        _fail_if_none_fit(workload, results)
        return
    knob_names = list(workload.knobs)
    family = family_for(workload)
    if family.placement_knob is not None and family.placement_of(workload) == "auto":
        knob_names.append(family.placement_knob)
    pooled = any(not isinstance(r, InfeasiblePlan) and r.pool_bytes is not None for r in results)
    table = Table(
        title=f"{safe(workload.name)}: tier table, by memory",
        title_justify="left",
        caption="knobs: "
        + "/".join(knob_names)
        + (
            "; needs: the job's own memory with its CUDA context; headroom: inside XLA's pool"
            if pooled
            else "; needs: the predicted peak"
        ),
        caption_justify="left",
    )
    table.add_column("GPU", min_width=14, overflow="fold")
    table.add_column("total", justify="right", no_wrap=True)
    table.add_column("knobs", justify="right", no_wrap=True)
    table.add_column("needs", justify="right", no_wrap=True)
    table.add_column("headroom", justify="right", no_wrap=True)
    if pooled:
        table.add_column("XLA frac", justify="right", no_wrap=True)
    table.add_column("limited by", overflow="fold")
    merged: list[tuple[list[str], tuple[str, ...]]] = []
    for spec, r in zip(specs, results, strict=True):
        total = format_bytes(spec.total_bytes, precision=1)
        if isinstance(r, InfeasiblePlan):
            smallest = format_bytes(r.smallest_bytes) if r.smallest_bytes is not None else "-"
            cells: tuple[str, ...] = (
                total,
                "-",
                f"[red]{smallest}[/]",
                "[red]does not fit[/]",
                *(("-",) if pooled else ()),
                safe(r.binding_term or "-"),
            )
        else:
            cells = (
                total,
                "/".join(str(r.knobs.get(k, "-")) for k in knob_names),
                format_bytes(r.used_bytes, precision=1),
                format_bytes(r.headroom_bytes, precision=1),
                *((_fraction_of(r),) if pooled else ()),
                safe(_limited_text(r.binding)),
            )
        if merged and merged[-1][1] == cells:  # same memory, same plan: one row
            merged[-1][0].append(_short_gpu(spec.name))
        else:
            merged.append(([_short_gpu(spec.name)], cells))
    for names, cells in merged:
        table.add_row(safe(" / ".join(names)), *cells)
    out_console.print(table)
    fitted = [r for r in results if not isinstance(r, InfeasiblePlan)]
    common = [n for n in fitted[0].notes if all(n in r.notes for r in fitted)] if fitted else []
    for note in common:
        out_console.print(f"Note: {safe(note)}", soft_wrap=True)
    raise_note = _raise_note(specs, results)
    if raise_note is not None:
        out_console.print(f"Note: {safe(raise_note)}", soft_wrap=True)
    _fail_if_none_fit(workload, results)


def _fail_if_none_fit(workload: Workload, results: list[Any]) -> None:
    """Exit 1 (after the table or JSON is out) when the workload fits on none of the GPUs."""
    if not all(isinstance(r, InfeasiblePlan) for r in results):
        return
    smallest = min(
        (r.smallest_bytes for r in results if r.smallest_bytes is not None), default=None
    )
    need = f" (its smallest configuration needs {format_bytes(smallest)})" if smallest else ""
    err_console.print(
        f"[bold red]Error:[/] {safe(workload.name)} fits on none of the "
        f"{len(results)} GPUs of the tier table{safe(need)}"
    )
    err_console.print(
        "[bold]Hint:[/] widen the knob ranges (smaller minimums), lower the precision, or "
        "plan for a bigger card with --gpu SIZE"
    )
    raise typer.Exit(1)


def _host_bytes(text: str | None) -> int | None:
    """``--host-memory``: a size, or ``available`` (this machine's RAM free now)."""
    if text is None:
        return None
    if text.strip().lower() == "available":
        from memfit.planning import host_memory

        here = host_memory()
        if here is None:
            raise ConfigError(
                "this operating system does not say how much RAM is free",
                key_path="--host-memory",
                hint="give a size: --host-memory 16GiB",
            )
        return here[1]
    try:
        return parse_bytes(text)
    except ConfigError as exc:
        raise ConfigError(
            exc.message, key_path="--host-memory", hint=f"{exc.hint}; or write available"
        ) from exc


def _plan_command(
    workload: str = WORKLOAD_ARG,
    gpu: str | None = typer.Option(
        None,
        "--gpu",
        help="GPU name (RTX 4070), size (12GiB), local or cpu; a count and a name (8xH100); "
        "several, comma-separated (8GiB,12GiB), for a table.",
    ),
    all_gpus: bool = typer.Option(False, "--all-gpus", help="Plan for the tier table of GPUs."),
    tiers: str | None = typer.Option(
        None,
        "--tiers",
        metavar="GB,GB",
        help="Plan for one card per memory tier, e.g. 8,12,16,24 (RTX 3060 Ti, RTX 4070, "
        "RTX 4080, RTX 4090); a table.",
    ),
    set_: list[str] = SET_OPTION,
    margin: str | None = typer.Option(
        None,
        "--margin",
        help=f"Safety margin, a share of the GPU's total memory (e.g. 10%); default "
        f"{DEFAULT_MARGIN:.0%}.",
    ),
    host_memory: str | None = typer.Option(
        None,
        "--host-memory",
        "--host-ram",
        help="The RAM of the machine that trains (64GiB), or available: what is free now. "
        "Default: this machine's total RAM (the same plan on every run). The process's own "
        "baseline and a reserve for the OS are taken off it, each named.",
    ),
    write: str | None = typer.Option(
        None,
        "--write",
        metavar="FILE",
        help="Write the fitted configuration to this YAML file (a new file, or --force).",
    ),
    force: bool = FORCE_OPTION,
    measure: str = typer.Option(
        "auto",
        "--measure",
        help="For a workload that names its env (brax:...): auto (cache, else the workload's "
        "recorded measurements, else measure now), fresh (measure now) or recorded.",
    ),
    runtime: str | None = RUNTIME_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Fit a workload to a GPU: the biggest knob values that fit and keep every rule.

    A file written with --write records what it was planned for (planned_for): without
    --gpu, it is planned for that again.
    """
    if (gpu is not None) + all_gpus + (tiers is not None) > 1:
        raise typer.BadParameter(
            "give exactly one of --gpu NAME|SIZE|local, --tiers and --all-gpus"
        )
    table_gpus = tier_gpus(tiers) if tiers is not None else None
    if gpu is not None and "," in gpu:
        table_gpus = [g.strip() for g in gpu.split(",")]
        if not all(table_gpus):
            raise ConfigError(
                f"an empty GPU name in {gpu!r}",
                key_path="--gpu",
                hint="separate GPU names or sizes with commas: --gpu 8GiB,12GiB",
            )
        gpu = None
    if table_gpus is not None:
        all_gpus = True
    if all_gpus and write is not None:
        raise typer.BadParameter("--write needs one --gpu, not a table of GPUs")
    loaded = load_workload_arg(workload)
    recorded = loaded.planned_for if gpu is None and not all_gpus else None
    if gpu is None and not all_gpus:
        if recorded is None:
            raise typer.BadParameter(
                "give exactly one of --gpu NAME|SIZE|local and --all-gpus (a file written "
                "with --write plans for the GPU it records without either)"
            )
        gpu = recorded.gpu
        if margin is None and recorded.margin is not None:
            margin = f"{recorded.margin:.4g}"
        runtime = runtime if runtime is not None else recorded.runtime
        if not as_json:
            err_console.print(
                f"note: planning for {safe(gpu)}, as {safe(loaded.source or loaded.name)} records "
                "(planned_for); --gpu plans for another"
            )
    out = (
        Output.named(
            write,
            what="the fitted configuration",
            option="--write",
            force=force,
            inputs=[loaded.source],
        )
        if write is not None
        else None
    )
    if out is not None:  # before the search: a plan is no reason to lose a file
        out.check()
    overrides = parse_overrides(loaded, set_)
    fraction = parse_fraction(
        margin if margin is not None else f"{DEFAULT_MARGIN:.0%}", key_path="--margin"
    )
    host = _host_bytes(host_memory)
    if all_gpus:
        _tiers(loaded, overrides, fraction, as_json, measure, runtime, table_gpus)
        return
    from memfit.planning import plan

    assert gpu is not None  # checked above
    from memfit.core.multi_gpu import parse_gpu_count

    if parse_gpu_count(gpu) is not None or loaded.devices.count > 1:
        if write is not None:
            raise typer.BadParameter("--write plans one GPU; drop it for several (8xH100)")
        _plan_devices(loaded, gpu, overrides, fraction, measure, runtime, as_json)
        return
    from memfit.hardware.catalog import reading_note

    reading = reading_note(gpu)
    if reading is not None and not as_json:
        err_console.print(f"note: {safe(reading)}")
    with (
        status(f"planning {loaded.name} for {gpu}", quiet=as_json) as say,
        _factory_code(loaded),
    ):
        result = plan(
            loaded,
            gpu,
            overrides,
            fraction,
            host_memory_bytes=host,
            measure=measure,
            runtime=runtime,
            progress=say,
        )
    if out is not None and result.fits:
        target = result.gpu if gpu.strip().lower() == "local" else gpu
        planned_for = {
            "gpu": target,
            "margin": None if margin is None else fraction,
            "runtime": runtime,
        }
        _write_fitted(out, loaded, result, overrides, planned_for)
    if as_json:
        print_json(result.to_dict())
    else:
        _print_plan(loaded, result)
        if write is not None and result.fits:
            err_console.print(f"Wrote {safe(str(write))}")
    if not result.fits:
        unwritten = f"; {write} was not written" if write is not None else ""
        err_console.print(
            f"[bold red]Error:[/] {safe(loaded.name)} with these knobs does not fit "
            f"{safe(result.gpu)} (limited by {safe(str(result.binding))}){safe(unwritten)}"
        )
        if result.binding in ("cuda_context", "jax_preallocation", "host_memory"):
            hint = "use a GPU (or host) with more memory" + _margin_hint(result)
        else:
            hint = "drop some --set pins and let memfit choose"
        err_console.print(f"[bold]Hint:[/] {hint}")
        raise typer.Exit(1)


def _plan_devices(
    loaded: Workload,
    gpu: str,
    overrides: dict[str, int],
    fraction: float,
    measure: str,
    runtime: str | None,
    as_json: bool,
) -> None:
    """Several GPUs: a plan per device, the collective terms named with their basis."""
    from memfit.planning_devices import plan_devices

    with (
        status(f"planning {loaded.name} for {gpu}", quiet=as_json) as say,
        _factory_code(loaded),
    ):
        result = plan_devices(
            loaded, gpu, overrides, fraction, measure=measure, runtime=runtime, progress=say
        )
    if as_json:
        print_json(result.to_dict())
    else:
        _print_devices(loaded, result)
    if not result.fits:
        err_console.print(
            f"[bold red]Error:[/] {safe(loaded.name)} does not fit {result.count} x "
            f"{safe(result.gpu)} (limited by {safe(str(result.base.binding))})"
        )
        err_console.print("[bold]Hint:[/] set the NCCL variables the notes name, or use more GPUs")
        raise typer.Exit(1)


def _print_devices(workload: Workload, result: Any) -> None:
    console = out_console
    status_text = "[green]fits[/]" if result.fits else "[bold red]does not fit[/]"
    console.print(
        f"[bold]{safe(workload.name)}[/] on [bold]{result.count} x {safe(result.gpu)}[/] "
        f"({result.topology}, {result.strategy}): {status_text}"
    )
    scope = "global, split over the devices" if result.strategy == "pmap" else "per process"
    console.print(f"  knobs ({scope}): {safe(_knob_text(result.base.knobs))}", soft_wrap=True)
    # each term of the one-device plan by its own basis, the collective terms by theirs
    basis = {**result.base.sources, **{t.name: t.basis for t in result.terms}}
    for dev in result.devices:
        which = (
            f"device {dev.devices[0]}"
            if len(dev.devices) == 1
            else f"devices {dev.devices[0]}-{dev.devices[-1]}"
        )
        console.print(
            f"  {which}: predicted peak {format_bytes(dev.predicted_bytes)} of a "
            f"{format_bytes(dev.budget_bytes)} budget",
            soft_wrap=True,
        )
    table = Table(title="Per device, term by term", title_justify="left")
    table.add_column("term")
    table.add_column("basis")
    for dev in result.devices:
        table.add_column(
            "device 0"
            if dev.devices == [0]
            else f"devices {dev.devices[0]}-{dev.devices[-1]}"
            if len(dev.devices) > 1
            else f"device {dev.devices[0]}",
            justify="right",
        )
    names = list(result.devices[0].breakdown)
    for dev in result.devices[1:]:
        names.extend(n for n in dev.breakdown if n not in names)
    for name in names:
        table.add_row(
            safe(name),
            basis.get(name, "per-device plan"),
            *[
                format_bytes(d.breakdown[name]) if name in d.breakdown else "-"
                for d in result.devices
            ],
        )
    table.add_row(
        "[bold]total[/]",
        "",
        *[f"[bold]{format_bytes(d.predicted_bytes)}[/]" for d in result.devices],
    )
    console.print(table)
    for term in result.terms:
        console.print(f"  {safe(term.name)} ({term.basis}): {safe(term.detail)}", soft_wrap=True)
    for key, value in result.environment.items():
        console.print(f"  run with {safe(key)}={safe(value)}", soft_wrap=True)
    for note in result.notes:
        console.print(f"  note: {safe(note)}", soft_wrap=True)


def _margin_hint(result: Plan) -> str:
    """``", or lower --margin"`` where the margin is as large as the gap (the device's, or
    the host RAM's when that limits), else nothing."""
    if result.binding == "host_memory" and result.host_budget_bytes is not None:
        over = (result.host_bytes or 0) - result.host_budget_bytes
        margin = (result.host_memory_bytes or 0) - result.host_budget_bytes
    else:
        over = result.predicted_bytes - result.budget_bytes
        margin = (result.gpu_total_bytes or result.budget_bytes) - result.budget_bytes
    return ", or lower --margin" if 0 < over <= margin else ""


_FRAMEWORKS = {"brax_ppo": "Brax PPO", "rl_games": "rl_games", "cleanrl": "CleanRL"}


def _whose(v: Violation) -> str:
    """Whose rule a violation breaks, for a person."""
    if v.source == "workload":
        return "the workload's own rule"
    return f"{_FRAMEWORKS.get(v.source, v.source)}'s rule"


def _print_violations(name: str, violations: list[Violation]) -> None:
    ranges = [v for v in violations if v.kind == "range"]
    broken = [v for v in violations if v.kind != "range"]
    if not broken:
        out_console.print(f"[green]{safe(name)}: every rule holds[/]")
    else:
        table = Table(title=f"{safe(name)}: broken rules (violations)", title_justify="left")
        table.add_column("rule")
        table.add_column("whose")
        table.add_column("values")
        table.add_column("nearest valid settings")
        for v in broken:
            values = ", ".join(f"{k}={x}" for k, x in v.knobs.items())
            fixes = " or ".join(", ".join(f"{k}={x}" for k, x in s.items()) for s in v.suggestions)
            table.add_row(safe(v.rule), safe(_whose(v)), safe(values), safe(fixes or "-"))
        out_console.print(table)
    for v in ranges:
        knob = next(iter(v.knobs))
        near = " or ".join(f"{knob}={s[knob]}" for s in v.suggestions)
        out_console.print(
            f"Note: {safe(v.message)}: outside this workload's declared range, not a "
            f"framework rule; memfit plan searches only that range (nearest inside: "
            f"{safe(near or '-')}; or widen knobs.{safe(knob)} in the workload)",
            soft_wrap=True,
        )


def _check_command(
    workload: str = WORKLOAD_ARG,
    set_: list[str] = SET_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Check knob values against the workload's rules; exit 1 when one is broken.

    A value outside the range the workload declares for its knob is a note (the workload's
    search space, not a framework rule); a broken rule is a violation.
    """
    loaded = load_workload_arg(workload)
    found = check(loaded, parse_overrides(loaded, set_))
    violations = [v for v in found if v.kind != "range"]
    notes = [v for v in found if v.kind == "range"]
    if as_json:
        print_json(
            {
                "workload": loaded.name,
                "ok": not violations,
                "violations": [v.to_dict() for v in violations],
                "range_notes": [v.to_dict() for v in notes],
            }
        )
    else:
        _print_violations(loaded.name, found)
    if violations:
        first = violations[0]
        err_console.print(f"[bold red]Error:[/] {safe(first.message)} ({safe(_whose(first))})")
        if first.suggestions:
            fix = ", ".join(f"--set {k}={v}" for k, v in first.suggestions[0].items())
            err_console.print(f"[bold]Hint:[/] try {safe(fix)}")
        else:
            err_console.print("[bold]Hint:[/] change the knob values so the rule holds")
        raise typer.Exit(1)


#: The widest ``memfit examples``'s table is laid out when stdout is not a terminal.
EXAMPLES_TABLE_WIDTH = 160


def _examples_command(as_json: bool = JSON_OPTION) -> None:
    """List the workloads bundled with memfit."""
    rows: list[dict[str, Any]] = []
    for name in bundled_names():
        w = load_workload(name)
        rows.append(
            {
                "name": name,
                "family": w.family,
                "framework": w.framework,
                "knobs": sorted(w.knobs),
                "description": w.description,
            }
        )
    if as_json:
        print_json({"examples": rows})
        return
    table = Table(
        title="Bundled workloads (memfit plan NAME --gpu ...)",
        title_justify="left",
        width=None if out_console.is_terminal else EXAMPLES_TABLE_WIDTH,
    )
    longest = max((len(row["name"]) for row in rows), default=4)
    table.add_column("name", no_wrap=True, min_width=longest)
    table.add_column("family", no_wrap=True)
    table.add_column("knobs", max_width=30)
    table.add_column("description", overflow="fold", ratio=1)
    for row in rows:
        table.add_row(
            safe(row["name"]),
            f"{row['family']} ({row['framework']})",
            safe(", ".join(row["knobs"])),
            safe(" ".join((row["description"] or "-").split())),
        )
    out_console.print(table)


def register(app: typer.Typer) -> None:
    """Add ``plan``, ``check`` and ``examples`` to the ``memfit`` app."""
    app.command("plan")(_plan_command)
    app.command("check")(_check_command)
    app.command("examples")(_examples_command)
