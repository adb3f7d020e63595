"""What a job on several GPUs adds to each device, and to device 0: pure formulas.

A job on ``N`` GPUs holds, per device, what one device holds with its share of the work (the
family terms, with ``devices.strategy`` sharding or splitting them: DDP's gradient buckets,
FSDP's shards and gathered buffers, pmap's share of the environments), plus memory outside
the framework's allocator that only a multi-GPU job has:

* NCCL's communicator on every device (:func:`memfit.hardware.nccl.nccl_memory`): channel
  buffers, NVLS on NVSwitch systems, point-to-point buffers;
* on device 0 only: a CUDA context for each other process that touches CUDA before calling
  ``torch.cuda.set_device(local_rank)`` (pytorch/pytorch#49481: 871 MiB per other process
  on device 0; pytorch/examples#1142 adds the call), sized by what started it
  (:func:`stray_context`), plus what such a process allocates there (``devices.stray_bytes``:
  a checkpoint ``torch.load`` puts back on ``cuda:0`` without ``map_location``); and for
  JAX, arrays a single-controller program leaves on its default device (the unreplicated
  training state Brax builds before ``jax.device_put_replicated``).

:func:`device_terms` gives those terms with their basis; :func:`compose` adds them to a
single-device plan's breakdown, device by device.

>>> parse_gpu_count("8xH100")
(8, 'H100')
>>> parse_gpu_count("RTX 4090") is None
True
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from memfit._checks import parse_int
from memfit.errors import ConfigError
from memfit.hardware.catalog import GpuSpec
from memfit.hardware.nccl import NcclEstimate, largest_nccl_memory, nccl_memory
from memfit.hardware.rules import rule
from memfit.hardware.runtime import Runtime, cuda_context, parse_version, runtime_from_versions

if TYPE_CHECKING:
    from memfit.core._workload_schema import DeviceSpec

__all__ = [
    "DevicePlan",
    "DeviceTerm",
    "compose",
    "default_communicators",
    "default_topology",
    "device_terms",
    "devices_terms",
    "form_factor",
    "parse_gpu_count",
    "stray_context",
]

#: What first started CUDA in a process that leaves a context on device 0
#: (``devices.stray_init``): see :func:`stray_context`.
STRAY_INITS = ("unknown", "nccl", "torch")
#: The caching allocator's rounding of a large block (``kRoundLarge``, 2 MiB).
_SEGMENT_BYTES = 2 * 2**20
_STRAY_SOURCE = (
    "pytorch/pytorch#49481 (871 MiB per other process on GPU 0), #98763 (torch 2.0: "
    "barrier() without set_device, about 900 MB per process on GPU 0 of 8 x V100), "
    "pytorch/examples#1142 (call torch.cuda.set_device(local_rank) first); the loading mode: "
    "aten/src/ATen/cuda/detail/CUDAHooks.cpp (initCUDA sets CUDA_MODULE_LOADING=LAZY when "
    "unset), ProcessGroupNCCL.cpp (its constructor checks at::cuda::getNumGPUs() first), "
    "pytorch/pytorch#85692 (the variable must be set before CUDA starts), #113326 "
    "(cudaGetDeviceCount before the first tensor: the eager host footprint)"
)

_COUNT_RE = re.compile(r"^\s*(\d{1,4})\s*[xX\u00d7]\s*(\S.*)$")
#: The most GPUs a plan takes (one NCCL communicator of up to this many ranks).
MAX_COUNT = 4096


def parse_gpu_count(text: str) -> tuple[int, str] | None:
    """``"8xH100"`` -> ``(8, "H100")``; ``None`` for a GPU without a count.

    Raises:
        ConfigError: For a count of 0 or more than 4096.
    """
    match = _COUNT_RE.match(text)
    if match is None:
        return None
    count = parse_int("--gpu", match.group(1), lo=1, hi=MAX_COUNT, hint="write 8xH100")
    return count, match.group(2).strip()


def form_factor(spec: GpuSpec) -> str | None:
    """The card's form factor as memfit's catalog names it: ``"sxm"`` (a module on an HGX/DGX
    baseboard), ``"pcie"`` (a PCIe card, NVL cards included), or ``None`` where the catalog
    does not say.

    The NVML name says it for most (``Tesla V100-SXM2-16GB``, ``NVIDIA A100-SXM4-80GB``,
    ``NVIDIA H100 PCIe``, ``NVIDIA H200 NVL``); where it does not, an alias of the entry does
    (``"h100 sxm"`` for ``NVIDIA H100 80GB HBM3``, ``"h200 sxm"`` for ``NVIDIA H200``). An alias
    that names the other form factor (``"v100-pcie-16gb"`` resolves to the SXM2 entry) is not
    read: the name decides first.

    >>> from memfit.hardware.catalog import gpu
    >>> form_factor(gpu("V100")), form_factor(gpu("H100")), form_factor(gpu("H100 PCIe"))
    ('sxm', 'sxm', 'pcie')
    """
    name = spec.name.lower()
    if "pcie" in name or name.endswith(" nvl"):
        return "pcie"
    if "sxm" in name or any("sxm" in alias.lower() for alias in spec.aliases):
        return "sxm"
    return None


#: Modules whose catalog entry names no form factor (B200 on an HGX B200 board, the GH200
#: superchip) or that memfit's catalog does not hold (H800, B100): their names.
_SXM_NAMES = ("b200", "b100", "h800", "gh200")


def default_topology(spec: GpuSpec, count: int) -> str:
    """How ``count`` of these cards are usually linked, by the catalog's form factor
    (:func:`form_factor`): SXM modules sit on NVLink baseboards, PCIe and GeForce cards on
    PCIe. Of SXM modules, Ampere and newer (A100, H100, H200, B200 HGX boards) are linked by
    NVSwitch when more than 2 (``nvlink`` for 2, a direct link); Volta's 8-GPU boards (DGX-1,
    HGX-1) link the V100 SXM2 modules directly in a hybrid cube-mesh, ``nvlink`` at any count
    (DGX-2's 16 with NVSwitch: give ``devices.topology``). Give ``devices.topology`` for
    another machine.

    >>> from memfit.hardware.catalog import gpu
    >>> default_topology(gpu("H100"), 8), default_topology(gpu("RTX 4090"), 4)
    ('nvswitch', 'pcie')
    >>> default_topology(gpu("V100"), 8), default_topology(gpu("A100 PCIe 40GB"), 8)
    ('nvlink', 'pcie')
    """
    form = form_factor(spec)
    if form is None and any(word in spec.name.lower() for word in _SXM_NAMES):
        form = "sxm"
    if form != "sxm":
        return "pcie"
    if spec.arch == "volta":
        return "nvlink"
    return "nvswitch" if count > 2 else "nvlink"


def default_communicators(
    framework: str, strategy: str, jaxlib: str | tuple[int, ...] | None = None
) -> tuple[int, str]:
    """How many NCCL communicators each device joins, and why, when the workload does not say
    (``devices.communicators``).

    * JAX (``pmap``, ``jit`` with shardings): by the jaxlib's XLA
      (``rules_jaxlib.json`` ``xla.communicators_per_group``). XLA before jaxlib 0.4.30 keyed
      a clique by its devices **and stream** (per-stream communicators,
      ``--xla_gpu_enable_nccl_per_stream_comms``, on by default until openxla/xla#10965): a
      training step with synchronous and asynchronous all-reduces joins two communicators
      over the same devices. From 0.4.30 the flag is off and later XLA drops the stream from
      ``GpuCliqueKey``: one communicator per device group (send/recv gets its own). A
      program whose collectives run over sub-groups of the mesh has more: give the count.
      Unknown jaxlib: the current XLA's one.
    * torch (DDP, FSDP): ``ProcessGroupNCCL`` keeps one communicator per device and process
      group, and DDP and FSDP use the default group: one.

    >>> default_communicators("jax", "pmap", "0.4.25")[0], default_communicators("jax", "pmap")[0]
    (2, 1)
    >>> default_communicators("torch", "ddp")[0]
    1
    """
    if framework == "jax":
        version = _jaxlib_version(jaxlib)
        count = int(rule("jaxlib", "xla.communicators_per_group", jaxlib=version))
        which = "jaxlib " + ".".join(str(p) for p in version) if version else "a current jaxlib"
        if count > 1:
            return count, f"XLA's per-stream cliques of {which}: sync and async collectives"
        return count, f"XLA's one clique per device group, {which}"
    return 1, "ProcessGroupNCCL's one per device"


def _jaxlib_version(jaxlib: str | tuple[int, ...] | None) -> tuple[int, ...] | None:
    """``"0.4.25"`` -> ``(0, 4, 25)``; ``None`` stays unknown.

    Raises:
        ConfigError: For text that is not a version.
    """
    if jaxlib is None or isinstance(jaxlib, tuple):
        return jaxlib
    parts = str(jaxlib).strip().split("+")[0].split(".")
    return tuple(
        parse_int("jaxlib", p, lo=0, hint="write the jaxlib version as 0.4.30") for p in parts
    )


def stray_context(
    spec: GpuSpec, runtime: Runtime | None = None, init: str = "unknown"
) -> tuple[int, str]:
    """The CUDA context one process that never selected its device leaves on device 0, and
    why that size.

    Its module loading is fixed when CUDA starts (the driver reads ``CUDA_MODULE_LOADING``
    then), and torch sets ``CUDA_MODULE_LOADING=LAZY`` only in its own lazy init
    (``CUDAHooks::initCUDA``, torch 1.13+). What started CUDA decides (``init``):

    * ``torch``: a torch CUDA call (a tensor ``.cuda()`` without an index,
      ``torch.cuda.current_device()``) started it: the runtime's own loading mode.
    * ``nccl``: ``dist.init_process_group("nccl")`` before any torch CUDA call:
      ``ProcessGroupNCCL``'s constructor counts the GPUs (``at::cuda::getNumGPUs``,
      ``cudaGetDeviceCount``, which starts CUDA) before torch sets the variable, so the
      process loads eagerly unless the variable was set beforehand or the build's CUDA is
      12.2 or newer (lazy by default); ``barrier()`` then puts that context on device 0
      (torch 2.0's dispatch tensor on the current device, pytorch/pytorch#98763, #149119).
    * ``unknown``: the larger of the two (the eager context), noted.

    >>> from memfit.hardware.catalog import gpu
    >>> from memfit.hardware.runtime import parse_runtime
    >>> torch20 = parse_runtime("torch=2.0.0")
    >>> stray_context(gpu("V100"), torch20, "torch")[0] // 2**20
    325
    >>> stray_context(gpu("V100"), torch20, "nccl")[0] // 2**20
    900
    >>> stray_context(gpu("V100"), parse_runtime("torch=2.4.1,cuda=12.4"))[0] // 2**20
    325
    >>> stray_context(gpu("V100"), parse_runtime("torch=2.6.0"))[0] // 2**20  # a CUDA 12.4 wheel
    325

    Raises:
        ConfigError: For an ``init`` not in :data:`STRAY_INITS`.
    """
    if init not in STRAY_INITS:
        raise ConfigError(
            f"devices.stray_init must be one of {', '.join(STRAY_INITS)}, not {init!r}",
            key_path="devices.stray_init",
            hint="nccl: the process group started CUDA; torch: a torch CUDA call did",
        )
    rt = runtime if runtime is not None else runtime_from_versions()
    own = cuda_context(spec, rt, kernels=False)  # it runs no step on device 0
    if init == "torch" or rt.module_loading == "eager":
        return own.bytes, f"{rt.module_loading} loading ({rt.loading_reason})"
    if "module_loading" in rt.given:
        return own.bytes, f"{rt.loading_reason}, set before CUDA starts"
    cuda, whose = rt.cuda, "the build's"
    if cuda is None and rt.torch is not None:
        wheel = rule("torch", "wheel.cuda", torch=parse_version(rt.torch, "torch"))
        cuda, whose = (None, whose) if wheel is None else (str(wheel), "its default wheel's")
    if cuda is not None and parse_version(cuda, "cuda") >= (12, 2):
        return own.bytes, f"lazy loading, {whose} CUDA {cuda}'s default (from 12.2)"
    eager = cuda_context(spec, replace(rt, module_loading="eager"), kernels=False)
    why = (
        "eager loading: ProcessGroupNCCL starts CUDA (cudaGetDeviceCount) before torch sets "
        "CUDA_MODULE_LOADING=LAZY"
    )
    if init == "unknown":
        why += (
            " (what started CUDA is not known, devices.stray_init: the larger context; "
            f"a torch CUDA call first would leave {own.bytes // 2**20:,} MiB)"
        )
    return eager.bytes, why


@dataclass(frozen=True)
class DeviceTerm:
    """A term a multi-GPU job adds to a device.

    Attributes:
        name: The term's name in the breakdown.
        bytes: Bytes on that device.
        basis: ``analytic``, ``fitted`` or ``assumed``.
        detail: How it was sized.
        source: Where its rules come from.
        device0_only: Only on device 0.
    """

    name: str
    bytes: int
    basis: str
    detail: str
    source: str
    device0_only: bool = False

    def to_dict(self) -> dict[str, Any]:
        """Plain data."""
        return {
            "name": self.name,
            "bytes": self.bytes,
            "basis": self.basis,
            "detail": self.detail,
            "source": self.source,
            "device0_only": self.device0_only,
        }


def device_terms(
    spec: GpuSpec,
    count: int,
    *,
    framework: str,
    strategy: str,
    topology: str | None = None,
    nccl: str | None = None,
    nccl_env: Mapping[str, str] | None = None,
    set_device: bool = True,
    all_to_all: bool = False,
    p2p_peers: int | None = None,
    context_bytes: int = 0,
    context_detail: str = "",
    stray_bytes: int = 0,
    device0_state_bytes: int = 0,
    communicators: int | None = None,
    jaxlib: str | tuple[int, ...] | None = None,
) -> tuple[list[DeviceTerm], NcclEstimate | None]:
    """The terms ``count`` devices add beyond a single device's plan.

    Args:
        spec: The card.
        count: How many.
        framework: ``torch`` or ``jax``.
        strategy: ``devices.strategy`` (``ddp``, ``fsdp``, ``pmap``, ``single``).
        topology: ``pcie``, ``nvlink`` or ``nvswitch`` (default :func:`default_topology`).
        nccl: NCCL's version (``None``: torch's default, or for JAX, whose ``jax[cuda12]``
            leaves it open, the largest figure of the releases it may install,
            :func:`memfit.hardware.nccl.largest_nccl_memory`).
        nccl_env: The job's ``NCCL_*`` variables.
        set_device: Every torch process selects its device before touching CUDA.
        all_to_all: The job calls send/recv or all-to-all.
        p2p_peers: The peers each rank sends to and receives from (``None``: every other
            rank, an all-to-all; 1 a ring shift; 2 a pipeline stage).
        context_bytes: The CUDA context each other process leaves on device 0 when
            ``set_device`` is false (:func:`stray_context`).
        context_detail: How that context was sized.
        stray_bytes: What each such process allocates on device 0 besides (a checkpoint
            loaded without ``map_location``), rounded up to the caching allocator's 2 MiB.
        device0_state_bytes: For JAX: the state a single-controller program builds on its
            default device before replicating it.
        communicators: NCCL communicators per device (``None``:
            :func:`default_communicators`); NCCL's terms are per communicator, times this.
        jaxlib: For JAX: the jaxlib version the job runs (its XLA decides the
            communicators per device group); ``None``: a current one.

    Returns:
        The terms, and NCCL's estimate (``None`` for one device).

    Raises:
        ConfigError: For an unknown topology or a bad NCCL setting.
    """
    if count <= 1:
        return [], None
    topo = topology or default_topology(spec, count)
    geforce = "geforce" in spec.name.lower()
    settings: dict[str, Any] = {
        "capability": spec.compute_capability,
        "p2p": False if (geforce and topo == "pcie") else None,
        "all_to_all": all_to_all,
        "p2p_peers": p2p_peers if p2p_peers is None else min(p2p_peers, count - 1),
        "env": nccl_env,
    }
    if nccl is None and framework == "jax":  # jax[cuda12] leaves NCCL's version open
        est = largest_nccl_memory(count, topo, **settings)
    else:
        est = nccl_memory(count, topo, nccl=nccl, **settings)
    if communicators is None:
        comms, why = default_communicators(framework, strategy, jaxlib)
    else:
        comms = parse_int("communicators", communicators, lo=1, hi=64)
        why = "devices.communicators (given)"
    if comms == 1 and framework != "jax" and communicators is None:
        terms = [DeviceTerm(t.name, t.bytes, t.basis, t.detail, t.source) for t in est.terms]
    else:  # JAX's count follows its jaxlib: say which
        noun = "communicator" if comms == 1 else "communicators"
        terms = [
            DeviceTerm(
                t.name,
                comms * t.bytes,
                t.basis,
                f"{comms} {noun} ({why}) x [{t.detail}]",
                t.source,
            )
            for t in est.terms
        ]
    if framework == "torch" and not set_device:
        terms.append(
            DeviceTerm(
                "stray_cuda_contexts",
                (count - 1) * context_bytes,
                "analytic",
                f"{count - 1} other processes x one CUDA context each on device 0"
                + (f": {context_detail}" if context_detail else ""),
                _STRAY_SOURCE,
                device0_only=True,
            )
        )
        extra = parse_int("stray_bytes", stray_bytes, lo=0)
        if extra:
            rounded = -(-extra // _SEGMENT_BYTES) * _SEGMENT_BYTES
            terms.append(
                DeviceTerm(
                    "stray_tensors",
                    (count - 1) * rounded,
                    "analytic",
                    f"{count - 1} other processes x {rounded // 2**20:,} MiB each on device 0 "
                    "(devices.stray_bytes, in 2 MiB segments)",
                    "torch.load without map_location restores tensors to the device they were "
                    "saved from (torch/serialization.py); CUDACachingAllocator.cpp kRoundLarge",
                    device0_only=True,
                )
            )
    if framework == "jax" and device0_state_bytes > 0:
        terms.append(
            DeviceTerm(
                "device0_unreplicated_state",
                device0_state_bytes,
                "analytic",
                "the training state built on the default device before it is replicated",
                "brax/training/agents/ppo/train.py (training_state on jax.devices()[0], then "
                "jax.device_put_replicated)",
                device0_only=True,
            )
        )
    if topo not in ("pcie", "nvlink", "nvswitch"):
        raise ConfigError(f"unknown topology {topo!r}", key_path="devices.topology")
    return terms, est


@dataclass(frozen=True)
class DevicePlan:
    """One device (or a group of identical devices) of a multi-GPU plan.

    Attributes:
        devices: Which devices (``[0]`` or ``[1, 2, ..., 7]``).
        predicted_bytes: Their predicted peak footprint each.
        budget_bytes: What each may use.
        breakdown: Term -> bytes, summing to ``predicted_bytes``.
        basis: Term -> basis for the multi-GPU terms.
    """

    devices: list[int]
    predicted_bytes: int
    budget_bytes: int
    breakdown: dict[str, int]
    basis: dict[str, str] = field(default_factory=dict)

    @property
    def fits(self) -> bool:
        """Whether the footprint is within the budget."""
        return self.predicted_bytes <= self.budget_bytes

    def to_dict(self) -> dict[str, Any]:
        """Plain data."""
        return {
            "devices": list(self.devices),
            "predicted_bytes": self.predicted_bytes,
            "budget_bytes": self.budget_bytes,
            "fits": self.fits,
            "breakdown": dict(self.breakdown),
            "basis": dict(self.basis),
        }


def compose(
    count: int, breakdown: Mapping[str, int], budget_bytes: int, terms: list[DeviceTerm]
) -> list[DevicePlan]:
    """Per-device plans: the single-device breakdown plus the multi-GPU terms; device 0 on
    its own when it holds more.

    >>> t = [DeviceTerm("nccl_comm_base", 10, "fitted", "", ""),
    ...      DeviceTerm("stray_cuda_contexts", 5, "analytic", "", "", device0_only=True)]
    >>> [(p.devices, p.predicted_bytes) for p in compose(4, {"x": 100}, 200, t)]
    [([0], 115), ([1, 2, 3], 110)]
    """
    count = parse_int("count", count, lo=1)
    every = {t.name: t.bytes for t in terms if not t.device0_only}
    only0 = {t.name: t.bytes for t in terms if t.device0_only}
    basis = {t.name: t.basis for t in terms}

    def one(devices: list[int], extra: Mapping[str, int]) -> DevicePlan:
        merged = dict(breakdown)
        for name, nbytes in extra.items():
            merged[name] = merged.get(name, 0) + nbytes
        shown = {k: v for k, v in basis.items() if k in extra}
        return DevicePlan(devices, sum(merged.values()), budget_bytes, merged, shown)

    if not any(only0.values()) or count == 1:
        return [one(list(range(count)), every)]
    return [one([0], {**every, **only0}), one(list(range(1, count)), every)]


def devices_terms(
    spec: GpuSpec,
    count: int,
    framework: str,
    dev: DeviceSpec,
    runtime: Runtime | None,
    *,
    jaxlib: str | tuple[int, ...] | None = None,
    device0_state_bytes: int = 0,
) -> tuple[list[DeviceTerm], NcclEstimate | None]:
    """:func:`device_terms` for a workload's ``devices:`` keys (``dev``): the stray contexts
    on device 0 sized for ``runtime`` and ``dev.stray_init`` (:func:`stray_context`). The
    planner and the estimators both call it."""
    context_bytes, context_detail = stray_context(spec, runtime, dev.stray_init)
    return device_terms(
        spec,
        count,
        framework=framework,
        strategy=dev.strategy,
        topology=dev.topology,
        nccl=dev.nccl,
        nccl_env=dev.nccl_env,
        set_device=dev.set_device,
        all_to_all=dev.all_to_all,
        p2p_peers=dev.p2p_peers,
        context_bytes=context_bytes,
        context_detail=context_detail,
        stray_bytes=dev.stray_bytes,
        device0_state_bytes=device0_state_bytes,
        communicators=dev.communicators,
        jaxlib=jaxlib,
    )
