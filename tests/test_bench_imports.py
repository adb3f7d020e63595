"""Every import a bench script makes resolves: a module moved or renamed in src/memfit or in
tests/shared must take the scripts that use it along (nothing else runs most of them in CI)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
SHARED = ROOT / "tests" / "shared"


def _imports(path: Path) -> list[tuple[int, str, tuple[str, ...]]]:
    """(line, module, names) for every absolute import in the file, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name, ()) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module, tuple(a.name for a in node.names)))
    return found


def _local(module: str) -> bool:
    """A script's sibling, a test-support module, or an example's module (scripts that run an
    example put its folder on ``sys.path``)."""
    top = module.split(".")[0]
    folders = [BENCH, SHARED, *(p for p in (ROOT / "examples").iterdir() if p.is_dir())]
    return any((folder / f"{top}.py").exists() for folder in folders)


def _missing(module: str, names: tuple[str, ...]) -> str | None:
    if module.split(".")[0] != "memfit":
        if _local(module) or importlib.util.find_spec(module.split(".")[0]) is not None:
            return None
        return f"no module {module!r} (not in bench/, tests/shared/, examples/ or installed)"
    try:
        loaded = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        return f"no module {module!r} ({exc})"
    for name in names:
        if (
            name != "*"
            and not hasattr(loaded, name)
            and importlib.util.find_spec(f"{module}.{name}") is None
        ):
            return f"{module!r} has no {name!r}"
    return None


@pytest.mark.parametrize("script", sorted(BENCH.glob("*.py")), ids=lambda p: p.name)
def test_every_import_of_a_bench_script_resolves(script: Path) -> None:
    pytest.importorskip("torch")
    problems = [
        f"{script.name}:{line}: {why}"
        for line, module, names in _imports(script)
        if (why := _missing(module, names)) is not None
    ]
    assert problems == []


def _top_level_names(path: Path) -> set[str]:
    """Names a module defines or imports at its top level (``import *`` makes it open)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    names.add("*")
                names.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, (ast.If, ast.Try)):
            for sub in ast.walk(node):
                if isinstance(sub, (ast.FunctionDef, ast.ClassDef)):
                    names.add(sub.name)
                elif isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                    names.add(sub.id)
                elif isinstance(sub, (ast.Import, ast.ImportFrom)):
                    names.update((a.asname or a.name).split(".")[0] for a in sub.names)
    return names


def _local_file(module: str) -> Path | None:
    for folder in (BENCH, SHARED):
        if (folder / f"{module}.py").exists():
            return folder / f"{module}.py"
    return None


@pytest.mark.parametrize("script", sorted(BENCH.glob("*.py")), ids=lambda p: p.name)
def test_every_name_a_bench_script_takes_from_a_sibling_is_there(script: Path) -> None:
    """``import gpu_truth`` then ``gpu_truth.X``: X is defined in that module (code moved to
    tests/shared leaves its private names behind)."""
    tree = ast.parse(script.read_text(encoding="utf-8"))
    local = {
        (alias.asname or alias.name): path
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if (path := _local_file(alias.name)) is not None
    }
    problems = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in local
        ):
            defined = _top_level_names(local[node.value.id])
            if "*" not in defined and node.attr not in defined:
                problems.append(f"{script.name}:{node.lineno}: {node.value.id}.{node.attr}")
    assert problems == []
