"""What the bench scripts share: where their results go, how they are stamped and written.

The scripts run as ``python bench/<name>.py`` (this folder is then ``sys.path[0]``); a script
that tests load by file path puts this folder on ``sys.path`` itself before ``import _common``.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "out"


def utc_minute() -> str:
    """Now, to the minute: ``2026-07-01 12:34 UTC``."""
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def write_results(stem: str, data: Any, markdown: str) -> None:
    """``bench/out/<stem>.json`` (``data``, indented) and ``bench/out/<stem>.md``."""
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{stem}.json").write_text(json.dumps(data, indent=2))
    (OUT / f"{stem}.md").write_text(markdown)


def rel_err(pred: int | None, real: int | None) -> float | None:
    """``(pred - real) / real``; ``None`` where either is missing (or ``real`` is 0)."""
    if pred is None or not real:
        return None
    return (pred - real) / real


def error_summary(errors: Sequence[float], what: str = "runs") -> str:
    """``mean |err| 1.1%, worst -3.5%, most under -3.5% over 21 runs``; ``no runs`` when empty.

    >>> error_summary([0.1, -0.2], "rows")
    'mean |err| 15.0%, worst -20.0%, most under -20.0% over 2 rows'
    """
    if not errors:
        return f"no {what}"
    mean = sum(abs(e) for e in errors) / len(errors)
    return (
        f"mean |err| {mean:.1%}, worst {max(errors, key=abs):+.1%}, most under "
        f"{min(errors):+.1%} over {len(errors)} {what}"
    )
