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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
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
