"""``memfit.plan``: the public planner, from a workload and a GPU to a :class:`Plan`.

This is the adapter around the pure :func:`memfit.core.plan.plan_for_gpu`: it loads the workload
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

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from memfit._checks import require, require_iterable, require_mapping
from memfit.allocator.xla_fraction import DEFAULT_MARGIN
from memfit.backends.software import target_runtime
from memfit.core.evaluate import family_for
from memfit.core.measured import MeasuredTerms
from memfit.core.plan import FeasibleSpace, Plan, plan_many
from memfit.core.plan import feasible_space as core_feasible
from memfit.core.plan import plan_for_gpu as core_plan
from memfit.core.workload import Workload, load_workload, require_workload
from memfit.errors import BackendUnavailable, ConfigError, InfeasiblePlan
from memfit.hardware.catalog import GpuSpec, anonymous_gpu, host_device
from memfit.hardware.catalog import gpu as catalog_gpu
from memfit.hardware.runtime import Runtime, parse_runtime
from memfit.units import format_bytes, parse_fraction, require_size

__all__ = [
    "HOST_NAMES",
    "TIER_GPUS",
    "FeasibleSpace",
    "LocalGpu",
    "check_plan_arguments",
    "feasible",
    "host_memory",
    "host_reserve",
    "local_gpu",
    "plan",
    "plan_tiers",
    "resolve_gpu",
    "with_measurements",
]

#: The cards of the tier table (``memfit plan --all-gpus``), by memory: 4 GB cards (a
#: desktop and a laptop one), then every consumer card of the 8, 12, 16 and 24 GB tiers with
#: the common 8 GB laptop cards, then data-centre cards.
_TIER_NAMES: tuple[str, ...] = (
    "GTX 1650",
    "RTX 3050 Laptop",
    "RTX 3070 Laptop",
    "RTX 4060 Laptop",
    "RTX 3060 Ti",
    "RTX 3070",
    "RTX 4060 Ti 8GB",
    "RTX 3080",
    "RTX 5070",
    "RTX 4070",
    "RTX 4070 SUPER",
    "RTX 4070 Ti",
    "RTX 3060",
    "RTX 3080 Ti",
    "T4",
    "RTX 5070 Ti",
    "RTX 5080",
    "RTX 4080",
    "RTX 4080 SUPER",
    "RTX 4070 Ti SUPER",
    "RTX 4060 Ti 16GB",
    "A10G",
    "L4",
    "RTX 4090",
    "RTX 3090",
    "RTX 5090",
    "A100 40GB",
    "A100 80GB",
    "H100",
)

#: The tier table's GPUs as catalog names, sorted by total memory (then name).
TIER_GPUS: tuple[str, ...] = tuple(
    spec.name
    for spec in sorted((catalog_gpu(n) for n in _TIER_NAMES), key=lambda g: (g.total_bytes, g.name))
)

#: ``--gpu`` values that mean the host: the job trains on the CPU, in host RAM.
HOST_NAMES: tuple[str, ...] = ("cpu", "host")


def _meminfo() -> dict[str, int]:
    """``/proc/meminfo`` in bytes, empty where there is none (not Linux)."""
    fields: dict[str, int] = {}
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if parts and parts[0].isdigit():
                    fields[key] = int(parts[0]) * 1024
    except OSError:
        return {}
    return fields


def host_memory() -> tuple[int, int] | None:
    """This machine's RAM as ``(total, available now)`` in bytes, or ``None`` where the
    operating system does not say (``/proc/meminfo``, else ``os.sysconf``)."""
    fields = _meminfo()
    if "MemTotal" in fields:
        return fields["MemTotal"], fields.get("MemAvailable", fields["MemTotal"])
    try:
        total = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, OSError, ValueError):
        return None
    return total, total


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
    dev, total = snap.sized_device(
        index, by_name_hint='name the GPU instead: --gpu "RTX 4070" or --gpu 12GiB'
    )
    try:
        known = catalog_gpu(dev.name)
        arch, cc = known.arch, known.compute_capability or dev.compute_capability
    except ConfigError:
        arch, cc = anonymous_gpu(total).arch, dev.compute_capability
    spec = GpuSpec(
        name=dev.name,
        total_bytes=total,
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


#: The ways ``plan`` may get a Brax workload's measurements (``measure=``).
MEASURE_MODES: tuple[str, ...] = ("auto", "fresh", "recorded")


def with_measurements(
    workload: Workload,
    measure: str = "auto",
    progress: Callable[[str], None] | None = None,
    gpu: str | None = None,
) -> tuple[Workload, list[str]]:
    """The workload with the measurements its environment needs (``env: brax:...``), and
    notes saying where they come from
    (:func:`memfit.integrations.brax.resolve_measurements`: ``auto``, ``fresh`` or
    ``recorded``); a workload without ``env`` as it is.

    Raises:
        ConfigError: When the mode is unknown or no measurement is available.
        BackendUnavailable: For ``fresh`` without brax or jax.
        EstimateError: When measuring fails.
    """
    if measure not in MEASURE_MODES:  # also for a workload that measures nothing
        raise ConfigError(
            f"unknown measurement mode {measure!r}: measure must be one of "
            + ", ".join(MEASURE_MODES),
            key_path="measure",
            hint="auto: the best measurement at hand; fresh: measure now; recorded: only "
            "the workload's recorded measurements",
        )
    if workload.env is None:
        return workload, []
    from memfit.estimate.brax_measure import resolve_measurements

    resolved, notes = resolve_measurements(workload, measure, progress=progress, gpu=gpu)
    if resolved.measurements is not None and resolved.framework == "jax":
        notes = [
            *notes,
            "Brax's figure: its compiled training step and env step (measured) replayed "
            "through JAX's BFC allocator over Brax's training loop (training epochs, each "
            "followed by an evaluation with its own env state): terms eval_env_state and "
            "allocator_loop (basis: replayed)",
        ]
    return resolved, notes


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


def _host_check(
    workload: Workload, host_memory_bytes: int | None, gpu: GpuSpec
) -> tuple[int | None, list[str]]:
    """Host RAM to check a host-placed buffer against: the caller's, the workload's, else
    this machine's total RAM (said in a note where the plan places state there; where it
    does not, the figure still bounds the "would fit" hints that move state to the host).

    The total, not what is free at this instant: the same command on the same machine gives
    the same plan (:func:`host_ram_warning` says when less is free now)."""
    if host_memory_bytes is not None or workload.host_memory_bytes is not None:
        return host_memory_bytes, []
    family = family_for(workload)
    if gpu.is_host or gpu.unified_memory or family.placement is None:
        return None, []  # no host RAM apart from the device's memory
    on_gpu = family.placement_of(workload) == "gpu"
    here = host_memory()
    if here is None:
        if on_gpu:
            return None, []
        return None, ["host RAM not checked: pass --host-memory (this OS does not say its RAM)"]
    total, _available = here
    if on_gpu:
        return total, []
    return total, [
        f"host RAM: this machine's {format_bytes(total)} in all; pass --host-memory SIZE to "
        "plan for another machine, or --host-memory available for what is free now"
    ]


#: The host RAM a training process holds before its own state, on a GPU: pytorch#113326
#: (torch 2.2.0+cu118, RTX 3090, lazy module loading): 2,056,600 kB maximum RSS
#: (``/usr/bin/time -v``) once CUDA is initialised and one tensor is on the device. No JAX
#: figure was found; this one stands for it.
PROCESS_BASELINE_GPU_BYTES = 2_056_600 * 1024
#: On the CPU: the framework imported, measured on the development VM (2026-11-29, CPU
#: builds): torch 2.13.0+cpu 227 MiB, jax 0.10.2 with one array 238 MiB (maximum RSS).
PROCESS_BASELINE_CPU_BYTES = 238 * 2**20
#: A reserve for the operating system: assumed (not measured), a desktop or server's idle
#: use.
OS_RESERVE_BYTES = 2**30


def host_reserve(on_gpu: bool = True) -> dict[str, int]:
    """Host RAM that is not the job's state's, by name: the process's own baseline (a GPU
    process with CUDA initialised, or the framework on the CPU) and a reserve for the OS.
    A simulator in the process holds more (not counted: no published figure).

    >>> sorted(host_reserve())
    ['OS reserve (assumed)', 'the process baseline (published reading)']
    """
    if on_gpu:
        return {
            "the process baseline (published reading)": PROCESS_BASELINE_GPU_BYTES,
            "OS reserve (assumed)": OS_RESERVE_BYTES,
        }
    return {
        "the process baseline (measured here)": PROCESS_BASELINE_CPU_BYTES,
        "OS reserve (assumed)": OS_RESERVE_BYTES,
    }


def _reserve_outside(reserve: dict[str, int], notes: list[str]) -> int:
    """Count ``reserve`` as memory other processes hold (the device is the host's RAM, or
    shares it), with a note naming each part."""
    notes.append(
        "not the job's, counted as other processes: "
        + ", ".join(f"{name}: {format_bytes(n)}" for name, n in reserve.items())
    )
    return sum(reserve.values())


def host_ram_warning(need_bytes: int) -> str | None:
    """A warning when a plan made against this machine's total RAM takes more host RAM than
    is free now (other processes hold the rest); ``None`` otherwise."""
    here = host_memory()
    if here is None or not need_bytes:
        return None
    total, available = here
    if need_bytes <= available:
        return None
    return (
        f"warning: the plan takes {format_bytes(need_bytes)} of host RAM, more than the "
        f"{format_bytes(available)} free now (of {format_bytes(total)}): other processes "
        "hold the rest; close some before the run, or plan with --host-memory available"
    )


def plan(
    workload: Workload | str | Path,
    gpu: str | int | GpuSpec = "local",
    overrides: Mapping[str, int] | None = None,
    margin: float | str = DEFAULT_MARGIN,
    *,
    host_memory_bytes: int | None = None,
    device_index: int = 0,
    measure: str = "auto",
    runtime: Mapping[str, str] | str | None = None,
    progress: Callable[[str], None] | None = None,
) -> Plan:
    """The best configuration of a workload on a GPU.

    Args:
        workload: A :class:`Workload`, a path to a workload file, or a bundled name
            (``"dqn_fire_raster"``, ``"brax_humanoid_ppo@quick"``).
        gpu: A catalog name (``"RTX 4070"``), a size (``"12GiB"``, bytes), a
            :class:`GpuSpec`, ``"local"``: this machine's GPU ``device_index``, with the
            memory other processes already use taken off, or ``"cpu"``: this machine's host
            RAM (or ``host_memory_bytes``), for a job that trains on the CPU.
        overrides: Knob values to pin, or settings to change.
        margin: Safety margin, a fraction of the total (``0.1`` or ``"10%"``).
        host_memory_bytes: Host RAM for a replay buffer on the host (default: the workload's,
            else this machine's total RAM, so that a plan does not follow what is free at
            this instant; a note warns when less is free now); with ``gpu="cpu"``, the RAM
            to plan for. :func:`host_memory` gives this machine's total and free RAM.
        device_index: Which local GPU, for ``gpu="local"``.
        measure: For a workload that names its environment (``env: brax:humanoid``): use
            the best measurement at hand (``"auto"``), measure now (``"fresh"``), or only the
            measurements recorded in the workload (``"recorded"``); see
            :func:`with_measurements`. For a workload with a ``simulator:``, ``"auto"`` and
            ``"fresh"`` also use the measurement :func:`memfit.measure_simulator` stored for
            this card (a simulator is measured inside its own process, never here).
        runtime: The target's software, which sizes the CUDA context:
            ``{"torch": "1.10.0", "cuda": "11.2", "driver": "460.91.03",
            "module_loading": "eager"}`` (every key optional) or the same as
            ``"torch=1.10.0,cuda=11.2"``; ``None``: this machine's torch and its default
            loading mode (:func:`memfit.backends.software.target_runtime`).
        progress: Called with a short sentence as a long stage starts (measuring a Brax
            env takes minutes), for a status line; ``None``: silent.

    Returns:
        The plan (see :class:`memfit.core.plan.Plan`); its ``context`` says what the CUDA
        context term assumed.

    Raises:
        ConfigError: On a bad workload, GPU name, override or margin.
        BackendUnavailable: For ``"local"`` without a GPU, or ``"cpu"`` where the OS does not
            say its RAM and none is given.
        InfeasiblePlan: When nothing fits (smallest footprint and breaking term attached).
        EstimateError: When the workload's traced estimator cannot trace its step.
    """
    host_memory_bytes = check_plan_arguments(
        workload,
        gpu=gpu,
        pins=("overrides", overrides),
        margin=margin,
        host_memory_bytes=host_memory_bytes,
        device_index=device_index,
        measure=measure,
        progress=progress,
    )
    loaded = load_workload(workload) if not isinstance(workload, Workload) else workload
    target = _target_runtime(loaded, runtime)
    loaded, notes = with_measurements(
        loaded, measure, progress, gpu=gpu.name if isinstance(gpu, GpuSpec) else str(gpu)
    )
    fraction = parse_fraction(margin)
    others = 0
    if isinstance(gpu, str) and gpu.strip().lower() == "local":
        local = local_gpu(device_index)
        spec, others = local.spec, local.other_processes_bytes
    elif isinstance(gpu, str) and gpu.strip().lower() in HOST_NAMES:
        given = host_memory_bytes if host_memory_bytes is not None else loaded.host_memory_bytes
        where = "--host-memory" if host_memory_bytes is not None else "host_memory_bytes"
        spec, others, host_notes = _host_spec(given, where)
        others += _reserve_outside(host_reserve(on_gpu=False), notes)
        notes.extend(host_notes)
    else:
        spec = resolve_gpu(gpu)
        if spec.unified_memory:  # the OS and the process take the same memory as the job
            others += _reserve_outside(host_reserve(on_gpu=True), notes)
    if loaded.simulator is not None and not spec.is_host:
        from memfit.runtime.sim_measure import with_simulator_measurement

        loaded, sim_notes = with_simulator_measurement(loaded, spec.name, measure)
        notes.extend(sim_notes)
    host, check_notes = _host_check(loaded, host_memory_bytes, spec)
    machine_total = host_memory_bytes is None and (
        spec.is_host or (host is not None and loaded.host_memory_bytes is None)
    )
    result = core_plan(
        loaded,
        spec,
        overrides,
        margin=fraction,
        measured=_measured(loaded, spec.name),
        other_processes_bytes=others,
        host_memory_bytes=host,
        runtime=target,
        host_reserve=None if spec.is_host else host_reserve(on_gpu=True),
    )
    if spec.is_host:  # the host's RAM is the device: a fitted file records it
        result = replace(result, host_memory_bytes=spec.total_bytes)
        machine_total = machine_total and loaded.host_memory_bytes is None
    need = result.predicted_bytes if spec.is_host else result.host_bytes
    warning = host_ram_warning(need) if machine_total and result.fits else None
    return replace(
        result, notes=[*notes, *check_notes, *result.notes, *([warning] if warning else [])]
    )


def check_plan_arguments(
    workload: object,
    *,
    gpu: object = "local",
    pins: tuple[str, object] = ("overrides", None),
    margin: object = DEFAULT_MARGIN,
    host_memory_bytes: object = None,
    device_index: object = 0,
    measure: object = "auto",
    progress: object = None,
) -> int | None:
    """The one check of the planner's arguments, for :func:`plan`, :func:`plan_tiers`,
    :func:`feasible` and the integrations that plan (Optuna, Ray): each a
    :class:`~memfit.errors.ConfigError` naming the argument.

    Args:
        pins: The name the caller gives its pinned values (``overrides``, ``fixed``) and
            them: a mapping of names to integers.

    Returns:
        ``host_memory_bytes`` as bytes (a text size such as ``"16GiB"`` read).

    Raises:
        ConfigError: Naming the first argument of the wrong type or value.
    """
    require_workload("workload", workload)
    if not isinstance(gpu, GpuSpec):
        require("gpu", gpu, "str", "int", hint='a catalog name ("RTX 4070"), a size, or "local"')
    require_mapping(pins[0], pins[1], values="int", optional=True)
    require("margin", margin, "number", "str")
    host = require_size("host_memory_bytes", host_memory_bytes, optional=True)
    require("device_index", device_index, "int")
    require("measure", measure, "str")
    require("progress", progress, "callable", optional=True)
    return host


def _target_runtime(workload: Workload, runtime: Mapping[str, str] | str | None) -> Runtime:
    """The target's runtime: as given; by default this machine's torch for a PyTorch job, and
    nothing assumed of versions for a JAX job (JAX brings its own CUDA libraries, whatever
    torch is installed here)."""
    if runtime is None and workload.framework == "jax":
        return parse_runtime(None)
    return target_runtime(runtime)


def _host_spec(
    host_memory_bytes: int | None, where: str = "--host-memory"
) -> tuple[GpuSpec, int, list[str]]:
    """The host as the device (``--gpu cpu``): the given RAM, else this machine's total (the
    same plan on every run; :func:`host_ram_warning` says when less is free now)."""
    if host_memory_bytes is not None:
        return (
            host_device(host_memory_bytes, source=where),
            0,
            [f"the host: {format_bytes(host_memory_bytes)} of RAM ({where})"],
        )
    here = host_memory()
    if here is None:
        raise BackendUnavailable(
            "this operating system does not say how much RAM it has",
            hint="give it: --gpu cpu --host-memory 16GiB",
        )
    total, _available = here
    return (
        host_device(total, source="this machine's RAM (/proc/meminfo)"),
        0,
        [
            f"the host: this machine's {format_bytes(total)} of RAM in all; --host-memory "
            "available plans for what is free now"
        ],
    )


def plan_tiers(
    workload: Workload | str | Path,
    gpus: Sequence[str | int | GpuSpec] = TIER_GPUS,
    overrides: Mapping[str, int] | None = None,
    margin: float | str = DEFAULT_MARGIN,
    *,
    host_memory_bytes: int | None = None,
    measure: str = "auto",
    runtime: Mapping[str, str] | str | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[Plan | InfeasiblePlan]:
    """The tier table: one plan per GPU (an :class:`InfeasiblePlan` where nothing fits).

    ``runtime`` is the target's software, as for :func:`plan`.

    Raises:
        ConfigError: On a bad workload, GPU name, override or margin.
        EstimateError: When the workload's traced estimator cannot trace its step.
    """
    host_memory_bytes = check_plan_arguments(
        workload,
        pins=("overrides", overrides),
        margin=margin,
        host_memory_bytes=host_memory_bytes,
        measure=measure,
        progress=progress,
    )
    for i, item in enumerate(require_iterable("gpus", gpus)):
        if not isinstance(item, GpuSpec):
            require(f"gpus[{i}]", item, "str", "int")
    loaded = load_workload(workload) if not isinstance(workload, Workload) else workload
    target = _target_runtime(loaded, runtime)
    loaded, notes = with_measurements(loaded, measure, progress)
    specs = [resolve_gpu(g) for g in gpus]
    measured = _measured(loaded, specs[0].name) if specs else None
    host, host_notes = (None, []) if not specs else _host_check(loaded, host_memory_bytes, specs[0])
    host_notes = [*notes, *host_notes]
    results = plan_many(
        loaded,
        specs,
        overrides,
        margin=parse_fraction(margin),
        measured=measured,
        host_memory_bytes=host,
        runtime=target,
        host_reserve=host_reserve(on_gpu=True),
    )
    return [r if isinstance(r, InfeasiblePlan) else replace(r, notes=[*host_notes, *r.notes])
            for r in results]  # fmt: skip


def feasible(
    workload: Workload | str | Path,
    gpu: str | int | GpuSpec = "local",
    fixed: Mapping[str, int] | None = None,
    margin: float | str = DEFAULT_MARGIN,
    *,
    host_memory_bytes: int | None = None,
    device_index: int = 0,
    measure: str = "auto",
    runtime: Mapping[str, str] | str | None = None,
) -> FeasibleSpace:
    """Every configuration of a workload that keeps its rules and fits a GPU: what a sweep
    may draw from (:mod:`memfit.integrations.optuna`, :mod:`memfit.integrations.ray`).

    The GPU, the margin and the measurements are resolved as :func:`plan` resolves them, and
    the configurations are the ones :func:`plan` chooses among, so the best of them by the
    workload's objective is the plan's.

    Args:
        workload: A :class:`Workload`, a path, or a bundled name.
        gpu: As :func:`plan`: a catalog name, a size, a :class:`GpuSpec`, ``"local"`` or
            ``"cpu"``.
        fixed: Knob values to pin (they stay as given) or settings to change.
        margin: Safety margin, a fraction of the total.
        host_memory_bytes: As :func:`plan`.
        device_index: Which local GPU, for ``gpu="local"``.
        measure: As :func:`plan`.
        runtime: The target's software, as :func:`plan` (it sizes the CUDA context).

    Returns:
        The :class:`FeasibleSpace`.

    Raises:
        ConfigError: On a bad workload, GPU name, pinned value or margin.
        BackendUnavailable: For ``"local"`` without a GPU.
        InfeasiblePlan: When no configuration fits.
        EstimateError: When the workload's traced estimator cannot trace its step.

    >>> space = feasible("dqn_fire_raster@device_replay", gpu="3.68GiB")
    >>> space.order, len(space) > 1, max(space.predicted_bytes) <= space.budget_bytes
    (('buffer_size',), True, True)
    """
    host_memory_bytes = check_plan_arguments(
        workload,
        gpu=gpu,
        pins=("fixed", fixed),
        margin=margin,
        host_memory_bytes=host_memory_bytes,
        device_index=device_index,
        measure=measure,
    )
    loaded = load_workload(workload) if not isinstance(workload, Workload) else workload
    target = _target_runtime(loaded, runtime)
    loaded, _ = with_measurements(loaded, measure)
    others = 0
    if isinstance(gpu, str) and gpu.strip().lower() == "local":
        local = local_gpu(device_index)
        spec, others = local.spec, local.other_processes_bytes
    elif isinstance(gpu, str) and gpu.strip().lower() in HOST_NAMES:
        spec, others, _ = _host_spec(host_memory_bytes)
        others += _reserve_outside(host_reserve(on_gpu=False), [])
    else:
        spec = resolve_gpu(gpu)
        if spec.unified_memory:
            others += _reserve_outside(host_reserve(on_gpu=True), [])
    host, _ = _host_check(loaded, host_memory_bytes, spec)
    return core_feasible(
        loaded,
        spec,
        fixed,
        margin=parse_fraction(margin),
        measured=_measured(loaded, spec.name),
        other_processes_bytes=others,
        host_memory_bytes=host,
        runtime=target,
        host_reserve=None if spec.is_host else host_reserve(on_gpu=True),
    )
