"""Shared test setup.

Hypothesis runs the deterministic ``ci`` profile unless ``HYPOTHESIS_PROFILE`` names another.
Every test under ``tests/gpu/`` is marked ``gpu``; ``gpu`` tests skip themselves where torch has
no CUDA device (this machine and CI), and run on a machine that has one.
"""

from __future__ import annotations

import os
import sys
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
