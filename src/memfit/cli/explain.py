"""``memfit explain SNAPSHOT``: why a run peaked where it did, or ran out of memory.

Reads a CUDA memory snapshot (``torch.cuda.memory._dump_snapshot()``, memfit's OOM dump, or
the same data as JSON) without running anything in it, replays its allocator trace and prints
the peaks, where the memory was, the fragmentation, what other allocator settings would have
done, and growing sites. ``-o report.png`` draws the timeline, ``-o report.html`` writes one
self-contained page; ``--json`` prints :class:`memfit.Explanation` as data.
"""

from __future__ import annotations

from pathlib import Path

import typer

from memfit._checks import parse_int
from memfit.cli._common import JSON_OPTION, err_console, out_console, print_json, safe
from memfit.cli._files import FORCE_OPTION, Output
from memfit.cli._progress import status
from memfit.errors import ConfigError
from memfit.units import format_bytes

__all__ = ["explain", "register"]


def _at(text: str) -> str | int:
    value = text.strip().lower()
    if value in ("oom", "peak", "end", "auto"):
        return value
    if value[:1].isalpha():
        raise ConfigError(
            f"--at {text[:40]!r} is not oom, peak, end or an event index",
            key_path="--at",
            hint="pass --at oom, --at peak, --at end or --at 1234 (an event of the trace)",
        )
    return parse_int(
        "--at",
        value,
        lo=0,
        hint="pass --at oom, --at peak, --at end or --at 1234 (an event of the trace)",
    )


def explain(
    snapshot: Path = typer.Argument(
        ...,
        metavar="SNAPSHOT",
        help="A torch.cuda.memory._dump_snapshot() pickle, memfit's OOM dump, or JSON.",
    ),
    output: str | None = typer.Option(  # text, not Path: Path("x.png/") drops the slash
        None,
        "-o",
        "--output",
        help="Write the timeline (.png) or the full page (.html); a new file, or --force.",
    ),
    at: str = typer.Option(
        "auto",
        "--at",
        help="Where to look: oom, peak (the most memory live), end or an event index (default: "
        "the OOM, else the peak).",
    ),
    device: int | None = typer.Option(
        None,
        "--device",
        help="The device to explain (default: the one with an OOM, else the busiest).",
    ),
    force: bool = FORCE_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Explain a CUDA memory snapshot: peaks, where the memory went, what would help."""
    from memfit.monitor.explain import explain as run_explain
    from memfit.monitor.explain_render import png_bytes, render_html, render_text

    out = (
        Output.named(
            output, what="the explanation", option="--output", force=force, inputs=[snapshot]
        )
        if output is not None
        else None
    )
    suffix = out.path.suffix.lower() if out is not None else ""
    if out is not None and suffix not in (".png", ".html", ".htm"):
        raise ConfigError(
            f"cannot tell the output format from {out.path.name!r}",
            key_path="--output",
            hint="name the output report.png (timeline) or report.html (page)",
        )
    where = _at(at)
    if out is not None:
        out.check()
    with status(f"reading {safe(snapshot)}", quiet=as_json) as update:
        result = run_explain(
            snapshot,
            at=where,
            device=device,
            progress=lambda done, total: update(
                f"reading {safe(snapshot)}: {done / max(total, 1):.0%} of {format_bytes(total)}"
                if done < total
                else f"explaining {safe(snapshot)}: replaying its trace"
            ),
        )
    if out is not None:
        out.write(png_bytes(result) if suffix == ".png" else render_html(result))
    if as_json:
        data = result.to_dict()
        if out is not None:
            data["output"] = str(out.path)
        print_json(data)
        return
    for line in render_text(result):
        out_console.print(safe(line), highlight=False, soft_wrap=True)
    if out is not None:
        err_console.print(f"wrote {safe(out.path)}")


def register(app: typer.Typer) -> None:
    """Add ``memfit explain`` to ``app``."""
    app.command("explain")(explain)
