"""How ``bench/bands.py`` splits its evidence into calibration and validation and derives each
basis's band from the calibration part: shared with tests/core/test_bands.py, which checks that
the committed table (src/memfit/core/bands.json) is what the committed evidence derives."""

from __future__ import annotations

import fnmatch
import hashlib
import math
from typing import Any

from memfit.core.bands import ALTERNATIVES, PROGRAM_CLASSES, Band, BandTable


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
    convolution's compile, a trace's reserved peak of a convolution step)."""
    return f"{row['basis']}/{row['family']}" if row.get("family") else str(row["basis"])


#: Bands that do not roll up into their basis's: a term of its own (the CUDA context), the
#: compiled program classes known to differ (:data:`memfit.core.bands.PROGRAM_CLASSES`), and
#: the residual of a compiled figure against its program's own alternatives
#: (:data:`memfit.core.bands.ALTERNATIVES`: its families roll up to it, no further).
SEPARATE = frozenset({"fitted/cuda_context", *PROGRAM_CLASSES, ALTERNATIVES})


def _root(key: str) -> str | None:
    """The :data:`SEPARATE` band ``key`` stands under (itself or a parent), else ``None``."""
    return next((s for s in SEPARATE if key == s or key.startswith(f"{s}/")), None)


def _keys(row: dict[str, Any]) -> list[str]:
    """Every band a row is evidence for: its family's and each parent's up to the basis
    (``traced/reserved/conv``, ``traced/reserved``, ``traced``), or, for a row under a band
    that stands apart (:data:`SEPARATE`), up to that band only."""
    key = _key(row)
    root = _root(key)
    parts = key.split("/")
    keys = ["/".join(parts[:n]) for n in range(len(parts), 0, -1)]
    if root is not None:
        keys = keys[: keys.index(root) + 1]
    return keys


def _ends(row: dict[str, Any]) -> tuple[float, float]:
    """The figures a row's band is put around: its program's two alternatives where it has
    them (``alternatives``: the compiled figure if every tunable GEMM fusion stays Triton,
    and if cuBLAS wins them), else its one prediction twice."""
    ends = row.get("alternatives")
    if ends:
        return float(ends[0]), float(ends[1])
    return float(row["predicted"]), float(row["predicted"])


def _error(row: dict[str, Any]) -> float:
    """``truth / estimate - 1`` against the nearer alternative (0 between the two)."""
    low, high = _ends(row)
    truth = float(row["truth"])
    if truth < low:
        return truth / low - 1.0
    if truth > high:
        return truth / high - 1.0
    return 0.0


def derive(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Each band from the calibration rows: the lowest and highest ``truth / predicted - 1``
    seen under it (the estimate itself always inside: low <= 0 <= high). A program class of
    :data:`memfit.core.bands.PROGRAM_CLASSES` that no calibration row covers gets the widest
    band of the rest, with ``cases: 0`` (no evidence: wide by rule, never its basis's)."""
    groups: dict[str, list[float]] = {}
    for row in rows:
        if row["part"] != "calibration" or row["predicted"] <= 0:
            continue
        for key in _keys(row):
            groups.setdefault(key, []).append(_error(row))
    bands: dict[str, Any] = {
        key: {  # to 4 decimals, outwards: the band still covers every calibration case
            "low": math.floor(min(0.0, *errs) * 1e4) / 1e4,
            "high": math.ceil(max(0.0, *errs) * 1e4) / 1e4,
            "cases": len(errs),
        }
        for key, errs in sorted(groups.items())
    }
    widest = BandTable.from_dict({"bands": bands}).widest
    for key in sorted(PROGRAM_CLASSES):
        if key not in bands:
            bands[key] = {"low": widest.low, "high": widest.high, "cases": 0}
    return dict(sorted(bands.items()))


def coverage(rows: list[dict[str, Any]], bands: dict[str, Any], part: str) -> list[dict[str, Any]]:
    """Per band on one part: the rows under it (:func:`_keys`), how many its band covered,
    its mean half-width; and per basis (``<basis>, by family``) the same with each row's
    own band, the one a figure that knows its family gets
    (:meth:`memfit.core.bands.BandTable.band`)."""
    table = BandTable.from_dict({"bands": bands})
    out: dict[str, dict[str, Any]] = {}

    def count(key: str, row: dict[str, Any], band: Band) -> None:
        low, high = _ends(row)
        lo, hi = band.interval(round(low))[0], band.interval(round(high))[1]
        cell = out.setdefault(key, {"basis": key, "cases": 0, "covered": 0, "widths": []})
        cell["cases"] += 1
        cell["covered"] += int(lo <= row["truth"] <= hi)
        cell["widths"].append((hi - lo) / 2 / row["predicted"])

    for row in rows:
        if row["part"] != part or row["predicted"] <= 0:
            continue
        keys = [k for k in _keys(row) if k in bands] or [str(row["basis"])]
        for key in keys:
            count(key, row, table.bands.get(key) or table.band(row["basis"], row.get("family")))
        root = _root(_key(row))
        if row.get("family") and root is None:
            count(f"{row['basis']}, by family", row, table.band(row["basis"], row["family"]))
        elif row.get("family") and root != _key(row) and root == ALTERNATIVES:
            count(f"{root}, by family", row, table.band(row["basis"], row["family"]))
    for cell in out.values():
        widths = cell.pop("widths")
        cell["half_width"] = sum(widths) / len(widths) if widths else math.nan
    return [out[k] for k in sorted(out)]


def _mine(row: dict[str, Any], kind: str, patterns: list[str]) -> bool:
    """Whether ``row`` is one that collecting ``kind`` (of these series) recomputes."""
    series = str(row["case"]).split("/")[0]
    return row.get("collector") == kind and (
        kind != "published" or any(fnmatch.fnmatch(series, p) for p in patterns)
    )
