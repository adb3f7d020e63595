"""The house keeps its plan: the import graph of ``src/memfit``, read from the source (no
import runs), has no cycle and no import from a lower layer to a higher one.

Every import counts: at module level, inside a function (a lazy import is still a
dependency) and under ``if TYPE_CHECKING:``. The layers are the ones ``docs/internals.md``
draws; a module may import its own layer or a lower one. A new module must be given a layer
here (the test fails for a module it cannot place).
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "memfit"

#: From the ground up. A key is a module or a package prefix; the longest matching key wins.
LAYERS: dict[str, int] = {
    "memfit._version": 1,
    "memfit._plain": 1,
    "memfit.errors": 1,
    "memfit._checks": 1,
    "memfit.units": 1,
    "memfit._userfiles": 1,
    "memfit._lazy": 1,
    "memfit.hardware": 2,
    "memfit.allocator": 3,
    "memfit.core": 4,
    "memfit.backends": 5,
    "memfit.estimate": 6,
    "memfit.runtime": 7,
    "memfit.monitor": 8,
    "memfit.planning": 8,
    "memfit.planning_devices": 8,
    "memfit.integrations": 9,
    "memfit.testing": 9,
    "memfit.jax": 9,
    "memfit": 10,
    "memfit.cli": 11,
}

#: Within layer 1 the ground floor has its own order (a file imports only those before it).
GROUND_ORDER = (
    "memfit._version",
    "memfit._plain",
    "memfit.errors",
    "memfit._checks",
    "memfit.units",
    "memfit._userfiles",
    "memfit._lazy",
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(name: str, known: set[str]) -> str | None:
    """The module of ours that ``name`` is (or the package it lies in), else ``None``."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


@cache
def _tree(path: Path) -> ast.Module:
    """``path`` parsed, once per test process (the checks here only read the trees)."""
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """Modules of memfit that ``module`` imports anywhere in its source."""
    tree = _tree(path)
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _resolve(alias.name, known)
                if target is not None:
                    found.add(target)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if not is_package:
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            for alias in node.names:
                full = f"{stem}.{alias.name}"
                target = _resolve(full, known) if full in known else _resolve(stem, known)
                if target is not None:
                    found.add(target)
    found.discard(module)
    return found


@cache
def _graph() -> dict[str, frozenset[str]]:
    mods = modules()
    known = set(mods)
    return {m: frozenset(imports_of(m, p, known)) for m, p in mods.items()}


def graph() -> dict[str, set[str]]:
    """Each module of memfit and the modules of memfit it imports (read once per test
    process, a fresh copy for each caller)."""
    return {m: set(found) for m, found in _graph().items()}


def layer(module: str) -> int:
    best = max((k for k in LAYERS if module == k or module.startswith(k + ".")), key=len)
    return LAYERS[best]


def _ground_rank(module: str) -> int | None:
    return GROUND_ORDER.index(module) if module in GROUND_ORDER else None


def climbing(g: dict[str, set[str]]) -> list[str]:
    bad = []
    for m, targets in sorted(g.items()):
        for t in sorted(targets):
            if layer(t) > layer(m):
                bad.append(f"{m} (layer {layer(m)}) imports {t} (layer {layer(t)})")
            rm, rt = _ground_rank(m), _ground_rank(t)
            if rm is not None and rt is not None and rt > rm:
                bad.append(f"{m} imports {t}, which stands above it on the ground floor")
    return bad


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(g):
        if root in index:
            continue
        work = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(g[nxt]))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_every_module_has_a_layer() -> None:
    for m in modules():
        assert any(m == k or m.startswith(k + ".") for k in LAYERS), m


def test_no_import_cycle() -> None:
    found = cycles(graph())
    assert found == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_no_import_climbs_a_layer() -> None:
    assert climbing(graph()) == []


def test_the_checker_sees_what_it_must() -> None:
    """The reader finds lazy, relative and TYPE_CHECKING imports, and the checks catch a
    planted cycle and a planted climb (so the tests above cannot pass by reading nothing)."""
    g = graph()
    assert "memfit.errors" in g["memfit.units"]
    assert g["memfit.errors"] == set()
    planted = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert cycles(planted) == [["a", "b", "c"]]
    assert climbing({"memfit.core.plan": {"memfit.integrations.brax"}}) != []
    assert climbing({"memfit.errors": {"memfit.units"}}) != []


#: Files being rewritten in this round whose split comes with the rewrite (the issue on CUDA's
#: kernels splits the trace, the guard's issue the train guard). A name here that is no longer
#: over the limit fails the test, so the list only shrinks.
PENDING_SPLIT: frozenset[str] = frozenset()


@pytest.mark.parametrize("limit", [1000])
def test_no_source_file_is_over_the_limit(limit: int) -> None:
    """A reader holds one file in mind: no module under src/ is over 1,000 lines (data files,
    which are not Python, are exempt)."""
    long = {m: n for m, p in modules().items() if (n := len(p.read_text().splitlines())) > limit}
    assert set(long) - PENDING_SPLIT == set(), long
    assert PENDING_SPLIT - set(long) == set(), "split now: take it off PENDING_SPLIT"


#: The estimators by backend: neither imports the other (a torch user never loads the XLA
#: path, a JAX user never the torch trace).
BACKENDS = ("memfit.estimate.torch", "memfit.estimate.xla")

#: The flat public paths of the backend modules (importing one gives that module itself).
PUBLIC_PATHS = {
    "memfit.estimate.torch_trace": "memfit.estimate.torch.trace",
    "memfit.estimate.jax_xla": "memfit.estimate.xla.step",
    "memfit.estimate.jax_program": "memfit.estimate.xla.program",
    "memfit.estimate.xla_gpu": "memfit.estimate.xla.gpu",
}


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_estimators_split_by_backend_without_crossing() -> None:
    g = graph()
    for package in BACKENDS:
        members = [m for m in g if _in(m, package)]
        assert len(members) > 3, package
        others = [b for b in BACKENDS if b != package]
        crossing = {m: sorted(t for t in g[m] if any(_in(t, o) for o in others)) for m in members}
        assert {m: t for m, t in crossing.items() if t} == {}
    # nothing below estimate/ reaches into a backend but through estimate's own modules
    outside = {
        m: sorted(t for t in ts if any(_in(t, b) for b in BACKENDS))
        for m, ts in g.items()
        if not _in(m, "memfit.estimate") and m not in PUBLIC_PATHS
    }
    assert all(layer(m) > layer("memfit.estimate") for m, ts in outside.items() if ts)


def test_the_public_flat_paths_are_the_backend_modules() -> None:
    import importlib

    for flat, real in PUBLIC_PATHS.items():
        assert importlib.import_module(flat) is importlib.import_module(real), flat


#: The map: docs/internals.md's "Packages and modules" section lists every module.
INTERNALS = SRC.parent / "docs" / "internals.md"


def mapped_modules(text: str) -> dict[str, str]:
    """``{"memfit/estimate/torch/trace.py": role}`` from the map's sections and bullets."""
    section = text.split("## Packages and modules", 1)[1].split("\n## ", 1)[0]
    found: dict[str, str] = {}
    package = None
    for line in section.splitlines():
        if line.startswith("### `") and line.rstrip().endswith("/`"):
            package = line.strip()[5:-1]
        elif line.startswith("- `") and package is not None:
            name, _, role = line[3:].partition("`: ")
            assert name.endswith(".py") and role.strip(), line
            found[package + name] = role
    return found


def test_the_map_names_every_module_and_nothing_else() -> None:
    listed = set(mapped_modules(INTERNALS.read_text(encoding="utf-8")))
    actual = {str(p.relative_to(SRC)) for p in PACKAGE.rglob("*.py")}
    assert sorted(actual - listed) == [], "add these to docs/internals.md's module map"
    assert sorted(listed - actual) == [], "docs/internals.md names modules that do not exist"


def test_the_map_reader_sees_what_it_must() -> None:
    text = "## Packages and modules\n\n### `memfit/x/`\n\n- `a.py`: one.\n  more\n- `b.py`: two.\n"
    assert set(mapped_modules(text)) == {"memfit/x/a.py", "memfit/x/b.py"}
    assert mapped_modules(text + "\n## Next\n\n### `memfit/y/`\n- `c.py`: no.\n").keys() == {
        "memfit/x/a.py",
        "memfit/x/b.py",
    }


#: Code names what it does, not the issue that asked for it.
ISSUE_NUMBER = re.compile(r"\b[Ii]ssues? \d+|\([Ii]ssue \d+")


def test_source_names_no_issue_number() -> None:
    named = {
        m: [i + 1 for i, line in enumerate(p.read_text().splitlines()) if ISSUE_NUMBER.search(line)]
        for m, p in modules().items()
    }
    assert {m: lines for m, lines in named.items() if lines} == {}


#: One reader of memory now: the framework calls that say how much memory there is.
MEMORY_CALLS = frozenset(
    {
        "mem_get_info",
        "memory_allocated",
        "max_memory_allocated",
        "memory_reserved",
        "max_memory_reserved",
        "memory_cached",
        "max_memory_cached",
        "memory_stats",
        "memory_stats_as_nested_dict",
        "memory_summary",
        "memory_snapshot",
        "device_memory_used",
        "list_gpu_processes",
        "reset_peak_memory_stats",
        "reset_max_memory_allocated",
        "reset_max_memory_cached",
        "_cuda_memoryStats",
    }
)
#: NVML's functions (``nvmlInit``, ``nvmlDeviceGetMemoryInfo``...).
NVML_CALL = re.compile(r"^nvml[A-Z]")
#: Where they may be made: ``backends/live.py`` for torch and JAX, the NVML gate for NVML.
MEMORY_READER = "memfit.backends.live"
NVML_GATE = "memfit.backends.nvml"


def memory_calls(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, name)`` of every use of a memory-reading function or an ``nvml*`` one: a call,
    a reference kept to call later (``read = torch.cuda.memory_allocated``), an import of it
    (``from torch.cuda import mem_get_info``) or a ``getattr`` by its name."""
    found = []
    for node in ast.walk(tree):
        name = ""
        if isinstance(node, ast.Attribute):
            name = node.attr
        elif isinstance(node, ast.Name):
            name = node.id
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name in MEMORY_CALLS or NVML_CALL.match(alias.name):
                    found.append((node.lineno, alias.name))
        elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "getattr":
            attr = node.args[1] if len(node.args) > 1 else None
            if isinstance(attr, ast.Constant) and isinstance(attr.value, str):
                name = attr.value
        if name in MEMORY_CALLS or NVML_CALL.match(name):
            found.append((node.lineno, name))
    return sorted(found)


def test_one_module_asks_how_much_memory_there_is() -> None:
    outside = {}
    for m, p in modules().items():
        calls = memory_calls(_tree(p))
        if m == MEMORY_READER:
            calls = [c for c in calls if NVML_CALL.match(c[1])]
        elif m == NVML_GATE:
            calls = [c for c in calls if not NVML_CALL.match(c[1])]
        if calls:
            outside[m] = calls
    assert outside == {}, "read memory through memfit.backends.live (NVML: backends/nvml.py)"


def test_the_memory_call_finder_sees_what_it_must() -> None:
    tree = ast.parse("torch.cuda.mem_get_info(0)\nx = dev.memory_stats()\nnvmlInit()\nf(1)\n")
    assert memory_calls(tree) == [(1, "mem_get_info"), (2, "memory_stats"), (3, "nvmlInit")]
    hidden = (
        "read = torch.cuda.memory_allocated\n"
        "from torch.cuda import memory_reserved as reserved\n"
        "getattr(torch.cuda, 'max_memory_reserved')()\n"
        "torch.cuda.memory_snapshot()\n"
        "x.memory_format\nfrom memfit.backends import nvml\nnvml.NvmlProbe()\n"
        "torch.cuda.memory._snapshot()\n"
    )
    assert memory_calls(ast.parse(hidden)) == [
        (1, "memory_allocated"),
        (2, "memory_reserved"),
        (3, "max_memory_reserved"),
        (4, "memory_snapshot"),
    ]


def test_the_simulators_read_memory_through_the_one_reader() -> None:
    """``simulate_gpu`` and the simulator's measurement read the device as everything else
    does, through ``backends/live.py`` (they once asked torch themselves)."""
    g = graph()
    for m in ("memfit.runtime.simulate", "memfit.runtime.sim_measure"):
        assert memory_calls(_tree(modules()[m])) == [], m
        assert MEMORY_READER in g[m], m


#: What a user reaches: the package, the command line, the public submodules, and every
#: module the user docs name (``memfit.core.workload_sources`` ...).
ENTRY_POINTS = ("memfit", "memfit.cli.main", "memfit.jax", "memfit.testing", "memfit.estimate")
DOCS = [SRC.parent / "README.md", *sorted((SRC.parent / "docs").glob("*.md"))]


def used_modules() -> set[str]:
    """Modules reached from the entry points, through imports and module names in strings
    (the lazy table of ``memfit/__init__.py``, the CLI's command table, a registry that loads
    every module of its package)."""
    mods = modules()
    known = set(mods)
    edges = graph()
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        source = path.read_text(encoding="utf-8")
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for candidate in (node.value, f"{package}.{node.value}"):
                    if candidate in known:
                        edges[name].add(candidate)
        if "iter_modules" in source:  # a registry that imports all of its package
            edges[name] |= {k for k in known if k.startswith(package + ".")}
    named = {m for doc in DOCS for m in re.findall(r"memfit(?:\.\w+)+", doc.read_text())}
    documented = {found for m in named if (found := _resolve(m, known)) is not None}
    public = {m for m in known if m.startswith("memfit.integrations.") and "._" not in m}
    todo = [*ENTRY_POINTS, *documented, *public, *PUBLIC_PATHS]
    seen: set[str] = set()
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        parts = m.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))
        todo.extend(edges.get(m, ()))
    return seen


def test_no_source_module_serves_only_bench_or_tests() -> None:
    """Code only bench scripts or tests call belongs in bench/ or tests/shared/."""
    unused = sorted(set(modules()) - used_modules())
    assert unused == [], "no entry point reaches these: move them to bench/ or tests/shared/"


#: Classes that share a name on purpose or from before this rule, each with its reason; a
#: new pair fails the test, and an entry that no longer applies must be taken off (the list
#: only shrinks).
SAME_NAME: dict[str, str] = {
    "TrainGuard": "memfit.jax.TrainGuard is the JAX guard under the torch guard's name, by design",
}


def test_distinct_things_have_distinct_names() -> None:
    seen: dict[str, list[str]] = {}
    for m, p in modules().items():
        for node in _tree(p).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                seen.setdefault(node.name, []).append(m)
    shared = {name: mods for name, mods in seen.items() if len(mods) > 1}
    assert set(shared) - set(SAME_NAME) == set(), {
        n: shared[n] for n in set(shared) - set(SAME_NAME)
    }
    assert set(SAME_NAME) - set(shared) == set(), "renamed: take it off SAME_NAME"


#: "Memory now" has one record, :class:`memfit.backends.live.Reading`. A class that stores a
#: free figure beside a total or a held one (allocated, reserved) is another such record; the
#: ones below are other things, each with its reason (the list is exact).
MEMORY_RECORD = ("memfit.backends.live", "Reading")
NOT_MEMORY_NOW: dict[tuple[str, str], str] = {
    ("memfit.backends.base", "DeviceSnapshot"): "a probe's saved view of a whole device "
    "(processes, driver, utilisation) that plans load from JSON; ProbeReader reads it",
    ("memfit.monitor.explanation", "OomInfo"): "the figures an out-of-memory message quoted",
}
FREE_FIGURE = re.compile(r"(^|_)free(_bytes)?$")
OTHER_FIGURE = re.compile(r"(^|_)(total|capacity|allocated|reserved|in_use)(_bytes)?$")
FIGURE = {"int", "float", "max", "min"}


def stored_fields(cls: ast.ClassDef) -> set[str]:
    """The names a class stores: annotated names in its body (a dataclass, a NamedTuple) and
    ``self.name = value`` in its ``__init__`` (a value, not an object it builds: a call
    other than a number's conversion is not a figure)."""
    names = {
        s.target.id
        for s in cls.body
        if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
    }
    for item in cls.body:
        if isinstance(item, ast.FunctionDef) and item.name == "__init__":
            for node in ast.walk(item):
                targets = node.targets if isinstance(node, ast.Assign) else []
                if isinstance(node, ast.AnnAssign):
                    targets = [node.target]
                value = getattr(node, "value", None)
                if isinstance(value, ast.Call) and getattr(value.func, "id", "") not in FIGURE:
                    continue
                for t in targets:
                    if isinstance(t, ast.Attribute) and getattr(t.value, "id", "") == "self":
                        names.add(t.attr)
    return names


def memory_now_records(tree: ast.AST) -> list[str]:
    """Classes that store a free figure beside a total or held one."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            fields = stored_fields(node)
            if any(map(FREE_FIGURE.search, fields)) and any(map(OTHER_FIGURE.search, fields)):
                found.append(node.name)
    return found


def test_memory_now_has_one_record() -> None:
    found = {(m, name) for m, p in modules().items() for name in memory_now_records(_tree(p))}
    assert MEMORY_RECORD in found
    assert found - {MEMORY_RECORD} - set(NOT_MEMORY_NOW) == set(), (
        "use memfit.backends.live.Reading for memory now"
    )
    assert set(NOT_MEMORY_NOW) - found == set(), "gone: take it off NOT_MEMORY_NOW"


def test_the_memory_record_finder_sees_what_it_must() -> None:
    source = (
        "@dataclass\nclass A:\n    free_bytes: int\n    total_bytes: int\n"
        "class B(NamedTuple):\n    device_free: int\n    reserved: int\n"
        "class C:\n    def __init__(self):\n        self.free = 1\n"
        "        self.allocated = int(a)\n"
        "class G:\n    def __init__(self):\n        self.free = gauge()\n"
        "        self.total = gauge()\n"
        "class D:\n    now: Reading\n    @property\n    def free_bytes(self): ...\n"
        "class E:\n    frees: int\n    total_bytes: int\n"
    )
    assert memory_now_records(ast.parse(source)) == ["A", "B", "C"]
