"""``memfit.plan``: the public planner, from a workload and a GPU to a :class:`Plan`.

This is the adapter around the pure :func:`memfit.core.plan.plan`: it loads the workload
(a path, a bundled name or a :class:`Workload`), resolves the GPU (a catalog name, a size, a
:class:`GpuSpec`, or ``"local"`` for this machine's GPU through :mod:`memfit.backends`), runs
the workload's traced estimator when it names one (:mod:`memfit.estimate.bridge`), and calls
the core planner. Backends and estimators are imported lazily, so planning for a named GPU
imports neither torch, jax nor pynvml.

>>> p = plan("brax_humanoid_ppo@quick", gpu="RTX 4070")
>>> p.fits, p.gpu
(True, 'NVIDIA GeForce RTX 4070')
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from memfit.core.budget import DEFAULT_MARGIN
from memfit.core.catalog import GpuSpec, anonymous_gpu
from memfit.core.catalog import gpu as catalog_gpu
from memfit.core.measured import MeasuredTerms
from memfit.core.plan import Plan, plan_many
from memfit.core.plan import plan as core_plan
from memfit.core.workload import Workload, load_workload
from memfit.errors import BackendUnavailable, ConfigError, InfeasiblePlan
from memfit.units import parse_fraction

__all__ = ["TIER_GPUS", "LocalGpu", "local_gpu", "plan", "plan_tiers", "resolve_gpu"]

#: The GPUs of the tier table (``memfit plan --all-gpus``): laptop to data centre.
TIER_GPUS: tuple[str, ...] = (
    "GTX 1650",
    "RTX 3060",
    "RTX 3070",
    "RTX 4060 Ti",
    "RTX 4070",
    "RTX 4090",
    "T4",
    "L4",
    "A10G",
    "A100 40GB",
    "A100 80GB",
    "H100",
)


class LocalGpu:
    """This machine's GPU as the planner needs it: its spec and what others already use.

    Attributes:
        spec: The GPU (catalog entry when the name is known, else built from the probe).
        other_processes_bytes: Memory in use on the device before the job starts.
        source: Which backend looked.
    """

    def __init__(self, spec: GpuSpec, other_processes_bytes: int, source: str) -> None:
        self.spec = spec
        self.other_processes_bytes = other_processes_bytes
        self.source = source


def local_gpu(index: int = 0) -> LocalGpu:
    """Look at this machine's GPU ``index`` (NVML first, then torch).

    Raises:
        BackendUnavailable: When there is no GPU, no driver, or the device cannot say its
            total memory.
    """
    from memfit.backends import probe_all

    snap = probe_all()
    if not snap.devices:
        raise BackendUnavailable(
            "no local GPU to plan for: " + "; ".join(snap.notes),
            hint='name the GPU instead: --gpu "RTX 4070" or --gpu 12GiB',
        )
    matches = [d for d in snap.devices if d.index == index]
    if not matches:
        raise BackendUnavailable(
            f"no local GPU with index {index} ({len(snap.devices)} found)",
            hint="pick an index that memfit devices lists",
        )
    dev = matches[0]
    if dev.total_bytes is None:
        raise BackendUnavailable(
            f"{dev.name} does not report its total memory ({'; '.join(dev.notes)})",
            hint="name the GPU instead: --gpu NAME or --gpu SIZE",
        )
    try:
        known = catalog_gpu(dev.name)
        arch, cc = known.arch, known.compute_capability or dev.compute_capability
    except ConfigError:
        arch, cc = anonymous_gpu(dev.total_bytes).arch, dev.compute_capability
    spec = GpuSpec(
        name=dev.name,
        total_bytes=dev.total_bytes,
        arch=arch,
        compute_capability=cc,
        source=f"local {snap.source} probe",
    )
    used = dev.device_used_bytes if dev.device_used_bytes is not None else 0
    return LocalGpu(spec, used, snap.source)


def resolve_gpu(gpu: str | int | GpuSpec) -> GpuSpec:
    """A catalog name, a size (``"12GiB"``, bytes) or a spec, as a :class:`GpuSpec`.

    Raises:
        ConfigError: When the name is unknown (with the nearest names) or the size is bad.
    """
    if isinstance(gpu, GpuSpec):
        return gpu
    return catalog_gpu(gpu)


def _measured(workload: Workload, gpu_name: str) -> MeasuredTerms | None:
    if workload.estimator == "analytic":
        return None
    from memfit.estimate.bridge import measure

    try:
        catalog_gpu(gpu_name)
    except ConfigError:
        # a GPU known only by its size (--gpu 8GiB) has no name to look up; the measured
        # (allocated) terms do not depend on it
        return measure(workload, gpu=None)
    return measure(workload, gpu=gpu_name)


def plan(
    workload: Workload | str | Path,
    gpu: str | int | GpuSpec = "local",
    overrides: Mapping[str, int] | None = None,
    margin: float | str = DEFAULT_MARGIN,
    *,
    host_memory_bytes: int | None = None,
    device_index: int = 0,
) -> Plan:
    """The best configuration of a workload on a GPU.

    Args:
        workload: A :class:`Workload`, a path to a workload file, or a bundled name
            (``"dqn_fire_raster"``, ``"brax_humanoid_ppo@quick"``).
        gpu: A catalog name (``"RTX 4070"``), a size (``"12GiB"``, bytes), a
            :class:`GpuSpec`, or ``"local"``: this machine's GPU ``device_index``, with the
            memory other processes already use taken off.
        overrides: Knob values to pin, or settings to change.
        margin: Safety margin, a fraction of the total (``0.1`` or ``"10%"``).
        host_memory_bytes: Host RAM for a replay buffer on the host (default: the workload's).
        device_index: Which local GPU, for ``gpu="local"``.

    Returns:
        The plan (see :class:`memfit.core.plan.Plan`).

    Raises:
        ConfigError: On a bad workload, GPU name, override or margin.
        BackendUnavailable: For ``"local"`` without a GPU.
        InfeasiblePlan: When nothing fits (smallest footprint and breaking term attached).
        EstimateError: When the workload's traced estimator cannot trace its step.
    """
    loaded = load_workload(workload) if not isinstance(workload, Workload) else workload
    fraction = parse_fraction(margin)
    others = 0
    if isinstance(gpu, str) and gpu.strip().lower() == "local":
        local = local_gpu(device_index)
        spec, others = local.spec, local.other_processes_bytes
    else:
        spec = resolve_gpu(gpu)
    return core_plan(
        loaded,
        spec,
        overrides,
        margin=fraction,
        measured=_measured(loaded, spec.name),
        other_processes_bytes=others,
        host_memory_bytes=host_memory_bytes,
    )


def plan_tiers(
    workload: Workload | str | Path,
    gpus: Sequence[str | int | GpuSpec] = TIER_GPUS,
    overrides: Mapping[str, int] | None = None,
    margin: float | str = DEFAULT_MARGIN,
    *,
    host_memory_bytes: int | None = None,
) -> list[Plan | InfeasiblePlan]:
    """The tier table: one plan per GPU (an :class:`InfeasiblePlan` where nothing fits).

    Raises:
        ConfigError: On a bad workload, GPU name, override or margin.
        EstimateError: When the workload's traced estimator cannot trace its step.
    """
    loaded = load_workload(workload) if not isinstance(workload, Workload) else workload
    specs = [resolve_gpu(g) for g in gpus]
    measured = _measured(loaded, specs[0].name) if specs else None
    return plan_many(
        loaded,
        specs,
        overrides,
        margin=parse_fraction(margin),
        measured=measured,
        host_memory_bytes=host_memory_bytes,
    )
