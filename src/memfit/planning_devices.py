"""``memfit.plan_devices``: a workload on several GPUs, planned per device.

``plan_devices(workload, "8xH100")`` plans each device: the workload's own terms for its
share of the work (``devices.strategy``: DDP and pmap keep the model whole on every device,
FSDP shards it), planned on the card less what the collectives need, then NCCL's memory
(:mod:`memfit.hardware.nccl`) and what device 0 alone holds
(:mod:`memfit.core.multi_gpu`), each term with its basis. With DDP and FSDP the knob values
are per process; with pmap they are global (Brax splits environments over the devices).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from memfit._checks import require, require_mapping
from memfit.allocator.xla_fraction import DEFAULT_MARGIN, FRACTION_VARIABLES
from memfit.backends.software import installed_jaxlib
from memfit.core.multi_gpu import (
    DevicePlan,
    DeviceTerm,
    compose,
    devices_terms,
    parse_gpu_count,
)
from memfit.core.plan import Plan
from memfit.core.workload import Workload, load_workload, require_workload
from memfit.errors import ConfigError
from memfit.hardware.catalog import GpuSpec
from memfit.hardware.nccl import NcclEstimate, recommend_tight
from memfit.planning import _target_runtime, plan, resolve_gpu
from memfit.units import format_bytes, parse_fraction

__all__ = ["MultiPlan", "plan_devices"]


@dataclass(frozen=True)
class MultiPlan:
    """A workload planned on ``count`` identical GPUs.

    Attributes:
        gpu: The card's name.
        count: How many.
        topology: ``pcie``, ``nvlink`` or ``nvswitch``.
        strategy: ``ddp``, ``fsdp`` or ``pmap``.
        base: The plan of one device's share, made on the card less the collective terms
            (its knobs are the per-device values).
        terms: The multi-GPU terms, each with its basis and source.
        devices: Per-device plans; device 0 on its own where it holds more.
        nccl: NCCL's estimate (transport, channels, notes).
        environment: The variables to run the job with.
        notes: What a reader needs to know.
    """

    gpu: str
    count: int
    topology: str
    strategy: str
    base: Plan
    terms: list[DeviceTerm]
    devices: list[DevicePlan]
    nccl: NcclEstimate | None
    environment: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        """Whether every device fits."""
        return self.base.fits and all(d.fits for d in self.devices)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (the CLI's ``--json``)."""
        return {
            "gpu": self.gpu,
            "count": self.count,
            "topology": self.topology,
            "strategy": self.strategy,
            "fits": self.fits,
            "knobs": dict(self.base.knobs),
            "terms": [t.to_dict() for t in self.terms],
            "devices": [d.to_dict() for d in self.devices],
            "nccl": None if self.nccl is None else self.nccl.to_dict(),
            "environment": dict(self.environment),
            "notes": list(self.notes),
            "per_device_plan": self.base.to_dict(),
        }


def _with_devices(loaded: Workload, count: int, topology: str | None) -> Workload:
    dev = loaded.devices
    strategy = dev.strategy
    if strategy == "single":
        strategy = "pmap" if loaded.framework == "jax" else "ddp"
    update: dict[str, Any] = {"count": count, "strategy": strategy}
    if topology is not None:
        update["topology"] = topology
    devices = dev.model_copy(update=update)
    return loaded.model_copy(update={"devices": devices})


def target_jaxlib(workload: Workload) -> str | None:
    """The jaxlib a JAX job runs, which decides XLA's NCCL communicators per device group: the
    one its recorded measurements name (``measurements.versions.jaxlib``), else the one
    installed here, else ``None`` (unknown: the current XLA's rule, and the plan's note says
    so). ``None`` for a PyTorch job.

    >>> target_jaxlib(load_workload("dqn_fire_raster")) is None
    True
    """
    if workload.framework != "jax":
        return None
    measured = workload.measurements
    recorded = measured.provenance.versions.get("jaxlib") if measured is not None else None
    return recorded or installed_jaxlib()


def plan_devices(
    workload: Workload | str | Path,
    gpu: str | GpuSpec,
    overrides: Mapping[str, int] | None = None,
    margin: float | str = DEFAULT_MARGIN,
    *,
    count: int | None = None,
    topology: str | None = None,
    measure: str = "auto",
    runtime: Mapping[str, str] | str | None = None,
    progress: Callable[[str], None] | None = None,
) -> MultiPlan:
    """Plan a workload on several GPUs, per device.

    Args:
        workload: As :func:`memfit.plan` takes it; its ``devices:`` block (count, strategy,
            topology, nccl, nccl_env, DDP/FSDP settings) applies.
        gpu: ``"8xH100"``, or a card with ``count`` (or the workload's ``devices.count``).
        overrides: Knob values to pin (per device).
        margin: Safety margin per device.
        count: GPUs, where ``gpu`` has no ``N x`` prefix.
        topology: ``pcie``, ``nvlink`` or ``nvswitch`` (overrides the workload's).
        measure: As :func:`memfit.plan`.
        runtime: As :func:`memfit.plan`.
        progress: As :func:`memfit.plan`.

    Returns:
        The multi-GPU plan.

    Raises:
        ConfigError: On a bad GPU, count, topology or workload.
        InfeasiblePlan: When nothing fits one device.
    """
    require_workload("workload", workload)
    if not isinstance(gpu, GpuSpec):
        require("gpu", gpu, "str", hint='a catalog name with a count ("8xH100")')
    require_mapping("overrides", overrides, values="int", optional=True)
    require("margin", margin, "number", "str")
    require("count", count, "int", optional=True)
    require("topology", topology, "str", optional=True)
    require("measure", measure, "str")
    require("progress", progress, "callable", optional=True)
    name: str | GpuSpec = gpu
    n = count
    if isinstance(gpu, str):
        parsed = parse_gpu_count(gpu)
        if parsed is not None:
            if count is not None and count != parsed[0]:
                raise ConfigError(
                    f"--gpu {gpu!r} says {parsed[0]} GPUs, the count says {count}",
                    key_path="count",
                )
            n, name = parsed
    loaded = load_workload(workload) if not isinstance(workload, Workload) else workload
    n = n if n is not None else loaded.devices.count
    if n < 1:
        raise ConfigError("count must be at least 1", key_path="count")
    if isinstance(name, str) and name.strip().lower() in ("local", "cpu", "host"):
        raise ConfigError(
            "plan several GPUs by catalog name (8xH100)", key_path="gpu", hint="write 8xH100"
        )
    spec = resolve_gpu(name)
    loaded = _with_devices(loaded, n, topology)
    dev = loaded.devices
    fraction = parse_fraction(margin)
    state = loaded.measurements.training_state_bytes if loaded.measurements else 0
    terms, est = devices_terms(
        spec, n, loaded.framework, dev, _target_runtime(loaded, runtime),
        jaxlib=target_jaxlib(loaded), device0_state_bytes=state,
    )  # fmt: skip
    worst = sum(t.bytes for t in terms)
    if worst >= spec.total_bytes:
        raise ConfigError(
            f"the collectives alone take {format_bytes(worst)} of {spec.name}'s "
            f"{format_bytes(spec.total_bytes)}",
            key_path="gpu",
            hint="see memfit's NCCL recommendations (NCCL_NVLS_ENABLE=0, NCCL_MAX_NCHANNELS)",
        )
    shrunk = replace(spec, total_bytes=spec.total_bytes - worst) if worst else spec
    base = plan(
        loaded, shrunk, overrides, fraction, measure=measure, runtime=runtime, progress=progress
    )
    budget = base.budget_bytes + math.floor(worst * (1 - fraction))
    devices = compose(n, base.breakdown, budget, terms)
    environment = dict(base.environment)
    notes = [
        f"knob values are global: pmap splits the environments and batches over the {n} devices"
        if dev.strategy == "pmap"
        else f"knob values are per process; the job runs {n} of them"
    ]
    if base.pool_bytes is not None:
        share = math.floor(base.pool_bytes / spec.total_bytes * 1000) / 1000
        for key in FRACTION_VARIABLES:
            if key in environment:
                environment[key] = f"{share:.3f}"
        notes.append(
            f"JAX's pool is {share:.3f} of the card, leaving NCCL's buffers room outside it"
        )
    if est is not None:
        notes.extend(est.notes)
        tight = recommend_tight(est)
        if tight and not all(d.fits for d in devices):
            notes.append(
                "to shrink NCCL: " + ", ".join(f"{k}={v}" for k, v in sorted(tight.items()))
            )
    topo = est.topology if est is not None else (dev.topology or "pcie")
    return MultiPlan(
        spec.name, n, topo, dev.strategy, base, terms, devices, est, environment, notes
    )
