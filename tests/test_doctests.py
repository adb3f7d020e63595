"""Run the docstring examples of every memfit module that has some (no GPU needed).

The modules are found, not listed: a new module's examples run without anyone adding it here.
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import pkgutil
from pathlib import Path

import pytest

import memfit


def _modules_with_examples() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(memfit.__path__, "memfit."):
        spec = importlib.util.find_spec(info.name)
        origin = spec.origin if spec is not None else None
        if origin and origin.endswith(".py") and ">>> " in Path(origin).read_text():
            names.append(info.name)
    return sorted(names)


MODULES = _modules_with_examples()


def test_examples_are_found() -> None:
    # A broken walk would collect nothing and pass: the core modules must be among them.
    assert {"memfit.units", "memfit.core.ladder", "memfit.runtime.cleanup"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_module_doctests(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no doctest examples"
    assert result.failed == 0, f"{result.failed} of {name}'s examples failed"
