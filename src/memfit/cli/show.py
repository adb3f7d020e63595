"""``memfit show NAME``: a bundled workload's YAML, variants included, to copy and edit.

``memfit show dqn_fire_raster > my_dqn.yaml`` gives a file that ``memfit plan my_dqn.yaml``
loads as it is; ``NAME@variant`` shows the same file and says which variant it names.
The file goes to stdout exactly as it ships (comments and all); notes go to stderr.
"""

from __future__ import annotations

import typer

from memfit.cli._common import JSON_OPTION, err_console, print_json, safe, write_stdout
from memfit.core._workload_load import BUNDLED_DIR
from memfit.core.workload import bundled_names, parse_workload
from memfit.errors import ConfigError, did_you_mean

__all__ = ["register", "show"]


def show(
    name: str = typer.Argument(
        ...,
        metavar="NAME",
        help="A bundled workload (memfit examples), optionally NAME@variant.",
    ),
    as_json: bool = JSON_OPTION,
) -> None:
    """Print a bundled workload's YAML (with its variants) to copy and edit."""
    base, _, variant = name.partition("@")
    known = [n for n in bundled_names() if "@" not in n]
    if base not in known:  # looked up among the names, never as a path (of any length)
        shown = base if len(base) <= 60 else f"{base[:28]}...{base[-28:]}"
        raise ConfigError(
            f"no bundled workload named {shown!r}",
            key_path="NAME",
            hint=did_you_mean(base[:100], known, otherwise="bundled: " + ", ".join(known)),
        )
    path = BUNDLED_DIR / f"{base}.yaml"
    text = path.read_text(encoding="utf-8")
    # the variant must exist; parsing checks it (and the file) as memfit plan would
    workload = parse_workload(text, source=path.name, variant=variant or None, default_name=base)
    variants = sorted(n.partition("@")[2] for n in bundled_names() if n.startswith(base + "@"))
    if as_json:
        print_json({"name": workload.name, "file": path.name, "variants": variants, "yaml": text})
        return
    write_stdout(text if text.endswith("\n") else text + "\n")
    where = (
        f"variant {variant!r} is the keys under variants.{variant}, applied over the rest; "
        if variant
        else ""
    )
    again = f"my_{base}.yaml" + (f"@{variant}" if variant else "")
    err_console.print(
        f"# {safe(where)}save it with `memfit show {safe(name)} > my_{safe(base)}.yaml`, "
        f"edit it, then `memfit plan {safe(again)} --gpu ...`",
        soft_wrap=True,
    )


def register(app: typer.Typer) -> None:
    """Add ``memfit show`` to ``app``."""
    app.command("show")(show)
