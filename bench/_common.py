"""What the bench scripts share: where their results go, how they are stamped and written.

The scripts run as ``python bench/<name>.py`` (this folder is then ``sys.path[0]``); a script
that tests load by file path puts this folder on ``sys.path`` itself before ``import _common``.
"""

from __future__ import annotations

import datetime as dt
import json
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
