"""The multi-GPU truth corpus: well formed, split, and the calibration part rebuilt in CI."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "published_truth" / "multi_gpu" / "readings.yaml"


def _bench() -> ModuleType:
    import multi_gpu_readings

    return multi_gpu_readings


DOC = yaml.safe_load(DATA.read_text(encoding="utf-8"))


def test_two_parts_and_every_reading_sourced() -> None:
    assert set(DOC) == {"calibration", "validation"}
    ids = [r["id"] for part in DOC.values() for r in part]
    assert len(ids) == len(set(ids))
    for part in DOC.values():
        for reading in part:
            assert reading["source"]["quoted"].strip()
            assert reading["source"].get("url") or reading["source"].get("located") is False
            assert reading["quantity"] and reading["unit_bytes"] > 0


@pytest.mark.parametrize("reading", DOC["calibration"], ids=lambda r: r["id"])
def test_calibration_readings_within_fifteen_percent(reading: dict[str, object]) -> None:
    bench = _bench()
    [row] = bench.rows([reading])
    assert abs(row["error"]) <= 0.15, row


def test_the_doc_table_is_the_benchs() -> None:
    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    bench = _bench()
    for part in DOC.values():
        for row in bench.rows(part):
            assert f"| `{row['id']}` |" in text
            assert f"{row['error']:+.1%}" in text
