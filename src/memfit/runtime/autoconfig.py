"""``memfit.autoconfig``: read what this device has free now, plan the rest, return the knobs.

For the case a plan made before launch cannot see: the simulator runs in the same process
(Isaac Lab starts Isaac Sim and its renderer inside the training script), or other jobs
share the card. After the simulator has started, and before the job allocates its own
buffers, a script calls::

    cfg = memfit.autoconfig("act_dual_camera", overrides={"num_envs": env.num_envs})
    batch = cfg.knobs["batch_size"]

:func:`autoconfig` reads the device (the simulated GPU of :func:`memfit.simulate_gpu` or a
probe you pass, for tests and rehearsals; else torch's ``mem_get_info`` once torch has started
CUDA; else JAX's ``memory_stats`` inside its pool once JAX has started on the GPU; else NVML),
takes what is in use now as already spoken for (the simulator's memory with it, so the
workload's ``simulator`` terms are dropped from the plan rather than counted twice; the
process's CUDA context with it once the framework has started), plans the workload against
what is left, and returns the knob values, the plan and the allocator settings, which it
applies with ``apply=True`` when the framework has not started yet (the seed DQN user's
"auto-detect the GPU and apply settings").
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from memfit._checks import require, require_mapping, require_str_list
from memfit.allocator.xla_fraction import DEFAULT_MARGIN, FRACTION_VARIABLES
from memfit.backends.live import Reading
from memfit.core.plan import Plan
from memfit.core.plan import plan_for_gpu as core_plan
from memfit.core.workload import JaxSettings, Workload, load_workload, require_workload
from memfit.errors import BackendUnavailable, ConfigError, InfeasiblePlan
from memfit.hardware.catalog import GpuSpec, anonymous_gpu
from memfit.hardware.catalog import gpu as catalog_gpu
from memfit.units import format_bytes, parse_fraction

__all__ = ["AutoConfig", "DeviceReading", "autoconfig", "read_device"]


@dataclass(frozen=True)
class DeviceReading:
    """What :func:`autoconfig` plans against: one device's memory now, held as the one
    record of memory now (:class:`memfit.backends.live.Reading`), and what the plan must
    know of it.

    Attributes:
        now: The figures (its ``device`` is the device's name).
        source: Who said so: ``"simulated"``, ``"probe"``, ``"torch"``, ``"jax"``, ``"nvml"``
            (``"rank"`` for another rank's reading).
        context_counted: Whether this process's CUDA context is already in the used memory
            (the framework has started, or the device is simulated and has none).
        pool: For JAX: the reading is inside XLA's preallocated pool.
    """

    now: Reading
    source: str
    context_counted: bool
    pool: bool = False

    @property
    def name(self) -> str:
        """The device's name."""
        return self.now.device or self.source

    @property
    def total_bytes(self) -> int:
        """Its total memory: the budget where one is set (a simulated GPU's; for JAX: its
        pool, ``bytes_limit``), else the device's."""
        return self.now.capacity_bytes or 0

    @property
    def free_bytes(self) -> int:
        """What is free now."""
        return self.now.free_bytes or 0


@dataclass(frozen=True)
class AutoConfig:
    """What :func:`autoconfig` decided.

    Attributes:
        knobs: The knob values for the script (the plan's).
        plan: The plan, against what the device had free.
        reading: The device reading it was planned against.
        environment: The allocator settings the plan assumes.
        applied: The settings written to the environment (``apply=True``), else empty.
        notes: What was assumed (terms already running, the context, settings not applied).
        ranks: With ``distributed=True`` under ``torch.distributed``: every rank's reading,
            in rank order (named ``rank N``), else empty.
    """

    knobs: dict[str, int | str]
    plan: Plan
    reading: DeviceReading
    environment: dict[str, str]
    applied: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    ranks: list[DeviceReading] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain data."""
        return {
            "knobs": dict(self.knobs),
            "plan": self.plan.to_dict(),
            "reading": {
                "name": self.reading.name,
                "total_bytes": self.reading.total_bytes,
                "free_bytes": self.reading.free_bytes,
                "source": self.reading.source,
                "context_counted": self.reading.context_counted,
                "pool": self.reading.pool,
            },
            "environment": dict(self.environment),
            "applied": dict(self.applied),
            "notes": list(self.notes),
            "ranks": [
                {
                    "name": r.name,
                    "total_bytes": r.total_bytes,
                    "free_bytes": r.free_bytes,
                    "source": r.source,
                    "context_counted": r.context_counted,
                    "pool": r.pool,
                }
                for r in self.ranks
            ],
        }


def _from_snapshot(probe: Any, device: int, source: str) -> DeviceReading:
    dev, total = probe.snapshot().sized_device(device, by_name_hint="pass probe= or plan by name")
    used = dev.device_used_bytes if dev.device_used_bytes is not None else 0
    free = dev.free_bytes if dev.free_bytes is not None else total - used
    started = _torch_cuda_started() or _jax_gpu_started()
    now = Reading(
        source,
        device=dev.name,
        device_used_bytes=dev.device_used_bytes,
        total_bytes=total,
        free_bytes=free,
    )
    return DeviceReading(now, source, started or source == "probe")


def _torch_cuda_started() -> bool:
    from memfit.runtime.allocator_env import torch_cuda_initialized

    return torch_cuda_initialized()


def _jax_gpu_started() -> bool:
    from memfit.runtime.allocator_env import jax_gpu_started

    return jax_gpu_started()


def read_device(device: int = 0, *, probe: Any | None = None) -> DeviceReading:
    """Read what ``device`` has free now (see the module docstring for the order).

    Args:
        device: The device index.
        probe: A :class:`memfit.backends.base.DeviceProbe` to read instead
            (:class:`memfit.backends.SimulatedDevice` for a rehearsal).

    Raises:
        BackendUnavailable: When nothing can read a device here.
    """
    if probe is not None:
        return _from_snapshot(probe, device, "probe")
    from memfit.backends import live

    sim = live.simulated_gpu()
    if sim is not None:
        now = live.SimulatedReader().read()
        budget = now.budget_bytes if now.budget_bytes is not None else int(sim.budget_bytes)
        free = now.free_bytes if now.free_bytes is not None else budget
        now = replace(now, device=sim.device.name, budget_bytes=budget, free_bytes=free)
        return DeviceReading(now, "simulated", True)
    torch = live.torch_cuda()
    if torch is not None:
        now = live.TorchCudaReader(torch, device).read()
        name = str(torch.cuda.get_device_name(device))
        # What this process can still get: the driver's free memory and its own cache.
        return DeviceReading(replace(now, device=name), "torch", True)
    if _jax_gpu_started():
        jax = sys.modules["jax"]
        dev = jax.devices()[device]
        now = live.JaxReader(dev).read()
        if now.budget_bytes:
            name = str(getattr(dev, "device_kind", "JAX GPU"))
            free = now.free_bytes if now.free_bytes is not None else now.budget_bytes
            return DeviceReading(replace(now, device=name, free_bytes=free), "jax", True, pool=True)
    from memfit.backends import local_probe

    nvml, reasons = local_probe(try_torch=False)
    if nvml is None:
        # The way out goes in the message too: a script that lets the error propagate
        # shows only the message (str(exc)), not the hint.
        raise BackendUnavailable(
            "no device to read: "
            + ("; ".join(reasons) or "no GPU found")
            + "; to rehearse without a GPU, pass "
            "probe=memfit.backends.SimulatedDevice('8GiB') (the card's size)",
            hint="run on the GPU machine, or pass probe=SimulatedDevice('8GiB') to rehearse",
        )
    return _from_snapshot(nvml, device, "nvml")


def _spec_for(reading: DeviceReading) -> GpuSpec:
    try:
        known = catalog_gpu(reading.name)
    except ConfigError:
        known = None
    if known is not None and known.total_bytes == reading.total_bytes:
        return known
    base = anonymous_gpu(reading.total_bytes)
    return replace(
        base,
        name=reading.name,
        arch=known.arch if known is not None else base.arch,
        compute_capability=known.compute_capability if known is not None else None,
        source=f"read now ({reading.source})",
    )


def autoconfig(
    workload: Workload | str | Path,
    *,
    device: int = 0,
    overrides: Mapping[str, int] | None = None,
    margin: float | str = DEFAULT_MARGIN,
    already_running: Sequence[str] = ("simulator", "renderer"),
    probe: Any | None = None,
    apply: bool = False,
    host_memory_bytes: int | None = None,
    distributed: bool = False,
    per_rank: Sequence[str] = (),
) -> AutoConfig:
    """Plan a workload against what this device has free now, and return the knob values.

    Call it after the parts of the job that are already running (a simulator in the same
    process) have started, and before the job allocates its own buffers.

    Args:
        workload: A workload, a path to one, or a bundled name.
        device: The device index.
        overrides: Knob values to pin (the simulator's ``num_envs``, fixed when it started).
        margin: Safety margin, a fraction of the device's total.
        already_running: What is already running and so in the used memory: with
            ``"simulator"`` or ``"renderer"`` here (the default), the workload's
            ``simulator`` terms are left out of the plan; ``()`` keeps them (the simulator
            starts after this call).
        probe: A device probe to read instead of the real device (tests, rehearsals).
        apply: Write the plan's allocator settings into this process's environment when
            the framework has not started on the GPU yet (``memfit.configure``).
        host_memory_bytes: Host RAM for a host-placed replay buffer.
        distributed: Under ``torch.distributed`` (torchrun), plan for every rank's own
            device and agree on knobs every rank can run: each rank reads its device, one
            ``all_reduce`` shares the readings (total, free, context, pool), every rank
            plans the same way for each reading (named ``rank N``, so the planner treats
            them alike on every rank) and takes the plan of the reading with the least free
            memory whose knobs fit every rank's reading. Every rank must call it. A no-op
            when not distributed.
        per_rank: With ``distributed``: knobs each rank then plans for its own device, the
            agreed knobs pinned (Isaac Lab's per-GPU ``num_envs``); they may differ between
            ranks. The rest are the same on every rank.

    Returns:
        The knobs, the plan, the reading, and the settings.

    Raises:
        BackendUnavailable: When no device can be read.
        InfeasiblePlan: When nothing fits what is free (with ``distributed``: on every rank,
            raised on every rank).
        ConfigError: On a bad workload, override or margin, or ``per_rank`` names a knob the
            workload does not have.
    """
    require_workload("workload", workload)
    require("device", device, "int")
    require_mapping("overrides", overrides, values="int", optional=True)
    require("margin", margin, "number", "str")
    require_str_list("already_running", already_running)
    require("apply", apply, "bool")
    require("host_memory_bytes", host_memory_bytes, "size", optional=True)
    require("distributed", distributed, "bool")
    require_str_list("per_rank", per_rank)
    if probe is not None and not callable(getattr(probe, "snapshot", None)):
        require("probe", probe, "callable")  # a DeviceProbe has snapshot()
    loaded = load_workload(workload)
    reading = read_device(device, probe=probe)
    notes: list[str] = [_reading_note(reading)]
    running = tuple(already_running)
    if loaded.simulator is not None and {"simulator", "renderer"} & set(running):
        loaded = loaded.model_copy(update={"simulator": None})
        notes.append(
            "the simulator and its renderer are running: their memory is in the used figure, "
            "so their terms are left out of the plan"
        )
    margin_fraction = parse_fraction(margin)
    unknown = [k for k in per_rank if k not in loaded.knobs]
    if unknown:
        raise ConfigError(
            f"per_rank names {', '.join(map(repr, unknown))}, not a knob of {loaded.name}",
            key_path="per_rank",
            hint="knobs: " + ", ".join(loaded.knobs),
        )
    ranks: list[DeviceReading] = []
    pinned = dict(overrides or {})
    if distributed:
        from memfit.runtime import _distributed

        if _distributed.is_distributed():
            ranks = _rank_readings(reading, _distributed)
            agreed, tightest = _agree(
                loaded, ranks, pinned, margin_fraction, host_memory_bytes, per_rank
            )
            pinned.update(agreed)
            notes.append(
                f"distributed over {len(ranks)} ranks: knobs agreed on the plan for rank "
                f"{tightest} ({format_bytes(ranks[tightest].free_bytes)} free, the least), "
                "which fits every rank"
                + (f"; {', '.join(per_rank)} planned per rank" if per_rank else "")
            )
    if reading.context_counted:
        notes.append(
            "this process's CUDA context is already in the used memory"
            + (
                ""
                if reading.source == "simulated"
                else " (the kernel images its first step loads are counted besides)"
            )
        )
    result = _plan_reading(loaded, reading, pinned, margin_fraction, host_memory_bytes)
    applied: dict[str, str] = {}
    if apply and result.environment:
        from memfit.runtime.allocator_env import configure, torch_cuda_initialized

        env = result.environment
        torch_vars = {k: v for k, v in env.items() if k.startswith("PYTORCH")}
        jax_vars = {k: v for k, v in env.items() if k.startswith("XLA")}
        if torch_vars and torch_cuda_initialized():
            notes.append("torch has already started CUDA: its allocator settings were not applied")
        elif torch_vars:
            conf = next(iter(torch_vars.values()))
            applied.update(configure(expandable_segments="expandable_segments:True" in conf))
        if jax_vars and _jax_gpu_started():
            notes.append("JAX has already started on the GPU: XLA settings were not applied")
        elif jax_vars:
            fraction = next((jax_vars[k] for k in FRACTION_VARIABLES if k in jax_vars), None)
            applied.update(
                configure(
                    jax_preallocate=jax_vars.get("XLA_PYTHON_CLIENT_PREALLOCATE") != "false",
                    jax_mem_fraction=float(fraction) if fraction else None,
                )
            )
    return AutoConfig(
        knobs=dict(result.knobs),
        plan=result,
        reading=reading,
        environment=dict(result.environment),
        applied=applied,
        notes=notes,
        ranks=ranks,
    )


def _reading_note(reading: DeviceReading) -> str:
    return (
        f"{reading.name}: {format_bytes(reading.free_bytes)} free of "
        f"{format_bytes(reading.total_bytes)} now ({reading.source}"
        + (", inside XLA's pool" if reading.pool else "")
        + ")"
    )


def _plan_reading(
    loaded: Workload,
    reading: DeviceReading,
    overrides: Mapping[str, int],
    margin: float,
    host_memory_bytes: int | None,
) -> Plan:
    """The plan against what ``reading`` has free (its context counted when it says so)."""
    if reading.pool:
        loaded = loaded.model_copy(update={"jax": JaxSettings(preallocate=False)})
    return core_plan(
        loaded,
        _spec_for(reading),
        overrides or None,
        margin=margin,
        other_processes_bytes=max(0, reading.total_bytes - reading.free_bytes),
        host_memory_bytes=host_memory_bytes,
        context_bytes=_uncounted_context(reading) if reading.context_counted else None,
    )


def _uncounted_context(reading: DeviceReading) -> int:
    """What the context will still grow by when the reading already counts it: the kernel
    images the step loads at first use with lazy loading
    (:data:`memfit.hardware.runtime.LAZY_KERNEL_IMAGES_BYTES`), as a context read before the
    first step has not loaded them; none on a simulated device, which has no context."""
    if reading.source == "simulated":
        return 0
    from memfit.hardware.runtime import cuda_context

    return cuda_context(_spec_for(reading)).kernel_images_bytes


def _rank_readings(reading: DeviceReading, dist: Any) -> list[DeviceReading]:
    """Every rank's reading (one all-reduce), each named ``rank N`` so that every rank
    plans them alike (a name only this rank knows would change its catalog lookup)."""
    own = [
        reading.total_bytes,
        reading.free_bytes,
        int(reading.context_counted),
        int(reading.pool),
    ]
    return [
        DeviceReading(_rank_figures(r, total, free, bool(pool)), "rank", bool(counted), bool(pool))
        for r, (total, free, counted, pool) in enumerate(dist.gather_ints(own))
    ]


def _rank_figures(rank: int, total: int, free: int, pool: bool) -> Reading:
    """Another rank's figures as they came through the all-reduce (a pool is a budget)."""
    if pool:
        return Reading("rank", device=f"rank {rank}", budget_bytes=total, free_bytes=free)
    return Reading("rank", device=f"rank {rank}", total_bytes=total, free_bytes=free)


def _agree(
    loaded: Workload,
    ranks: Sequence[DeviceReading],
    overrides: Mapping[str, int],
    margin: float,
    host_memory_bytes: int | None,
    per_rank: Sequence[str],
) -> tuple[dict[str, int], int]:
    """The knobs every rank runs (all but ``per_rank``) and the rank whose plan gave them.

    Deterministic in its inputs, which every rank holds alike, so every rank decides the
    same without another collective. The readings are tried from the least free memory up;
    the first plan whose shared knobs fit every reading wins (with memory non-decreasing in
    every knob, that is the tightest rank's own plan).

    Raises:
        InfeasiblePlan: On every rank, when a rank fits nothing, or no rank's knobs fit all.
    """
    order = sorted(range(len(ranks)), key=lambda r: (ranks[r].free_bytes, r))
    plans: dict[int, Plan] = {}
    for r in order:
        try:
            plans[r] = _plan_reading(loaded, ranks[r], overrides, margin, host_memory_bytes)
        except InfeasiblePlan as exc:
            exc.message = f"rank {r}: {exc.message}"
            exc.args = (exc.message,)
            raise
    for r in order:
        shared = {
            k: int(v)
            for k, v in plans[r].knobs.items()
            if k in loaded.knobs and k not in per_rank and isinstance(v, int)
        }
        pins = {**overrides, **shared}
        if all(_fits(loaded, ranks[o], pins, margin, host_memory_bytes) for o in order):
            return shared, r
    raise InfeasiblePlan(
        "no rank's knobs fit every rank's device: plan each rank apart, or pin the knobs "
        "with overrides=",
        smallest_bytes=None,
        budget_bytes=min(p.budget_bytes for p in plans.values()),
        binding_term=None,
        hint="give the ranks cards of one size, or pin the knobs that differ",
    )


def _fits(
    loaded: Workload,
    reading: DeviceReading,
    pins: Mapping[str, int],
    margin: float,
    host_memory_bytes: int | None,
) -> bool:
    try:
        return _plan_reading(loaded, reading, pins, margin, host_memory_bytes).fits
    except InfeasiblePlan:
        return False
