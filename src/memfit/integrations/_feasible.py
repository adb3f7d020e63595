"""The feasible spaces the sweep integrations draw from, computed once per process."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from memfit.allocator.xla_fraction import DEFAULT_MARGIN
from memfit.core.plan import FeasibleSpace
from memfit.core.workload import Workload, load_workload
from memfit.hardware.catalog import GpuSpec
from memfit.planning import feasible

__all__ = ["space"]

_CACHE_SIZE = 16
_SPACES: OrderedDict[tuple[Any, ...], FeasibleSpace] = OrderedDict()
_LOCK = threading.Lock()  # Optuna's n_jobs runs trials on threads


def _workload_key(workload: Workload | str | Path) -> str:
    if isinstance(workload, Workload):
        return workload.model_dump_json()
    return f"{type(workload).__name__}:{workload}"


def space(
    workload: Workload | str | Path,
    *,
    gpu: str | int | GpuSpec = "local",
    fixed: Mapping[str, int] | None = None,
    margin: float | str = DEFAULT_MARGIN,
    host_memory_bytes: int | None = None,
    device_index: int = 0,
) -> FeasibleSpace:
    """The feasible space the integrations draw from (computed once per process and
    arguments, then cached: a ``"local"`` GPU is read at the first call, a workload file at
    its first use).

    Raises:
        ConfigError, InfeasiblePlan, BackendUnavailable: As :func:`memfit.planning.feasible`.
    """
    gpu_key = gpu if not isinstance(gpu, GpuSpec) else repr(gpu)
    key = (
        _workload_key(workload),
        gpu_key,
        tuple(sorted((fixed or {}).items())),
        str(margin),
        host_memory_bytes,
        device_index,
    )
    with _LOCK:
        found = _SPACES.get(key)
        if found is not None:
            _SPACES.move_to_end(key)
            return found
    loaded = workload if isinstance(workload, Workload) else load_workload(workload)
    found = feasible(
        loaded,
        gpu=gpu,
        fixed=fixed,
        margin=margin,
        host_memory_bytes=host_memory_bytes,
        device_index=device_index,
    )
    with _LOCK:
        _SPACES[key] = found
        while len(_SPACES) > _CACHE_SIZE:
            _SPACES.popitem(last=False)
    return found
