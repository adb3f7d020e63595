"""memfit: keep ML and RL jobs inside the memory of their GPU.

Plan (``memfit.plan``), estimate (``memfit.estimate_torch`` / ``memfit.estimate_jax``), guard
(``memfit.TrainGuard``), watch (``memfit.Recorder``).

The public names are loaded lazily: ``import memfit`` imports neither torch, jax nor pynvml;
each name's module is imported the first time the name is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from memfit._version import __version__
from memfit.errors import (
    BackendUnavailable,
    ConfigError,
    EstimateError,
    InfeasiblePlan,
    MemfitError,
    OutOfMemory,
)
from memfit.units import format_bytes, parse_bytes

# Public name -> module that defines it. Each module imports its framework lazily or at its
# own top level; nothing here is imported until the name is asked for.
_LAZY: dict[str, str] = {
    # core: catalog, workloads, planning
    "gpu": "memfit.hardware.catalog",
    "GpuSpec": "memfit.hardware.catalog",
    "list_gpus": "memfit.hardware.catalog",
    "load_workload": "memfit.core.workload",
    "Workload": "memfit.core.workload",
    "check": "memfit.core.constraints",
    "Violation": "memfit.core.constraints",
    "plan": "memfit.planning",
    "Plan": "memfit.core.plan",
    "plan_devices": "memfit.planning_devices",
    "MultiPlan": "memfit.planning_devices",
    # runtime: allocator settings, guards
    "configure": "memfit.runtime.allocator_env",
    "autoconfig": "memfit.runtime.autoconfig",
    "AutoConfig": "memfit.runtime.autoconfig",
    "is_oom": "memfit.runtime.oom",
    "TrainGuard": "memfit.runtime.guard",
    "RolloutGuard": "memfit.runtime.guard",
    "clip_grad_norm": "memfit.runtime.guard",
    "simulate_gpu": "memfit.runtime.simulate",
    "measure_simulator": "memfit.runtime.sim_measure",
    # estimate
    "estimate_torch": "memfit.estimate.torch.trace",
    "TorchEstimate": "memfit.estimate.torch.trace",
    "EstimatePoint": "memfit.estimate.torch.trace",
    "estimate_jax": "memfit.estimate.xla.step",
    "JaxEstimate": "memfit.estimate.xla.step",
    # fit
    "fit": "memfit.runtime.fit",
    "FitResult": "memfit.runtime.fit",
    # monitor
    "Recorder": "memfit.monitor.recorder",
    "Leak": "memfit.monitor.recorder",
    # explain a CUDA memory snapshot
    "explain": "memfit.monitor.explain",
    "Explanation": "memfit.monitor.explain",
}

# Public submodules reachable as attributes: memfit.cleanup.every(10), memfit.testing.inject_oom.
_SUBMODULES: dict[str, str] = {
    "cleanup": "memfit.runtime.cleanup",
    "testing": "memfit.testing",
}

__all__ = [
    "AutoConfig",
    "BackendUnavailable",
    "ConfigError",
    "EstimateError",
    "EstimatePoint",
    "Explanation",
    "FitResult",
    "GpuSpec",
    "InfeasiblePlan",
    "JaxEstimate",
    "Leak",
    "MemfitError",
    "MultiPlan",
    "OutOfMemory",
    "Plan",
    "Recorder",
    "RolloutGuard",
    "TorchEstimate",
    "TrainGuard",
    "Violation",
    "Workload",
    "__version__",
    "autoconfig",
    "check",
    "cleanup",
    "clip_grad_norm",
    "configure",
    "estimate_jax",
    "estimate_torch",
    "explain",
    "fit",
    "format_bytes",
    "gpu",
    "is_oom",
    "list_gpus",
    "load_workload",
    "measure_simulator",
    "parse_bytes",
    "plan",
    "plan_devices",
    "simulate_gpu",
    "testing",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(_SUBMODULES[name])
    else:
        raise AttributeError(f"module 'memfit' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from memfit import testing
    from memfit.core.constraints import Violation, check
    from memfit.core.plan import Plan
    from memfit.core.workload import Workload, load_workload
    from memfit.estimate.torch.trace import EstimatePoint, TorchEstimate, estimate_torch
    from memfit.estimate.xla.step import JaxEstimate, estimate_jax
    from memfit.hardware.catalog import GpuSpec, gpu, list_gpus
    from memfit.monitor.explain import Explanation, explain
    from memfit.monitor.recorder import Leak, Recorder
    from memfit.planning import plan
    from memfit.planning_devices import MultiPlan, plan_devices
    from memfit.runtime import cleanup
    from memfit.runtime.allocator_env import configure
    from memfit.runtime.autoconfig import AutoConfig, autoconfig
    from memfit.runtime.fit import FitResult, fit
    from memfit.runtime.guard import RolloutGuard, TrainGuard, clip_grad_norm
    from memfit.runtime.oom import is_oom
    from memfit.runtime.sim_measure import measure_simulator
    from memfit.runtime.simulate import simulate_gpu
