"""Shared test setup.

Hypothesis runs the deterministic ``ci`` profile unless ``HYPOTHESIS_PROFILE`` names another.
Every test under ``tests/gpu/`` is marked ``gpu``; ``gpu`` tests skip themselves where torch has
no CUDA device (this machine and CI), and run on a machine that has one.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

# Test helpers shared inside an area (tests/cli/_cli_run.py, tests/runtime/_ddp_launch.py) or
# across areas (tests/shared/) are imported by name: pytest runs with --import-mode=importlib,
# which puts no test folder on sys.path by itself.
for _area in ("cli", "core", "estimate", "runtime", "shared"):
    sys.path.insert(0, str(Path(__file__).parent / _area))

# Property tests run the same examples on every run (CI must be deterministic): the "ci"
# profile derandomizes hypothesis and keeps no example database between runs. To search for
# new counterexamples, run with HYPOTHESIS_PROFILE=explore (random examples).
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The tests' measurements go to a cache of this test process (and the examples it starts),
# never to the user's (~/.cache/memfit): a measurement one test stores must not change what
# another plans, whichever order (or worker) they run in.
# pytest-xdist's workers set COLUMNS=80 and LINES=24; a test sees what a plain `pytest` run
# (and a pipe) has: no terminal size in the environment.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)

_CACHE = tempfile.mkdtemp(prefix="memfit-tests-cache-")
os.environ["MEMFIT_CACHE_DIR"] = _CACHE


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(_CACHE, ignore_errors=True)


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


#: The test files that take longest, longest first: CPU seconds of each on the 2-core VM, the
#: more of its two commands (``pytest -q``, ``pytest -q -m "slow or examples"``; 2026-11-29,
#: docs/benchmarks.md "Test suite time"). pytest-xdist (``--dist loadfile
#: --no-loadscope-reorder``) hands whole files to its processes in collection order; started
#: first, a long file cannot be the one a process runs alone at the end while the other idles
#: (xdist's own order, most tests first, left the examples and the BERT-large runs to the end).
#: Every other file follows in pytest's order. Order only: each test runs and checks the same.
LONGEST_FIRST = (
    "tests/estimate/torch/test_published_truth.py",  # 550
    "tests/examples/test_examples.py",  # 439
    "tests/estimate/torch/test_published_truth_other.py",  # 235
    "tests/estimate/torch/test_gpu_truth_cuda.py",  # 155
    "tests/estimate/xla/test_jax_corpus.py",  # 122
    "tests/estimate/torch/test_published_truth_kernels.py",  # 108
    "tests/integrations/test_integrations_brax.py",  # 54
    "tests/estimate/xla/test_published_truth_jax.py",  # 43
    "tests/integrations/test_integrations_ray.py",  # 42
    "tests/runtime/test_guard_exact_step.py",  # 41
    "tests/estimate/xla/test_xla_gpu_target.py",  # 39
    "tests/estimate/torch/test_fit_allocator_model.py",  # 38
    "tests/integrations/test_integrations_brax_factory.py",  # 30
    "tests/estimate/test_gpu_truth.py",  # 27
    "tests/estimate/xla/test_whole_loop_flashbax.py",  # 26
    "tests/core/test_plan_frontier.py",  # 25
    "tests/runtime/test_autoconfig_distributed.py",  # 25
    "tests/runtime/test_distributed_guard.py",  # 25
    "tests/runtime/test_guard_journal_budget.py",  # 24
    "tests/runtime/test_fit_simulated.py",  # 23
    "tests/estimate/xla/test_jax_h100_truth.py",  # 23
    "tests/test_architecture.py",  # 20
    "tests/estimate/torch/test_trace_ordinary_models.py",  # 19
    "tests/runtime/test_fit_step.py",  # 19
    "tests/integrations/test_integrations_skrl.py",  # 17
    "tests/allocator/test_public_snapshots.py",  # 16
    "tests/cli/test_cli_input_bounds.py",  # 16
    "tests/monitor/test_recorder_sim.py",  # 15
    "tests/test_readme_snippets.py",  # 12
    "tests/api/test_public_arguments.py",  # 11
    "tests/test_docs_outputs.py",  # 11
    "tests/runtime/test_sim_measure.py",  # 10
    "tests/test_doctests.py",  # 10
    "tests/examples/test_examples_rltools.py",  # 10
    "tests/integrations/test_integrations_transformers.py",  # 10
    "tests/monitor/test_explain.py",  # 10
)
_ROOT = Path(__file__).resolve().parents[1]


def _start_rank(item: pytest.Item) -> int:
    """Where ``item``'s file stands in :data:`LONGEST_FIRST` (after all of them if absent)."""
    try:
        path = Path(item.path).resolve().relative_to(_ROOT).as_posix()
    except ValueError:
        return len(LONGEST_FIRST)
    try:
        return LONGEST_FIRST.index(path)
    except ValueError:
        return len(LONGEST_FIRST)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # a stable sort: each file's tests keep their order and stay together
    items.sort(key=_start_rank)
    for item in items:
        if "/tests/gpu/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.gpu)
    if any(item.get_closest_marker("gpu") for item in items) and not _cuda_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_cuda_allocator(request: pytest.FixtureRequest) -> None:
    """Before a ``gpu`` test: the previous tests' cached CUDA segments go back to the driver.

    Tests run in one process; a segment cached by an earlier test (a 40 GB block from an
    out-of-memory test, say) would hold this test's first tensors and defeat a cap on the
    allocator (``simulate_gpu(device="cuda")`` refuses to start over such a segment).
    """
    if request.node.get_closest_marker("gpu") is None or not _cuda_available():
        return
    import gc

    import torch

    gc.collect()
    torch.cuda.empty_cache()


@pytest.fixture(autouse=True)
def _environment_restored() -> Iterator[None]:
    """After each test, the environment as it was before it: memfit.configure, env and the
    allocator settings write variables (XLA's pool fraction, PYTORCH_CUDA_ALLOC_CONF) that
    would change what a later test plans."""
    saved = dict(os.environ)
    yield
    if dict(os.environ) != saved:
        os.environ.clear()
        os.environ.update(saved)
