"""Tests never import a script under bench/: what a test and a bench script share (corpus
definitions, loaders, comparisons) lives in tests/shared/, which the bench scripts import.

A test may still run a bench script as a user does (``python bench/docs_outputs.py``, in a
child process): that checks its command line, and nothing of the script becomes the test's.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
TESTS = ROOT / "tests"

#: Calls that load a file as a module, or put a folder on the import path.
LOADERS = ("spec_from_file_location", "run_path", "SourceFileLoader", "path.insert", "path.append")


def bench_modules() -> set[str]:
    """The names a bench script is imported under (bench/X.py is ``X`` with bench/ on the path,
    ``bench.X`` from the checkout's root)."""
    stems = {p.stem for p in BENCH.glob("*.py")}
    return stems | {f"bench.{s}" for s in stems} | {"bench"}


def _imported(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        return [node.module]
    return []


def bench_uses(source: str, bench: set[str]) -> list[str]:
    """Each place in ``source`` (a test module's text) that imports or loads a bench script:
    an import of one, a loader call or a path insertion that names bench/, and the same in
    the code a test hands to a child interpreter as a string (``python -c``)."""
    found: list[str] = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        for name in _imported(node):
            if name in bench or name.split(".")[0] == "bench":
                found.append(f"line {node.lineno}: import {name}")
        if isinstance(node, ast.Call):
            called = ast.unparse(node.func)
            text = ast.unparse(node)
            if called.endswith(LOADERS) and "bench" in text:
                found.append(f"line {node.lineno}: {text[:80]}")
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and ("import" in node.value or "sys.path" in node.value)
        ):
            try:
                child = bench_uses(node.value, bench)
            except SyntaxError:  # prose, not code
                continue
            found += [f"line {node.lineno} (child code): {use}" for use in child]
    return found


def test_no_test_module_imports_or_loads_a_bench_script() -> None:
    bench = bench_modules()
    offenders = {}
    for path in sorted(TESTS.rglob("*.py")):
        if path == Path(__file__).resolve():
            continue
        uses = bench_uses(path.read_text(encoding="utf-8"), bench)
        if uses:
            offenders[str(path.relative_to(ROOT))] = uses
    assert offenders == {}, (
        "tests must not import bench scripts: move what they share into tests/shared/ "
        f"(the bench script imports it from there): {offenders}"
    )


def test_the_bench_finder_sees_what_it_must() -> None:
    bench = {"gpu_truth", "bench.gpu_truth", "bench"}
    caught = [
        "import gpu_truth",
        "from gpu_truth import predict",
        "from bench.gpu_truth import predict",
        "import importlib.util\n"
        "spec = importlib.util.spec_from_file_location('m', ROOT / 'bench' / 'gpu_truth.py')",
        "import sys\nsys.path.insert(0, str(ROOT / 'bench'))",
        "CHILD = 'import sys\\nfrom gpu_truth import predict\\n'",
    ]
    for source in caught:
        assert bench_uses(source, bench), source
    passed = [
        "import truth_corpus",
        "import subprocess\nsubprocess.run(['python', str(ROOT / 'bench' / 'gpu_truth.py')])",
        "import sys\nsys.path.insert(0, str(ROOT / 'tests' / 'shared'))",
        "TEXT = 'the bench writes it: import it from tests/shared'",
    ]
    for source in passed:
        assert not bench_uses(source, bench), source
