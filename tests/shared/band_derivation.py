"""How ``bench/bands.py`` splits its evidence into calibration and validation and derives each
basis's band from the calibration part: shared with tests/core/test_bands.py, which checks that
the committed table (src/memfit/core/bands.json) is what the committed evidence derives."""

from __future__ import annotations

import hashlib
import math
from typing import Any


def part_of(case: str, role: str | None = None) -> str:
    """``calibration`` or ``validation``: one case in three (by a hash of its name) to
    validation. A reading a figure was fitted on (the simulator readings marked
    ``calibration``) is ``fit``, in neither part: its error is the fit's residual, not how
    far the figure is off elsewhere."""
    if role == "calibration":
        return "fit"
    digest = hashlib.sha256(case.encode("utf-8")).digest()
    return "validation" if digest[0] % 3 == 0 else "calibration"


def _key(row: dict[str, Any]) -> str:
    """``basis``, or ``basis/family`` for evidence of one family (the PPO formula, a
    convolution's compile)."""
    return f"{row['basis']}/{row['family']}" if row.get("family") else str(row["basis"])


def derive(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Each basis's band from the calibration rows: the lowest and highest ``truth /
    predicted - 1`` seen (the estimate itself always inside: low <= 0 <= high)."""
    groups: dict[str, list[float]] = {}
    for row in rows:
        if row["part"] != "calibration" or row["predicted"] <= 0:
            continue
        groups.setdefault(_key(row), []).append(row["truth"] / row["predicted"] - 1.0)
    bands = {
        key: {  # to 4 decimals, outwards: the band still covers every calibration case
            "low": math.floor(min(0.0, *errs) * 1e4) / 1e4,
            "high": math.ceil(max(0.0, *errs) * 1e4) / 1e4,
            "cases": len(errs),
        }
        for key, errs in sorted(groups.items())
    }
    return bands


def coverage(rows: list[dict[str, Any]], bands: dict[str, Any], part: str) -> list[dict[str, Any]]:
    """Per basis on one part: cases, how many the band covered, its mean half-width."""
    import memfit.core.bands as core_bands

    table = core_bands.BandTable.from_dict({"bands": bands})
    out: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row["part"] != part or row["predicted"] <= 0:
            continue
        key = _key(row)
        family = row.get("family")
        low, high = table.interval(row["predicted"], row["basis"], family)
        cell = out.setdefault(key, {"basis": key, "cases": 0, "covered": 0, "widths": []})
        cell["cases"] += 1
        cell["covered"] += int(low <= row["truth"] <= high)
        cell["widths"].append((high - low) / 2 / row["predicted"])
    for cell in out.values():
        widths = cell.pop("widths")
        cell["half_width"] = sum(widths) / len(widths) if widths else math.nan
    return [out[k] for k in sorted(out)]
