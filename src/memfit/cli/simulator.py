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

from typing import Any

import typer
from rich.table import Table

from memfit._checks import parse_int
from memfit.cli._common import JSON_OPTION, err_console, out_console, print_json, safe
from memfit.errors import ConfigError
from memfit.units import format_bytes, parse_bytes

__all__ = ["parse_reading", "register", "simulator"]


def parse_reading(text: str) -> tuple[dict[str, Any], int]:
    """``"num_envs=64,camera=2x128x128:7.9GB"`` -> ``({"num_envs": 64, "cameras": [...]},
    bytes)``: the settings and the device's used memory (``camera=[COUNTx]HxW`` is a tiled RGB
    camera per env; ``standard=HxW`` a standard one). Every number is read by
    :func:`memfit._checks.parse_int` (ASCII digits, within what a reading can be) and the
    cameras by :func:`memfit.runtime.sim_measure.check_cameras`.

    Raises:
        ConfigError: When the text is not of that form, or a number cannot be real.
    """
    from memfit.runtime.sim_measure import (
        MAX_CAMERA_SIDE,
        MAX_CAMERAS,
        check_cameras,
        check_num_envs,
    )

    hint = "give --reading num_envs=64:7.9GB (optionally camera=128x128 or standard=480x640)"
    settings_text, sep, used_text = text.rpartition(":")
    if not sep or not settings_text.strip():
        raise ConfigError(f"reading {text!r:.80} has no ':USED'", key_path="--reading", hint=hint)
    used = parse_bytes(used_text.strip())
    settings: dict[str, Any] = {}
    cameras: list[dict[str, Any]] = []
    for part in settings_text.split(","):
        key, eq, value = part.strip().partition("=")
        if not eq:
            raise ConfigError(
                f"reading part {part!r:.80} is not KEY=VALUE", key_path="--reading", hint=hint
            )
        if key in ("camera", "standard"):
            sizes = value.strip().split("x")
            if len(sizes) not in (2, 3) if key == "camera" else len(sizes) != 2:
                shape = "[COUNTx]HEIGHTxWIDTH" if key == "camera" else "HEIGHTxWIDTH"
                raise ConfigError(
                    f"{key} {value!r:.80} is not {shape}", key_path="--reading", hint=hint
                )
            *count, h, w = sizes

            def number(what: str, digits: str, hi: int, kind: str = key) -> int:
                return parse_int(f"--reading {kind} {what}", digits, lo=1, hi=hi, hint=hint)

            cameras.append(
                {
                    "kind": "tiled" if key == "camera" else "standard",
                    "height": number("height", h, MAX_CAMERA_SIDE),
                    "width": number("width", w, MAX_CAMERA_SIDE),
                    "count": number("count", count[0], MAX_CAMERAS) if count else 1,
                }
            )
        elif key == "num_envs":
            if "num_envs" in settings:
                raise ConfigError(
                    f"reading {text!r:.80} gives num_envs twice", key_path="--reading", hint=hint
                )
            envs = parse_int("--reading num_envs", value, hint=hint)
            settings["num_envs"] = check_num_envs("--reading num_envs", envs, hint=hint)
        else:
            raise ConfigError(
                f"unknown reading setting {part!r:.80}", key_path="--reading", hint=hint
            )
    if "num_envs" not in settings:
        raise ConfigError(f"reading {text!r:.80} has no num_envs", key_path="--reading", hint=hint)
    if cameras:
        check_cameras("--reading cameras", cameras)
        settings["cameras"] = cameras
    return settings, used


def _show(card: str, as_json: bool, physics: str | None, renderer: str | None) -> None:
    from memfit.core.simulator import SceneSpec, SimulatorSpec
    from memfit.runtime.sim_measure import find_measurement, measurement_key

    spec = SimulatorSpec(
        preset="isaac_sim",
        gpu=card,
        scene=SceneSpec(joints=12 if physics or renderer else 0),  # Isaac Lab 3: the Go2's
        physics=physics,  # type: ignore[arg-type]  # checked by the caller
        renderer=renderer,  # type: ignore[arg-type]
    )
    f = spec.figures()
    found = find_measurement(measurement_key("isaac_sim", physics, renderer), card)
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
    lab3 = physics is not None or renderer is not None
    if lab3:
        data["physics"], data["renderer"] = f.physics, f.renderer
        published = data["published"]
        assert isinstance(published, dict)
        published["per_env_bytes"] = f.per_env_bytes  # the Go2's (12 joints): scene: scales it
        published["render_per_env_bytes"] = f.render_per_env_bytes
        published["basis"] = {
            term: {"kind": b.kind, "band": list(b.band), "source": b.source, "measure": b.measure}
            for term, b in f.basis.items()
        }
    if as_json:
        print_json(data)
        return
    title = f"Isaac Sim on {card}"
    if lab3:
        title = f"Isaac Lab 3, {f.physics} physics, {f.renderer} renderer, on {card}"
    table = Table(title=safe(title), title_justify="left", show_header=False)
    table.add_column("figure")
    table.add_column("value")
    table.add_row("base (rendering off)", format_bytes(f.base_bytes))
    table.add_row("renderer base", format_bytes(f.render_base_bytes))
    table.add_row("per tiled camera pixel", f"{f.pixel_bytes:.1f} B (+{f.shared_pixel_bytes:.1f} B "
                  "per pixel of the largest product)")  # fmt: skip
    table.add_row("further data type", f"{f.extra_type_fraction:.0%} of a pixel")
    table.add_row("standard camera", f"x{f.standard_factor:g} a tiled camera's pixel")
    table.add_row("GUI viewport", format_bytes(f.viewport_bytes))
    if lab3:
        table.add_row("per env (the Go2)", format_bytes(f.per_env_bytes))
        for term, b in f.basis.items():
            band = f"{b.band[0]:+.0%}..{b.band[1]:+.0%}"
            table.add_row(f"basis: {term}", safe(f"{b.kind} ({band}): {b.source}"))
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
    physics: str | None = typer.Option(
        None, "--physics", help="Isaac Lab 3's physics backend: physx or newton."
    ),
    renderer: str | None = typer.Option(
        None, "--renderer", help="Isaac Lab 3's renderer: rtx, newton_warp, ovrtx or none."
    ),
    store: bool = typer.Option(True, "--store/--no-store", help="Store the fit for the next plan."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Show the simulator figures a plan uses on a card; fit and store your own from readings."""
    from memfit.hardware.catalog import gpu as catalog_gpu
    from memfit.runtime.sim_measure import check_backend

    check_backend(physics, renderer)
    if renderer == "newton_warp" and physics == "physx":
        raise ConfigError(
            "the Newton Warp renderer needs Newton physics",
            key_path="--renderer",
            hint="give --physics newton --renderer newton_warp",
        )
    card = catalog_gpu(gpu).name
    if not reading:
        _show(card, as_json, physics, renderer)
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
        physics=physics,
        renderer=renderer,
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
