"""``memfit simulator``: the simulator figures a plan uses on a card, and your own.

Without ``--reading`` it shows what a plan of an Isaac Sim workload takes on ``--gpu``: the
figures fitted on published readings of that card (or, on a card without readings, the
largest of each, as the plan does), and the measurement of that card stored by
:func:`memfit.measure_simulator` when there is one. With two or more ``--reading`` (the
device's used memory, as ``nvidia-smi`` shows it while the simulator runs at each setting)
it fits the figures of this card and stores them for the next plan::

    memfit simulator --gpu "RTX 4090" \\
        --reading num_envs=16,camera=80x80:5.7GB --reading num_envs=256,camera=80x80:6.3GB \\
        --reading num_envs=256,camera=160x160:7.4GB
"""

from __future__ import annotations

import re
from typing import Any

import typer
from rich.table import Table

from memfit.cli._common import JSON_OPTION, err_console, out_console, print_json, safe
from memfit.errors import ConfigError
from memfit.units import format_bytes, parse_bytes

__all__ = ["parse_reading", "register", "simulator"]

_CAMERA = re.compile(r"(?:(\d+)x)?(\d+)x(\d+)")


def parse_reading(text: str) -> tuple[dict[str, Any], int]:
    """``"num_envs=64,camera=2x128x128:7.9GB"`` -> ``({"num_envs": 64, "cameras": [...]},
    bytes)``: the settings and the device's used memory (``camera=[COUNTx]HxW`` is a tiled RGB
    camera per env; ``standard=HxW`` a standard one).

    Raises:
        ConfigError: When the text is not of that form.
    """
    hint = "give --reading num_envs=64:7.9GB (optionally camera=128x128 or standard=480x640)"
    settings_text, sep, used_text = text.rpartition(":")
    if not sep or not settings_text.strip():
        raise ConfigError(f"reading {text!r} has no ':USED'", key_path="--reading", hint=hint)
    used = parse_bytes(used_text.strip())
    settings: dict[str, Any] = {}
    cameras: list[dict[str, Any]] = []
    for part in settings_text.split(","):
        key, eq, value = part.strip().partition("=")
        if not eq:
            raise ConfigError(
                f"reading part {part!r} is not KEY=VALUE", key_path="--reading", hint=hint
            )
        if key in ("camera", "standard"):
            m = _CAMERA.fullmatch(value.strip())
            if m is None:
                raise ConfigError(
                    f"camera {value!r} is not [COUNTx]HEIGHTxWIDTH", key_path="--reading", hint=hint
                )
            count, h, w = int(m.group(1) or 1), int(m.group(2)), int(m.group(3))
            kind = "tiled" if key == "camera" else "standard"
            cameras.append({"kind": kind, "height": h, "width": w, "count": count})
        elif key == "num_envs" and value.strip().isdigit() and int(value) > 0:
            settings["num_envs"] = int(value)
        else:
            raise ConfigError(f"unknown reading setting {part!r}", key_path="--reading", hint=hint)
    if "num_envs" not in settings:
        raise ConfigError(f"reading {text!r} has no num_envs", key_path="--reading", hint=hint)
    if cameras:
        settings["cameras"] = cameras
    return settings, used


def _show(card: str, as_json: bool) -> None:
    from memfit.core.simulator import SceneSpec, SimulatorSpec
    from memfit.runtime.sim_measure import find_measurement

    f = SimulatorSpec(preset="isaac_sim", gpu=card, scene=SceneSpec(joints=0)).figures()
    found = find_measurement("isaac_sim", card)
    data = {
        "gpu": card,
        "published": {
            "base_bytes": f.base_bytes,
            "render_base_bytes": f.render_base_bytes,
            "pixel_bytes": f.pixel_bytes,
            "shared_pixel_bytes": f.shared_pixel_bytes,
            "extra_type_fraction": f.extra_type_fraction,
            "standard_factor": f.standard_factor,
            "viewport_bytes": f.viewport_bytes,
            "notes": list(f.notes),
        },
        "measured": None if found is None else {**found[0].model_dump(), "file": str(found[1])},
    }
    if as_json:
        print_json(data)
        return
    table = Table(title=safe(f"Isaac Sim on {card}"), title_justify="left", show_header=False)
    table.add_column("figure")
    table.add_column("value")
    table.add_row("base (rendering off)", format_bytes(f.base_bytes))
    table.add_row("renderer base", format_bytes(f.render_base_bytes))
    table.add_row("per tiled camera pixel", f"{f.pixel_bytes:.1f} B (+{f.shared_pixel_bytes:.1f} B "
                  "per pixel of the largest product)")  # fmt: skip
    table.add_row("further data type", f"{f.extra_type_fraction:.0%} of a pixel")
    table.add_row("standard camera", f"x{f.standard_factor:g} a tiled camera's pixel")
    table.add_row("GUI viewport", format_bytes(f.viewport_bytes))
    if found is not None:
        m, path = found
        table.add_row("measured base", format_bytes(m.base_bytes))
        table.add_row("measured per env", format_bytes(m.per_env_bytes))
        if m.pixel_bytes is not None:
            table.add_row("measured per pixel", f"{m.pixel_bytes:.1f} B")
        table.add_row("measured", safe(f"{m.version or 'version not given'}, {m.taken}: {path}"))
    out_console.print(table)
    for note in f.notes:
        err_console.print(f"note: {safe(note)}")


def simulator(
    gpu: str = typer.Option(..., "--gpu", help="The card ('RTX 4090', '4060 Ti 16GB')."),
    reading: list[str] | None = typer.Option(
        None,
        "--reading",
        help="A device reading while the simulator ran at one setting: SETTINGS:USED, "
        "SETTINGS being num_envs=N and optionally camera=HxW or COUNTxHxW (tiled) and "
        "standard=HxW joined by commas, USED what nvidia-smi showed (e.g. --reading "
        "num_envs=64:7.9GB, or 'num_envs=64, camera=2x128x128:9.1GB'); two or more fit this "
        "card's figures and store them.",
    ),
    name: str = typer.Option("isaac_sim", "--simulator", help="What ran (the workload's preset)."),
    version: str | None = typer.Option(None, "--sim-version", help="The simulator's version."),
    store: bool = typer.Option(True, "--store/--no-store", help="Store the fit for the next plan."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Show the simulator figures a plan uses on a card; fit and store your own from readings."""
    from memfit.hardware.catalog import gpu as catalog_gpu

    card = catalog_gpu(gpu).name
    if not reading:
        _show(card, as_json)
        return
    from memfit.runtime.sim_measure import (
        SimReading,
        camera_pixels,
        fit_readings,
        modelled_overhead_bytes,
        store_measurement,
    )

    readings = []
    for text in reading:
        settings, used = parse_reading(text)
        envs = int(settings["num_envs"])
        pixels = camera_pixels(settings.get("cameras"), envs)
        readings.append(SimReading(settings, envs, pixels, used, 0))
    measured = fit_readings(
        readings,
        gpu=card,
        context_bytes=modelled_overhead_bytes(card),
        simulator=name,
        version=version,
    )
    path = store_measurement(measured) if store else None
    if as_json:
        print_json({**measured.model_dump(), "file": None if path is None else str(path)})
        return
    out_console.print(
        safe(
            f"{name} on {card}: {format_bytes(measured.base_bytes)} at start, "
            f"{format_bytes(measured.per_env_bytes)} per env"
            + (
                f", {measured.pixel_bytes:.1f} B per camera pixel"
                if measured.pixel_bytes is not None
                else ""
            )
        )
    )
    out_console.print(safe(f"stored: {path}") if path else "not stored (--no-store)")


def register(app: typer.Typer) -> None:
    """Add ``memfit simulator`` to ``app``."""
    app.command("simulator")(simulator)
