"""``memfit gpus [NAME]``: the GPU catalog, or one GPU from it.

Sizes are shown the way ``nvidia-smi`` shows them (MiB) and in GiB. An unknown name exits 1
with ``Error:`` and the three nearest names.
"""

from __future__ import annotations

import re

import typer
from rich.table import Table

from memfit.cli._common import (
    JSON_OPTION,
    err_console,
    out_console,
    print_json,
    safe,
    write_stdout,
)
from memfit.errors import ConfigError
from memfit.hardware.catalog import GpuSpec, gpu, list_gpus, normalize_name, reading_note
from memfit.units import format_bytes, format_mib

__all__ = ["gpus", "register"]


def _cc(spec: GpuSpec) -> str:
    if spec.compute_capability is None:
        return "?"
    return f"{spec.compute_capability[0]}.{spec.compute_capability[1]}"


def gpus(
    name: str | None = typer.Argument(
        None,
        help="A GPU name ('4090', 'RTX 4060 Laptop', 'H100 80GB'), a size with its unit "
        "('12GiB'), or words to filter the list by ('laptop', 'jetson'); all when left out.",
    ),
    as_json: bool = JSON_OPTION,
    target_config: bool = typer.Option(
        False,
        "--target-config",
        help="Print the card's XLA GpuTargetConfigProto (text), what XLA's GPU compiler "
        "compiles for without the card; with --json, its figures and sources too.",
    ),
) -> None:
    """List the known GPUs and the memory their driver reports, or show one."""
    if target_config and name is None:
        raise ConfigError(
            "--target-config needs a GPU name",
            key_path="--target-config",
            hint="memfit gpus 'RTX 4070' --target-config",
        )
    if name is not None:
        try:
            spec = gpu(name)
        except ConfigError:
            matching = [] if target_config else _matching(name)
            if not matching:
                raise
            _print_list(matching, as_json, f"{len(matching)} known GPUs matching {name!r}")
            return
        if target_config:
            from memfit.hardware.xla_target import target_config as make_config

            config = make_config(spec)
            if as_json:
                print_json(config.to_dict())
                return
            write_stdout(config.text())
            err_console.print(f"note: per-card figures from {safe(config.source)}")
            if config.device_memory_source == "estimated":
                err_console.print(
                    "note: device_memory_size is estimated from nvidia-smi's total (no "
                    "published CUDA figure for this card)"
                )
            return
        if as_json:
            print_json(spec.to_dict())
            return
        note = reading_note(name)
        if note is not None:
            err_console.print(f"note: {safe(note)}")
        table = Table(title=safe(spec.name), title_justify="left", show_header=False)
        table.add_column("field")
        table.add_column("value")
        table.add_row("total (nvidia-smi)", f"{format_mib(spec.total_bytes)}")
        table.add_row("total", format_bytes(spec.total_bytes))
        if spec.cuda_total_bytes is not None:
            table.add_row("total seen by CUDA/torch", format_bytes(spec.cuda_total_bytes))
        table.add_row("architecture", spec.arch)
        table.add_row("compute capability", _cc(spec))
        if spec.unified_memory:
            table.add_row("memory", "unified: shared with the CPU")
        if spec.aliases:
            table.add_row("also called", safe(", ".join(spec.aliases)))
        table.add_row("source", safe(spec.source))
        out_console.print(table)
        return
    specs = list_gpus()
    _print_list(specs, as_json, f"{len(specs)} known GPUs")


_SIZE_TEXT = re.compile(r"[+-]?[\d.]+\s*([kmgt]i?b|[kmg]|b)?", re.IGNORECASE)


def _matching(text: str) -> list[GpuSpec]:
    """The catalog's cards whose name or an alias holds every word of ``text`` (``laptop``,
    ``jetson orin``, ``4060 ti``): ``memfit gpus WORDS`` as a filter."""
    words = [w for w in (normalize_name(part) for part in text.split()) if w]
    # a bare number or a size is a card or nothing (the lookup's error says which), not words
    if not any(c.isalpha() for w in words for c in w) or _SIZE_TEXT.fullmatch(text.strip()):
        return []
    out = []
    for spec in list_gpus():
        names = [normalize_name(n) for n in (spec.name, *spec.aliases)]
        if any(all(w in n for w in words) for n in names):
            out.append(spec)
    return out


def _print_list(specs: list[GpuSpec], as_json: bool, title: str) -> None:
    if as_json:
        print_json({"gpus": [s.to_dict() for s in specs]})
        return
    table = Table(title=f"memfit gpus: {safe(title)}", title_justify="left")
    table.add_column("name")
    table.add_column("total (MiB)", justify="right")
    table.add_column("GiB", justify="right")
    table.add_column("arch")
    table.add_column("cc")
    for spec in specs:
        label = spec.name + (" (unified memory)" if spec.unified_memory else "")
        table.add_row(
            safe(label),
            format_mib(spec.total_bytes).removesuffix("MiB"),
            f"{spec.total_bytes / 2**30:.2f}",
            spec.arch,
            _cc(spec),
        )
    out_console.print(table)
    out_console.print("Sources: memfit gpus NAME (or --json) shows where each figure comes from.")


def register(app: typer.Typer) -> None:
    """Add ``memfit gpus`` to ``app``."""
    app.command("gpus")(gpus)
