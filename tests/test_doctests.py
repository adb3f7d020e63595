"""Run the docstring examples of the pure modules (on the simulated backend, no GPU)."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "memfit.units",
    "memfit.errors",
    "memfit.estimate.affine",
    "memfit.core.allocator",
    "memfit.core.ladder",
    "memfit.core.catalog",
    "memfit.core.budget",
    "memfit.backends.base",
    "memfit.backends.simulated",
    "memfit.backends.nvml",
    "memfit.backends.jax_device",
    "memfit.runtime.allocator_env",
]


@pytest.mark.parametrize("name", MODULES)
def test_module_doctests(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no doctest examples"
    assert result.failed == 0
