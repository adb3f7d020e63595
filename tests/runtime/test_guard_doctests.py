"""The docstring examples of the guard modules run (on the CPU, no GPU)."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["memfit.runtime._batching", "memfit.runtime._train_guard", "memfit.testing"]


@pytest.mark.parametrize("name", MODULES)
def test_module_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no doctest examples"
    assert result.failed == 0
