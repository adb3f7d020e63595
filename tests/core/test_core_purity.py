"""``import memfit.core`` (and the lazy top level) must not import torch, jax or pynvml."""

from __future__ import annotations

import json
import subprocess
import sys

_SCRIPT = r"""
import importlib, json, pkgutil, sys
import memfit, memfit.core
import memfit.hardware.catalog, memfit.core.budget, memfit.allocator.model
errors = {}
for info in pkgutil.walk_packages(memfit.core.__path__, "memfit.core."):
    try:
        importlib.import_module(info.name)
    except Exception as exc:
        errors[info.name] = repr(exc)
import memfit.backends, memfit.backends.base, memfit.backends.simulated, memfit.backends.nvml
import memfit.runtime.allocator_env
memfit.gpu("4090")
memfit.backends.SimulatedDevice("8GiB").snapshot()
loaded = sorted(m for m in ("torch", "jax", "jaxlib", "pynvml") if m in sys.modules)
print(json.dumps({"loaded": loaded, "errors": errors}))
"""


def test_core_and_backends_import_no_framework() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["errors"] == {}
    assert result["loaded"] == []
