"""``memfit env``: recommended allocator settings for PyTorch and JAX, and a check of yours.

Prints the settings for a use (``--for training|inference|shared-gpu``) with a reason each,
as lines to paste into a shell (``--shell bash|fish|powershell``), then validates what the
environment already holds (``PYTORCH_ALLOC_CONF`` / ``PYTORCH_CUDA_ALLOC_CONF`` and
``XLA_PYTHON_CLIENT_*``): unknown options, bad values, conflicts, both torch names set
differently. ``--check FILE`` validates a shell snippet instead (catching a variable
exported twice; ``-`` reads it from stdin). An error-level problem (the framework refuses the
setting, or it is silently lost) makes the exit status 1, after everything is printed; with
``--strict`` a warning does too.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import typer
from rich.table import Table

from memfit._plain import plural
from memfit.allocator.settings import PROFILES, SHELLS, recommend, render_shell
from memfit.allocator.settings_check import (
    JAX_VARIABLES,
    TORCH_VARIABLES,
    check_jax_fraction,
    check_shell,
)
from memfit.cli._common import (
    JSON_OPTION,
    err_console,
    out_console,
    print_json,
    safe,
    write_stdout,
)
from memfit.cli._files import read_input_text
from memfit.errors import ConfigError
from memfit.hardware.catalog import GpuSpec
from memfit.runtime.allocator_env import (
    check_environment,
    check_jax_install,
    installed_torch_version,
    jax_fraction_name,
)
from memfit.units import format_bytes

#: The largest shell file ``env --check`` reads (a few lines of exports is the norm).
MAX_SETTINGS_BYTES = 1 * 2**20

#: The widest ``memfit env``'s table is laid out when stdout is not a terminal.
ENV_TABLE_WIDTH = 120

__all__ = ["env", "register"]


def env(
    profile: str = typer.Option(
        "training", "--for", metavar="USE", help="training, inference or shared-gpu."
    ),
    shell: str = typer.Option("bash", "--shell", help="bash, fish or powershell."),
    check: str | None = typer.Option(
        None,
        "--check",
        metavar="FILE",
        help="Validate the exports in a shell file (- for stdin) instead of the environment.",
    ),
    strict: bool = typer.Option(
        False, "--strict", help="Exit 1 on warnings too (errors always exit 1)."
    ),
    gpu: str | None = typer.Option(
        None,
        "--gpu",
        help="The card (name or size) to size XLA's pool for (the same rule memfit plan "
        "uses); by default this machine's GPU (NVML), else a fraction that leaves room on "
        "every card memfit knows.",
    ),
    as_json: bool = JSON_OPTION,
    xla_target_config: bool = typer.Option(
        False,
        "--xla-target-config",
        help="Print this machine's GPU as XLA's compiler sees it (its GpuTargetConfigProto), "
        "to compare with `memfit gpus NAME --target-config`; needs JAX with a GPU.",
    ),
) -> None:
    """Recommend PyTorch/JAX allocator settings and validate the ones already set."""
    if xla_target_config:
        from memfit.estimate.xla.gpu import local_target_config

        text = local_target_config()
        if as_json:
            print_json({"target_config": text})
        else:
            write_stdout(text if text.endswith("\n") else text + "\n")
        return
    if profile not in PROFILES:
        raise ConfigError(
            f"unknown use {profile!r}", key_path="--for", hint="use " + ", ".join(PROFILES)
        )
    if shell not in SHELLS:
        raise ConfigError(
            f"unknown shell {shell!r}", key_path="--shell", hint="use " + ", ".join(SHELLS)
        )
    from memfit.core.multi_gpu import parse_gpu_count
    from memfit.hardware.catalog import gpu as catalog_gpu

    counted = parse_gpu_count(gpu) if gpu is not None else None
    if counted is not None:
        gpu = counted[1]
    spec = catalog_gpu(gpu) if gpu is not None else _this_card()
    nccl_advice = _nccl_advice(spec, counted[0]) if counted is not None and spec else None
    fraction_name, fraction_why = jax_fraction_name()
    rec = recommend(
        profile,
        torch_version=installed_torch_version(),
        gpu=spec,
        jax_fraction_variable=fraction_name,
    )
    card_note = (
        [f"XLA's pool is sized for this machine's {spec.name} (NVML); --gpu NAME for another"]
        if gpu is None and spec is not None
        else []
    )
    rec = replace(rec, notes=(*rec.notes, *card_note, f"{fraction_name}: {fraction_why}"))
    script = render_shell(rec.settings, shell)
    if check is not None:
        text, source = read_input_text(
            check, what="the shell file (--check)", stdin=True, max_bytes=MAX_SETTINGS_BYTES
        )
        try:
            problems = check_shell(text, gpu=spec)
        except ConfigError as exc:
            # check_shell names the line; say which file it is in
            raise ConfigError(exc.message, key_path=source, hint=exc.hint) from exc
        checked = f"file {source}"
    else:
        problems = check_environment() + check_jax_fraction(os.environ, spec) + check_jax_install()
        checked = "environment"
    current = {
        name: os.environ[name] for name in (*TORCH_VARIABLES, *JAX_VARIABLES) if name in os.environ
    }
    failing = [p for p in problems if p.severity == "error" or strict]
    if as_json:
        print_json(
            {
                **rec.to_dict(),
                "shell": shell,
                "script": script,
                "checked": checked,
                "current": current,
                "problems": [p.to_dict() for p in problems],
                **({"nccl": nccl_advice} if nccl_advice is not None else {}),
            }
        )
    else:
        # the reasons are sentences: fold them (at most 120 columns when piped, as a
        # terminal of that width shows them) instead of one line of hundreds of columns
        width = None if out_console.is_terminal else ENV_TABLE_WIDTH
        table = Table(title=f"memfit env --for {profile}", title_justify="left", width=width)
        table.add_column("variable / option", no_wrap=True)
        table.add_column("value", overflow="fold")
        table.add_column("why", overflow="fold", ratio=1)
        for key, value, reason in rec.options:
            table.add_row(f"torch {safe(key)}", safe(value), safe(reason))
        for setting in rec.settings:
            if setting.framework == "jax":
                table.add_row(safe(setting.variable), safe(setting.value), safe(setting.reason))
        out_console.print(table)
        out_console.print(f"# paste into {shell}:")
        out_console.print(safe(script, newlines=True), soft_wrap=True)
        if nccl_advice is not None:
            _print_nccl_advice(nccl_advice)
        for note in rec.notes:
            err_console.print(f"note: {safe(note)}")
        if problems:
            out_console.print(f"problems in the {safe(checked)}:")
            for p in problems:
                where = p.variable + (f" {p.option}" if p.option else "")
                line = f"  {p.severity} [{p.code}] {where}: {p.message}"
                if p.hint:
                    line += f" (fix: {p.hint})"
                out_console.print(safe(line), soft_wrap=True)
        elif current or check is not None:
            out_console.print(f"no problems in the {safe(checked)}")
    if failing:
        first = failing[0]
        level = plural(len(failing), "problem" if strict else "error-level problem")
        err_console.print(
            f"[bold red]Error:[/] {level} in the {safe(checked)}; first: {safe(first.message)}"
        )
        err_console.print(f"[bold]Hint:[/] {safe(first.hint or 'see the problems listed above')}")
        raise typer.Exit(1)


def _nccl_advice(spec: GpuSpec, count: int) -> dict[str, Any]:
    """NCCL's memory per rank on ``count`` of these cards, and what each setting that
    shrinks it saves (for a tight card)."""
    from memfit.core.multi_gpu import default_topology
    from memfit.hardware.nccl import ENV_EFFECTS, nccl_memory, recommend_tight

    topology = default_topology(spec, count)
    geforce = "geforce" in spec.name.lower() and topology == "pcie"
    kwargs: dict[str, Any] = {
        "capability": spec.compute_capability,
        "p2p": False if geforce else None,
    }
    base = nccl_memory(count, topology, **kwargs)
    settings = []
    for key, value in sorted(recommend_tight(base).items()):
        alone = nccl_memory(count, topology, env={key: value}, **kwargs)
        settings.append(
            {
                "variable": key,
                "value": value,
                "saves_bytes": base.total_bytes - alone.total_bytes,
                "why": ENV_EFFECTS[key],
            }
        )
    return {"count": count, "gpu": spec.name, "estimate": base.to_dict(), "settings": settings}


def _print_nccl_advice(advice: dict[str, Any]) -> None:
    est = advice["estimate"]
    out_console.print(
        f"# NCCL {est['nccl']} on {advice['count']} x {safe(advice['gpu'])} ({est['topology']}, "
        f"{est['transport']}): about {format_bytes(est['total_bytes'])} per GPU and "
        "communicator (torch's process group: one; JAX: one per device group, two before "
        "jaxlib 0.4.30); on a tight card:",
        soft_wrap=True,
    )
    if not advice["settings"]:
        out_console.print("# (nothing to trim: NCCL keeps no buffers on these GPUs)")
    for item in advice["settings"]:
        out_console.print(
            f"export {item['variable']}={item['value']}  # saves "
            f"{format_bytes(item['saves_bytes'])}: {safe(item['why'])}",
            soft_wrap=True,
        )


def _this_card() -> GpuSpec | None:
    """This machine's first GPU as NVML reports it, for the card XLA's pool is sized for;
    ``None`` without NVML or a GPU (torch is not imported: it costs seconds)."""
    from memfit.backends import local_probe
    from memfit.errors import MemfitError
    from memfit.hardware.catalog import anonymous_gpu
    from memfit.hardware.catalog import gpu as catalog_gpu

    try:
        probe, _reasons = local_probe(try_torch=False)
        if probe is None:
            return None
        devices = probe.snapshot().devices
    except MemfitError:
        return None
    if not devices or not devices[0].total_bytes:
        return None
    first = devices[0]
    total = first.total_bytes or 0
    try:
        known = catalog_gpu(first.name)
    except ConfigError:
        known = None
    if known is not None and known.total_bytes == total:
        return known
    base = anonymous_gpu(total)
    return replace(base, name=first.name, arch=known.arch if known is not None else base.arch)


def register(app: typer.Typer) -> None:
    """Add ``memfit env`` to ``app``."""
    app.command("env")(env)
