"""The test files CI starts first (``LONGEST_FIRST`` in tests/conftest.py) exist, and the
collection puts their tests first, in that order, each file's tests together."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _conftest(config: pytest.Config) -> Any:
    for plugin in config.pluginmanager.get_plugins():
        if hasattr(plugin, "LONGEST_FIRST") and hasattr(plugin, "pytest_collection_modifyitems"):
            return plugin
    raise AssertionError("tests/conftest.py is not loaded")


def test_every_file_started_first_exists(pytestconfig: pytest.Config) -> None:
    listed = _conftest(pytestconfig).LONGEST_FIRST
    assert len(set(listed)) == len(listed)
    missing = [path for path in listed if not (ROOT / path).is_file()]
    assert not missing, f"renamed or removed: take them out of LONGEST_FIRST: {missing}"


class _Item:
    def __init__(self, path: Path, name: str) -> None:
        self.path = path
        self.name = name


def test_the_longest_files_come_first_each_file_kept_together(
    pytestconfig: pytest.Config,
) -> None:
    conftest = _conftest(pytestconfig)
    first, second = conftest.LONGEST_FIRST[:2]
    items: list[Any] = [
        _Item(ROOT / "tests/test_units.py", "a"),
        _Item(ROOT / second, "b1"),
        _Item(ROOT / "tests/test_units.py", "c"),
        _Item(ROOT / first, "d"),
        _Item(ROOT / second, "b2"),
        _Item(ROOT / "tests/test_units_bounds.py", "e"),
    ]
    items.sort(key=conftest._start_rank)
    assert [i.name for i in items] == ["d", "b1", "b2", "a", "c", "e"]
