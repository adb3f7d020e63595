"""The public names in ``memfit.__all__`` all resolve, and ``import memfit`` stays light."""

from __future__ import annotations

import subprocess
import sys

import pytest

import memfit


@pytest.mark.parametrize("name", memfit.__all__)
def test_every_public_name_resolves(name: str) -> None:
    assert getattr(memfit, name) is not None


def test_unknown_name_raises_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        memfit.nope  # noqa: B018


def test_import_memfit_loads_no_framework() -> None:
    code = (
        "import sys, memfit; memfit.parse_bytes('1GiB'); "
        "print(','.join(m for m in ('torch', 'jax', 'pynvml') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == ""


def _type_checking_imports() -> dict[str, str]:
    """``name -> module`` of the ``if TYPE_CHECKING:`` imports of ``memfit/__init__.py``."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(memfit.__file__).read_text(encoding="utf-8"))
    block = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING"
    )
    found = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom), ast.dump(node)
        for alias in node.names:
            module = node.module or ""
            is_module = alias.name in memfit._SUBMODULES
            found[alias.name] = f"{module}.{alias.name}" if is_module else module
    return found


def test_one_list_of_public_names() -> None:
    """``__all__`` is exactly the names imported eagerly, the lazy table and the submodules;
    the ``TYPE_CHECKING`` imports (what type checkers see) name the same module for each."""
    errors = {
        name
        for name, value in vars(memfit).items()
        if isinstance(value, type) and issubclass(value, memfit.MemfitError)
    }
    eager = {"__version__", "format_bytes", "parse_bytes"} | errors
    lazy = set(memfit._LAZY) | set(memfit._SUBMODULES)
    assert eager & lazy == set()
    assert sorted(memfit.__all__) == sorted(eager | lazy)
    assert len(memfit.__all__) == len(set(memfit.__all__))
    seen = _type_checking_imports()
    assert set(seen) == lazy
    for name, module in memfit._LAZY.items():
        assert seen[name] == module, name
    for name, module in memfit._SUBMODULES.items():
        assert seen[name] == module, name
