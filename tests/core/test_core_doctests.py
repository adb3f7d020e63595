"""Docstring examples of the simulator, measured-terms and family-registry modules (the
shared list is tests/test_doctests.py)."""

from __future__ import annotations

import doctest
import importlib

import pytest


@pytest.mark.parametrize(
    "name",
    ["memfit.core.simulator", "memfit.core.measured", "memfit.core.families.registry"],
)
def test_module_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
