"""XLA's GPU target config for a catalog card: what XLA's GPU compiler needs to compile for it.

XLA compiles for a GPU it cannot see when it is given a ``GpuTargetConfigProto`` (text
format): the device description a real device would report (``xla/stream_executor/
device_description.proto``). :func:`target_config` builds one for every CUDA card of the
catalog from two kinds of figures:

* per compute capability, the limits NVIDIA's CUDA C++ Programming Guide lists in its table
  "Technical Specifications per Compute Capability" (shared memory per SM and per block,
  resident threads per SM, registers, grid and block dimensions) and the FP32 units per SM
  of the architecture whitepapers;
* per card, the SM count, boost clock, memory bandwidth and L2 size of its spec sheet or
  XLA's own spec file (``xla_targets.json`` beside this module, each with its source), and
  its memory as CUDA reports it.

XLA's compiler reads the SM count, the clock and the FP32 units in its cost model (they
change fusion decisions, and so the temporaries), and ``device_memory_size`` for the memory
limit its scheduler and rematerialization work under
(``xla/service/gpu/gpu_hlo_schedule.cc``, ``GetSchedulerMemoryLimit``: 80% of it, less the
inputs and outputs, times the 95% slop factor). Only fields that jaxlib 0.10.2's proto
accepts are written (XLA's newer spec files carry fields older protos reject).

>>> from memfit.hardware.catalog import gpu
>>> config = target_config(gpu("RTX 4070"))
>>> config.compiled_for
'cuda sm_89 (NVIDIA GeForce RTX 4070)'
>>> config.core_count, config.device_memory_source
(46, 'estimated')
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources
from typing import Any, Protocol

from memfit._checks import require, require_bytes, require_object
from memfit.errors import ConfigError

__all__ = [
    "ARCH_LIMITS_SOURCE",
    "CUDA_RESERVED_FRACTION",
    "ArchLimits",
    "TargetConfig",
    "arch_limits",
    "base_for_limit",
    "card_figures",
    "cuda_total_bytes",
    "target_config",
    "xla_memory_limit",
]

#: Where the per-compute-capability limits come from.
ARCH_LIMITS_SOURCE = (
    "NVIDIA CUDA C++ Programming Guide, 'Technical Specifications per Compute Capability' "
    "(shared memory per SM and per block, threads per SM); FP32 units per SM from the "
    "architecture whitepapers; sm_120 as XLA's rtx6000pro.txtpb records it"
)

#: The share of ``nvidia-smi``'s total that CUDA does not report as device memory, where no
#: published CUDA total exists: 0.7% (H100 SXM) to 2.3% (RTX 4070) in the published pairs
#: (XLA's spec files, PyTorch's "total capacity" in out-of-memory messages); 1.5% is used.
CUDA_RESERVED_FRACTION = 0.015


class _Spec(Protocol):
    """The catalog's ``GpuSpec`` as this module reads it (no import of the planner's layer)."""

    @property
    def name(self) -> str: ...
    @property
    def total_bytes(self) -> int: ...
    @property
    def compute_capability(self) -> tuple[int, int] | None: ...
    @property
    def cuda_total_bytes(self) -> int | None: ...


@dataclass(frozen=True)
class ArchLimits:
    """The limits one compute capability sets (CUDA C++ Programming Guide).

    Attributes:
        shared_memory_per_sm: Shared memory per SM (bytes).
        shared_memory_per_block_optin: The most one block may opt in to (bytes).
        threads_per_sm: Resident threads per SM.
        fp32_units_per_sm: FP32 units ("CUDA cores") per SM.
    """

    shared_memory_per_sm: int
    shared_memory_per_block_optin: int
    threads_per_sm: int
    fp32_units_per_sm: int


_KIB = 1024

_ARCH: dict[tuple[int, int], ArchLimits] = {
    (6, 0): ArchLimits(64 * _KIB, 48 * _KIB, 2048, 64),
    (6, 1): ArchLimits(96 * _KIB, 48 * _KIB, 2048, 128),
    (7, 0): ArchLimits(96 * _KIB, 96 * _KIB, 2048, 64),
    (7, 2): ArchLimits(96 * _KIB, 96 * _KIB, 2048, 64),
    (7, 5): ArchLimits(64 * _KIB, 64 * _KIB, 1024, 64),
    (8, 0): ArchLimits(164 * _KIB, 163 * _KIB, 2048, 64),
    (8, 6): ArchLimits(100 * _KIB, 99 * _KIB, 1536, 128),
    (8, 7): ArchLimits(164 * _KIB, 163 * _KIB, 2048, 128),
    (8, 9): ArchLimits(100 * _KIB, 99 * _KIB, 1536, 128),
    (9, 0): ArchLimits(228 * _KIB, 227 * _KIB, 2048, 128),
    (10, 0): ArchLimits(228 * _KIB, 227 * _KIB, 2048, 128),
    (12, 0): ArchLimits(128 * _KIB, 99 * _KIB, 1536, 128),
}

#: Compute capabilities whose full feature set XLA targets (``sm_90a``, ``sm_100a``), as a
#: real device reports them (XLA's h100_sxm.txtpb and b200.txtpb).
_ACCELERATED = frozenset({(9, 0), (10, 0)})


_SPEC_HINT = "pass memfit.gpu('RTX 4090') (a GpuSpec), or the card's name"


def _check_cc(cc: object) -> None:
    """``cc`` is a compute capability: a tuple of two whole numbers (``(8, 9)``)."""
    if (
        not isinstance(cc, tuple)
        or len(cc) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 100 for v in cc)
    ):
        raise ConfigError(
            f"cc must be a compute capability such as (8, 9), not {cc!r:.60}",
            key_path="cc",
            hint="the (major, minor) of GpuSpec.compute_capability",
        )


def _check_spec(spec: object) -> None:
    """``spec`` is a catalog card (a ``GpuSpec``: its name, memory and capability)."""
    require_object(
        "spec",
        spec,
        attributes=("name", "total_bytes", "compute_capability", "cuda_total_bytes"),
        what="a GpuSpec",
        hint=_SPEC_HINT,
    )
    require("spec.name", getattr(spec, "name", None), "str", hint=_SPEC_HINT)
    require_bytes("spec.total_bytes", getattr(spec, "total_bytes", None), lo=1, hint=_SPEC_HINT)


def arch_limits(cc: tuple[int, int]) -> ArchLimits:
    """The limits of compute capability ``cc``.

    Raises:
        ConfigError: For a compute capability memfit has no limits for.

    >>> arch_limits((8, 9)).threads_per_sm
    1536
    """
    _check_cc(cc)
    found = _ARCH.get(cc)
    if found is None:
        known = ", ".join(f"{a}.{b}" for a, b in sorted(_ARCH))
        raise ConfigError(
            f"no XLA target limits for compute capability {cc[0]}.{cc[1]}",
            key_path="gpu",
            hint=f"memfit knows {known}",
        )
    return found


@functools.cache
def _data() -> dict[str, Any]:
    text = resources.files("memfit.hardware").joinpath("xla_targets.json").read_text("utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def card_figures(name: str) -> dict[str, Any] | None:
    """The per-card figures (``sm_count``, ``boost_mhz``, ``memory_bandwidth_gbs``,
    ``l2_kib``, ``source``, ...) of catalog card ``name``, with the source's text; ``None``
    for a card memfit has none for.

    >>> card_figures("NVIDIA GeForce RTX 4090")["sm_count"]
    128
    """
    require("name", name, "str", hint="the card's full name, as memfit.gpu(...).name gives it")
    data = _data()
    found = data["cards"].get(name)
    if found is None:
        return None
    return {**found, "source_text": data["sources"][found["source"]]}


def cuda_total_bytes(spec: _Spec) -> tuple[int, str]:
    """The card's memory as CUDA reports it (``cuDeviceTotalMem``, what XLA's device
    description holds), and how it was reached: ``"published"`` (the catalog's or XLA's
    spec file's figure from a real device) or ``"estimated"`` (``nvidia-smi``'s total less
    :data:`CUDA_RESERVED_FRACTION`).

    >>> from memfit.hardware.catalog import gpu
    >>> cuda_total_bytes(gpu("H100 80GB"))
    (84942979072, 'published')
    """
    _check_spec(spec)
    figures = _data()["cards"].get(spec.name) or {}
    published = figures.get("cuda_total_bytes") or spec.cuda_total_bytes
    if published:
        return int(published), "published"
    return int(spec.total_bytes * (1 - CUDA_RESERVED_FRACTION)), "estimated"


def xla_memory_limit(base_bytes: int, io_bytes: int, slop_percent: int = 95) -> int:
    """XLA:GPU's scheduler and rematerialization limit: ``(base - inputs and outputs) *
    slop / 100`` (``GetSchedulerMemoryLimit``), where ``base`` is the compile's
    ``device_memory_size`` (JAX passes its allocator's ``bytes_limit``) or else 80% of the
    device's memory.

    >>> xla_memory_limit(1000, 200)
    760
    """
    require_bytes("base_bytes", base_bytes)
    require_bytes("io_bytes", io_bytes)
    require("slop_percent", slop_percent, "int")
    if not 0 <= slop_percent <= 100:
        raise ConfigError(
            f"slop_percent must be from 0 to 100, not {slop_percent}", key_path="slop_percent"
        )
    return (base_bytes - io_bytes) * slop_percent // 100


@dataclass(frozen=True)
class TargetConfig:
    """A ``GpuTargetConfigProto`` for one card, and what it was built from.

    Attributes:
        name: The card's name (as NVML reports it).
        compute_capability: ``(major, minor)``.
        core_count: SMs.
        clock_rate_ghz: Boost clock.
        memory_bandwidth: Bytes per second.
        l2_cache_size: Bytes.
        device_memory_size: Bytes, as CUDA reports it.
        device_memory_source: ``"published"`` or ``"estimated"`` (see
            :func:`cuda_total_bytes`).
        limits: The compute capability's limits.
        source: Where the per-card figures come from.
        note: A caveat of the per-card figures (laptop clocks), or ``None``.
    """

    name: str
    compute_capability: tuple[int, int]
    core_count: int
    clock_rate_ghz: float
    memory_bandwidth: int
    l2_cache_size: int
    device_memory_size: int
    device_memory_source: str
    limits: ArchLimits
    source: str
    note: str | None = None

    @property
    def sm(self) -> str:
        """The target's name for ptxas: ``sm_89``, ``sm_90a``."""
        major, minor = self.compute_capability
        return f"sm_{major}{minor}" + ("a" if self.compute_capability in _ACCELERATED else "")

    @property
    def compiled_for(self) -> str:
        """What a compile for this config is for: ``"cuda sm_89 (NVIDIA GeForce RTX 4070)"``."""
        return f"cuda {self.sm} ({self.name})"

    def text(self, *, device_memory_size: int | None = None, feature_extension: bool = True) -> str:
        """The config in protobuf text format.

        Args:
            device_memory_size: Written instead of the card's (the compile's memory base,
                see :func:`memfit.estimate.xla.gpu.compile_for_gpu`).
            feature_extension: Write ``cuda_compute_capability.feature_extension`` (jaxlib
                0.10.2 knows it; older protos do not).
        """
        major, minor = self.compute_capability
        memory = self.device_memory_size if device_memory_size is None else device_memory_size
        lim = self.limits
        info = [
            ("threads_per_block_limit", 1024),
            ("threads_per_warp", 32),
            ("shared_memory_per_block", 48 * _KIB),
            ("shared_memory_per_core", lim.shared_memory_per_sm),
            ("threads_per_core_limit", lim.threads_per_sm),
            ("core_count", self.core_count),
            ("fpus_per_core", lim.fp32_units_per_sm),
            ("block_dim_limit_x", 2**31 - 1),
            ("block_dim_limit_y", 65535),
            ("block_dim_limit_z", 65535),
            ("memory_bandwidth", self.memory_bandwidth),
            ("l2_cache_size", self.l2_cache_size),
            ("clock_rate_ghz", f"{self.clock_rate_ghz:g}"),
            ("device_memory_size", memory),
            ("shared_memory_per_block_optin", lim.shared_memory_per_block_optin),
        ]
        lines = ["gpu_device_info {"]
        lines += [f"  {key}: {value}" for key, value in info]
        lines.append("  cuda_compute_capability {")
        lines += [f"    major: {major}", f"    minor: {minor}"]
        if feature_extension:
            accelerated = self.compute_capability in _ACCELERATED
            lines.append(
                f"    feature_extension: {'ACCELERATED_FEATURES' if accelerated else 'NONE'}"
            )
        lines.append("  }")
        lines += [
            "  registers_per_core_limit: 65536",
            "  registers_per_block_limit: 65536",
            "  thread_dim_limit_x: 1024",
            "  thread_dim_limit_y: 1024",
            "  thread_dim_limit_z: 64",
            "}",
            'platform_name: "CUDA"',
            f'device_description_str: "{self.name}"',
        ]
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict[str, Any]:
        """The config's figures as plain data (the text under ``"text"``)."""
        return {
            "name": self.name,
            "compiled_for": self.compiled_for,
            "compute_capability": list(self.compute_capability),
            "core_count": self.core_count,
            "clock_rate_ghz": self.clock_rate_ghz,
            "memory_bandwidth": self.memory_bandwidth,
            "l2_cache_size": self.l2_cache_size,
            "device_memory_size": self.device_memory_size,
            "device_memory_source": self.device_memory_source,
            "source": self.source,
            "arch_source": ARCH_LIMITS_SOURCE,
            "note": self.note,
            "text": self.text(),
        }


def target_config(spec: _Spec | str) -> TargetConfig:
    """The target config of a catalog card (a ``GpuSpec``, or its name).

    Raises:
        ConfigError: For a GPU without a compute capability (one known only by its size, the
            host) or with no per-card figures; for an argument that is not a card (named).
    """
    if isinstance(spec, str):
        from memfit.hardware.catalog import gpu

        spec = gpu(spec)
    _check_spec(spec)
    cc = spec.compute_capability
    figures = card_figures(spec.name)
    if cc is None or figures is None:
        raise ConfigError(
            f"{spec.name} has no XLA target config: XLA's GPU compiler needs the card's "
            "compute capability, SM count and clock",
            key_path="gpu",
            hint="name a card from `memfit gpus` (a GPU given by its size alone has none)",
        )
    memory, how = cuda_total_bytes(spec)
    source = str(figures["source_text"])
    if figures.get("cuda_total_source"):
        source += (
            "; the memory as CUDA reports it: " + _data()["sources"][figures["cuda_total_source"]]
        )
    note = figures.get("note")
    if note == "laptop":
        note = (
            "laptop card: its clock depends on the laptop's power limit; the highest listed "
            "boost is used"
        )
    return TargetConfig(
        name=spec.name,
        compute_capability=cc,
        core_count=int(figures["sm_count"]),
        clock_rate_ghz=figures["boost_mhz"] / 1000,
        memory_bandwidth=int(figures["memory_bandwidth_gbs"] * 10**9),
        l2_cache_size=int(figures["l2_kib"]) * _KIB,
        device_memory_size=memory,
        device_memory_source=how,
        limits=arch_limits(cc),
        source=source,
        note=note,
    )


def base_for_limit(bytes_limit: int) -> int:
    """The ``device_memory_size`` whose 80% is ``bytes_limit`` (rounded up), so a compile
    without an allocator works under the limit JAX's allocator would give it.

    Raises:
        ConfigError: ``bytes_limit`` is not a whole number of bytes of at least 1.

    >>> base_for_limit(800)
    1000
    """
    require_bytes("bytes_limit", bytes_limit, lo=1, hint="memory_stats()['bytes_limit']")
    return -(-bytes_limit * 100 // 80)
