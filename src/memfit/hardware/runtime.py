"""The target's software, and what it makes the CUDA context cost.

A plan or an estimate made on one machine for another needs the target's software, not the
planning machine's: the CUDA context a process holds before it allocates anything depends on
the CUDA version, the driver and above all on **module loading**. With eager loading every
kernel of every CUDA library the process links (PyTorch's own kernels first of all) is copied
to the device when the context is created; with lazy loading only the kernels a job runs are.

:class:`Runtime` names that software (``torch``, ``cuda``, ``driver``, ``module_loading``;
every key optional); :func:`parse_runtime` reads it from a mapping or from the CLI's
``torch=1.10.0,cuda=11.2,module_loading=eager`` text; :func:`cuda_context` turns it and the
GPU into a :class:`ContextEstimate`: the bytes, the parts they are made of, and the public
source of each figure. This module is pure (no torch, no jax, no NVML): the installed
versions are read by the callers that may import torch (``memfit.planning``, the estimator).

Module loading, as documented:

* CUDA 11.7 added lazy loading of kernels, 11.8 lazy loading of modules; both opt-in through
  ``CUDA_MODULE_LOADING=LAZY`` and both need a driver of branch R515 or newer (CUDA
  programming guide, "Lazy Loading").
* PyTorch 1.13 sets ``CUDA_MODULE_LOADING=LAZY`` itself when the user has not set it
  (pytorch PR #86509).
* From CUDA 12.2 (Linux; 12.3 on Windows) lazy is CUDA's own default (NVIDIA developer forum,
  "Lazy Loading", 2023).

So before torch 1.13 or CUDA 11.7, or with a driver older than R515, a process loads eagerly.

>>> r = parse_runtime("torch=1.10.0,cuda=11.2")
>>> r.module_loading, r.loading_reason
('eager', 'CUDA 11.2 has no lazy loading (it came with 11.7)')
>>> parse_runtime({"torch": "2.4.1", "cuda": "12.1"}).module_loading
'lazy'
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from memfit._checks import parse_int, require_choice, require_instance
from memfit.errors import ConfigError
from memfit.hardware.catalog import GpuSpec
from memfit.hardware.rules import rule
from memfit.units import MiB, format_bytes

__all__ = [
    "CONTEXT_BASE_BYTES",
    "CONTEXT_SOURCES",
    "EAGER_CONTEXT_BYTES",
    "FRAMEWORKS",
    "LAZY_CONTEXT_BYTES",
    "LAZY_CONTEXT_UNKNOWN_BYTES",
    "LAZY_KERNEL_IMAGES_BYTES",
    "LOCAL_BYTES_PER_THREAD",
    "RUNTIME_KEYS",
    "STACK_BYTES_PER_THREAD",
    "ContextEstimate",
    "Runtime",
    "cuda_context",
    "eager_context",
    "lazy_started_context",
    "local_memory_bytes",
    "parse_runtime",
    "parse_version",
    "resident_threads",
    "runtime_from_versions",
]

#: The keys a runtime may name.
RUNTIME_KEYS: tuple[str, ...] = ("torch", "cuda", "driver", "module_loading", "cudnn")

_LOADING_NAMES = {"lazy": "lazy", "eager": "eager"}

_VERSION_RE = re.compile(
    r"^(\d+(?:\.\d+){0,3})(?:(?:a|b|rc|\.dev|\.post)\d*)?(?:\+[\w.]*)?$", re.ASCII
)

#: Where every context figure below comes from, quoted in the breakdown and in docs/guide.md.
CONTEXT_SOURCES: dict[str, str] = {
    "eager": (
        "1,343 MiB of NVML 'used' after torch.ones((1, 1)).to('cuda') on a 16 GB V100 with "
        "CUDA 11.2, which loads every kernel at start: 1,341 MiB of context plus the 2 MiB "
        "segment the tensor takes (Hugging Face transformers docs, 'Model training anatomy' / "
        "'Efficient training on a single GPU', 2022). pytorch PR #86509 measured 666,632,192 B "
        "(total - free) for an eager torch 1.13 with a 20 MiB segment, i.e. 616 MiB: the "
        "sources disagree by about 2x (different torch builds: the context holds torch's "
        "kernels, which grow with each release), and memfit takes the larger figure; CUDA 10 "
        "builds (720 MiB on Pascal, 880 MiB on Volta and Turing) and CUDA 11 builds on "
        "Ampere and newer (1,690 MiB) have rows of their own (rules_torch.json "
        "context.eager_mib: pytorch#49877, #55277)"
    ),
    "lazy": (
        "the context a process holds once CUDA has started: a local-memory reservation, SMs x "
        "resident threads per SM x 2 KiB per thread, and a small fixed part (5 MiB), fitted "
        "(bench/context_truth.py) on the calibration readings of a started context by named "
        "card: unsloth-zoo PR #1053 (2026), 426 MiB in nvidia-smi after torch.cuda.mem_get_info "
        "on an RTX 6000 Ada (142 SMs x 1,536 threads; torch 2.10, CUDA 13.0); llama.cpp PR "
        "#23604 (2026), 107 MiB that a bare cudaMemGetInfo's primary context takes on an RTX "
        "4060 Ti (34 x 1,536); llama.cpp issue #20582 (2026), 506 MiB used on each RTX 5090 "
        "(170 x 1,536) after the same call. The three lie on one line through the origin within "
        "5 MiB (2 KiB per thread), where the earlier model (213 MiB plus 1 KiB per thread, "
        "from the RTX 6000 Ada alone) put the RTX 4060 Ti at 264 MiB: the reservation is "
        "about twice cudaLimitStackSize's 1 KiB default (CUDA Runtime API, cudaDeviceSetLimit), "
        "which NVIDIA does not document as a size. Earlier readings without a card: pytorch PR "
        "#86509, 287,047,680 B (total - free) with lazy loading less the test tensor's 20 MiB "
        "segment (254 MiB); ptrblck in pytorch #107667 (2023): '~300MB', in #109888: 'around "
        "400MB if CUDA >= 11.7 is used and lazy module loading enabled'. Then the kernel images "
        "a training step loads at first use (torch's own kernels, cuBLAS/cuBLASLt at the first "
        "matmul, cuDNN at the first convolution): 227 MiB, the project's own H100 capture "
        "(torch 2.11.0+cu130, cuDNN 9.19, driver 580; NVML's per-process used less the caching "
        "allocator's reserved peak: 742 MiB for the MLP workloads, 758-760 MiB with cuDNN's "
        "convolutions, its calibration workloads) less the H100's context once started "
        "(5 MiB + 132 SMs x 2,048 x 2 KiB = 533 MiB): measured on the H100 with torch "
        "2.11+cu130, assumed for other architectures and versions (tests/data/published_truth/"
        "cuda_context/readings.yaml has every reading)"
    ),
}

#: The fixed part of a lazily loaded context once CUDA has started, beside its local memory:
#: the least the calibration readings of a started context by card leave over the
#: reservation (:data:`LOCAL_BYTES_PER_THREAD`), rounded up to a MiB, so that none of them is
#: under-predicted (RTX 4060 Ti 107 MiB - 102 MiB; RTX 6000 Ada 426 - 426; RTX 5090 506 - 510:
#: ``tests/shared/context_readings.py`` ``fit_started_context`` derives it, a test checks it).
#: Before 2026-11-29 it was 213 MiB, the RTX 6000 Ada's 426 MiB less 1 KiB per thread.
CONTEXT_BASE_BYTES = 5 * MiB

#: ``cudaLimitStackSize``'s documented default per-thread stack, 1 KiB (CUDA Runtime API,
#: cudaDeviceSetLimit). The context reserves more than this per resident thread
#: (:data:`LOCAL_BYTES_PER_THREAD`).
STACK_BYTES_PER_THREAD = 1024

#: The local memory a started context reserves per resident thread (SMs x resident threads
#: per SM of them): the least-squares slope of the calibration readings of a started context
#: against the card's resident threads (RTX 4060 Ti, RTX 6000 Ada, RTX 5090: 1,960 B),
#: rounded to 256 B. Twice :data:`STACK_BYTES_PER_THREAD`: NVIDIA documents the stack's
#: default, not the size of the reservation. Every calibration card has 1,536 threads per SM,
#: so per thread rather than per SM is the documented structure (local memory is per thread),
#: not something these readings separate; the H100 JAX reading (2,048 per SM, validation)
#: agrees within 1%.
LOCAL_BYTES_PER_THREAD = 2048

#: Each architecture's largest card's SMs and resident threads per SM (NVIDIA's figures;
#: hardware/gpu_sms.json, rules_cuda_arch.json ``sm.max_threads``).
_LARGEST_CARD: dict[str, tuple[int, int]] = {
    "pascal": (56, 2048),  # Tesla P100
    "volta": (80, 2048),  # V100
    "turing": (72, 1024),  # TITAN RTX, Quadro RTX 6000/8000
    "ampere": (108, 2048),  # A100
    "ada": (142, 1536),  # RTX 6000 Ada, L40(S)
    "hopper": (132, 2048),  # H100 SXM, H200
    "blackwell": (148, 2048),  # B200
}

#: The context once CUDA has started, with lazy loading, for a card of the architecture whose
#: SM count memfit does not know: the architecture's largest card's (``CONTEXT_BASE_BYTES``
#: plus its local memory), so that a plan errs on the safe side.
LAZY_CONTEXT_BYTES: dict[str, int] = {
    arch: CONTEXT_BASE_BYTES + sms * threads * LOCAL_BYTES_PER_THREAD
    for arch, (sms, threads) in _LARGEST_CARD.items()
}

#: The context once CUDA has started, with lazy loading, for a GPU of unknown architecture
#: (the largest architecture's, so that a plan errs on the safe side).
LAZY_CONTEXT_UNKNOWN_BYTES = max(LAZY_CONTEXT_BYTES.values())

#: The kernel images a training step loads into the context at first use with lazy loading
#: (torch's kernels, cuBLAS/cuBLASLt's, cuDNN's): measured on the H100 with torch 2.11+cu130
#: (760 MiB of context with cuDNN's convolutions, less the 533 MiB its context holds once
#: started), the larger of the MLP (742 MiB) and convolution (760 MiB) workloads, as a plan
#: does not know which libraries a step calls; assumed for every other architecture and
#: version. It was 283 MiB while the H100's started context was taken as 477 MiB (213 MiB +
#: 1 KiB per thread); the step's 760 MiB is unchanged.
LAZY_KERNEL_IMAGES_BYTES = 227 * MiB

#: The frameworks whose processes :func:`cuda_context` sizes.
FRAMEWORKS: tuple[str, ...] = ("torch", "jax")

#: The architectures on which a framework's kernel images were fitted to calibration readings
#: of a step in a process of that framework (tests/data/published_truth/cuda_context/
#: readings.yaml): torch's on the project's H100 capture. A JAX process loads other images
#: (XLA's compiled modules, the cuBLAS/cuBLASLt kernels its GEMMs and autotuner run, cuDNN's
#: for convolutions; not torch's own kernels) and no reading of a JAX step with preallocation
#: off was found that isolates them, so none is fitted: it takes torch's figure, ``assumed``.
_IMAGES_FITTED_ON: dict[str, frozenset[str]] = {
    "torch": frozenset({"hopper"}),
    "jax": frozenset(),
}

_SMS_FILE = Path(__file__).with_name("gpu_sms.json")


@cache
def _sm_counts() -> dict[str, int]:
    """The SMs of each catalog card (``gpu_sms.json``), by its catalog name."""
    data = json.loads(_SMS_FILE.read_text(encoding="utf-8"))
    return {str(k): int(v) for k, v in data["sms"].items()}


def resident_threads(spec: GpuSpec | None) -> int | None:
    """The threads ``spec`` holds resident at once: SMs (``gpu_sms.json``) x resident threads
    per SM (``rules_cuda_arch.json``, ``sm.max_threads``); ``None`` where the card's SM count
    or compute capability is not known.

    >>> from memfit.hardware.catalog import gpu
    >>> resident_threads(gpu("H100")), resident_threads(gpu("RTX 4060 Ti 8GB"))
    (270336, 52224)
    """
    if spec is None or spec.compute_capability is None:
        return None
    sms = _sm_counts().get(spec.name)
    if sms is None:
        return None
    threads = int(rule("cuda_arch", "sm.max_threads", capability=spec.compute_capability))
    return sms * threads


def local_memory_bytes(spec: GpuSpec | None) -> int | None:
    """The local memory a context reserves on ``spec`` once CUDA has started:
    :func:`resident_threads` x :data:`LOCAL_BYTES_PER_THREAD`; ``None`` where the card's SM
    count or compute capability is not known.

    >>> from memfit.hardware.catalog import gpu
    >>> local_memory_bytes(gpu("H100")) // MiB, local_memory_bytes(gpu("RTX 4060 Ti 8GB")) // MiB
    (528, 102)
    """
    threads = resident_threads(spec)
    return None if threads is None else threads * LOCAL_BYTES_PER_THREAD


def lazy_started_context(spec: GpuSpec | None) -> int:
    """The lazily loaded context once CUDA has started on ``spec``, before any kernel runs:
    :data:`CONTEXT_BASE_BYTES` plus :func:`local_memory_bytes`, or the architecture's
    largest card's (:data:`LAZY_CONTEXT_BYTES`) where the SM count is not known.

    >>> from memfit.hardware.catalog import gpu
    >>> lazy_started_context(gpu("RTX 6000 Ada")) // MiB, lazy_started_context(gpu("T4")) // MiB
    (431, 85)
    """
    local = local_memory_bytes(spec)
    if local is not None:
        return CONTEXT_BASE_BYTES + local
    arch = None if spec is None else spec.arch
    return LAZY_CONTEXT_BYTES.get(arch or "", LAZY_CONTEXT_UNKNOWN_BYTES)


#: Context bytes with eager loading (every kernel loaded at start; see CONTEXT_SOURCES).
EAGER_CONTEXT_BYTES = 1341 * MiB


def parse_version(text: str, key: str) -> tuple[int, ...]:
    """``"11.2"`` -> ``(11, 2)``; a local suffix (``"2.4.1+cu121"``) and a pre-release tail
    (``"2.6.0a0"``, ``"1.13.0.dev20221005"``) are ignored.

    Raises:
        ConfigError: When the text does not start with a dotted number (the key is named).

    >>> parse_version("2.4.1+cu121", "torch"), parse_version("460.91.03", "driver")
    ((2, 4, 1), (460, 91, 3))
    """
    require_instance(
        f"runtime.{key}",
        text,
        str,
        what="a version string such as '11.2'",
        hint="write versions as text: torch=2.4.1, cuda=12.1, driver=535.104.05",
    )
    match = _VERSION_RE.match(text.strip())
    if match is None:
        raise ConfigError(
            f"runtime.{key} is not a version: {text[:40]!r}",
            key_path=f"runtime.{key}",
            hint="write a dotted version number such as 11.2, 2.4.1 or 535.104.05",
        )
    return tuple(
        parse_int(
            f"runtime.{key}",
            part,
            lo=0,
            hint="write a dotted version number such as 11.2, 2.4.1 or 535.104.05",
        )
        for part in match.group(1).split(".")
    )


@dataclass(frozen=True)
class Runtime:
    """The software the job runs with on its GPU.

    Attributes:
        torch: PyTorch's version (``"1.10.0"``), or ``None`` when unknown.
        cuda: The CUDA runtime's version (``"11.2"``), or ``None``.
        driver: The NVIDIA driver's version (``"460.91.03"``), or ``None``.
        module_loading: ``"lazy"`` or ``"eager"``, given or derived from the rest.
        loading_reason: Why that loading mode (given, or the rule that decided it).
        given: The keys the caller gave (the rest are defaults).
        origin: Where the unnamed values came from (``"installed torch 2.13.0+cpu"``,
            ``"defaults"``).
        cudnn: The cuDNN library's version (``"9.19.0"``; torch reports ``91900``), or
            ``None``: the one the target's torch wheels bundle is assumed
            (:func:`memfit.hardware.cuda.cudnn_major`). It decides the convolution rules of
            :mod:`memfit.estimate.torch._cuda_conv`.
    """

    torch: str | None = None
    cuda: str | None = None
    driver: str | None = None
    module_loading: str = "lazy"
    loading_reason: str = ""
    given: tuple[str, ...] = ()
    origin: str = "defaults"
    cudnn: str | None = None

    def describe(self) -> str:
        """One line: the loading mode and the versions it assumed.

        >>> parse_runtime("torch=1.10.0,cuda=11.2").describe()
        'eager module loading; torch 1.10.0, CUDA 11.2, driver unknown'
        """
        versions = ", ".join(
            [
                f"torch {self.torch or 'unknown'}",
                f"CUDA {self.cuda or 'unknown'}",
                f"driver {self.driver or 'unknown'}",
            ]
        )
        if self.cudnn is not None:
            versions += f", cuDNN {self.cudnn}"
        return f"{self.module_loading} module loading; {versions}"

    def to_dict(self) -> dict[str, Any]:
        """The runtime as plain data."""
        return {
            "torch": self.torch,
            "cuda": self.cuda,
            "driver": self.driver,
            "module_loading": self.module_loading,
            "loading_reason": self.loading_reason,
            "given": list(self.given),
            "origin": self.origin,
            "cudnn": self.cudnn,
        }


def _loading(
    torch: str | None, cuda: str | None, driver: str | None, loading: str | None
) -> tuple[str, str]:
    """The module loading mode and why, from what is known (see the module's rules)."""
    if loading is not None:
        return loading, f"CUDA_MODULE_LOADING={loading.upper()} (given)"
    cuda_v = parse_version(cuda, "cuda") if cuda is not None else None
    torch_v = parse_version(torch, "torch") if torch is not None else None
    driver_v = parse_version(driver, "driver") if driver is not None else None
    if cuda_v is not None and cuda_v < (11, 7):
        return "eager", f"CUDA {cuda} has no lazy loading (it came with 11.7)"
    if driver_v is not None and driver_v[0] < 515:
        return "eager", f"driver {driver} is older than R515, which lazy loading needs"
    if cuda_v is not None and cuda_v >= (12, 2):
        return "lazy", f"lazy is CUDA {cuda}'s default (from 12.2)"
    if torch_v is not None and torch_v >= (1, 13):
        return "lazy", f"torch {torch} sets CUDA_MODULE_LOADING=LAZY when unset (from 1.13)"
    if torch_v is not None:
        return "eager", f"torch {torch} leaves CUDA's eager default (before 1.13)"
    return "lazy", "no versions known: lazy, the default of torch 1.13+ and of CUDA 12.2+"


def runtime_from_versions(
    torch: str | None = None,
    cuda: str | None = None,
    driver: str | None = None,
    module_loading: str | None = None,
    *,
    given: tuple[str, ...] = (),
    origin: str = "defaults",
    cudnn: str | None = None,
) -> Runtime:
    """A :class:`Runtime` with its loading mode decided from the versions.

    Raises:
        ConfigError: When a version or the loading mode is malformed (the key is named).
    """
    loading = None
    if module_loading is not None:
        hint = "CUDA_MODULE_LOADING=LAZY loads kernels on first use, EAGER at start"
        require_instance(
            "runtime.module_loading", module_loading, str, what="'lazy' or 'eager'", hint=hint
        )
        if module_loading.strip().lower() not in _LOADING_NAMES:
            raise ConfigError(
                f"runtime.module_loading must be 'lazy' or 'eager', not {module_loading!r}",
                key_path="runtime.module_loading",
                hint=hint,
            )
        loading = _LOADING_NAMES[module_loading.strip().lower()]
    for key, value in (("torch", torch), ("cuda", cuda), ("driver", driver), ("cudnn", cudnn)):
        if value is not None:
            parse_version(value, key)
    mode, reason = _loading(torch, cuda, driver, loading)
    return Runtime(
        torch=torch,
        cuda=cuda,
        driver=driver,
        module_loading=mode,
        loading_reason=reason,
        given=given,
        origin=origin,
        cudnn=cudnn,
    )


def parse_runtime(
    value: Runtime | Mapping[str, Any] | str | None,
    *,
    installed: Mapping[str, str | None] | None = None,
    installed_origin: str = "installed",
) -> Runtime:
    """The target's runtime from what the caller gave, the rest from ``installed``.

    Args:
        value: A :class:`Runtime` (returned as it is), a mapping with any of
            :data:`RUNTIME_KEYS`, the CLI's ``key=value,key=value`` text, or ``None``.
        installed: The versions to assume for keys ``value`` leaves out (the installed
            torch's, read by the caller); ``None``: unknown.
        installed_origin: How to name where those came from.

    Returns:
        The runtime, its module loading decided from the versions unless given. When the
        caller names any version, the keys it leaves out are unknown (an installed torch
        says nothing of a target that runs CUDA 11.2); otherwise ``installed`` fills them.

    Raises:
        ConfigError: For an unknown key, a value that is not a version, a loading mode
            other than lazy/eager, or text that is not ``key=value`` pairs.

    >>> parse_runtime(None, installed={"torch": "2.13.0", "cuda": None}).describe()
    'lazy module loading; torch 2.13.0, CUDA unknown, driver unknown'
    >>> parse_runtime("cuda=11.2,frobnicate=1")
    Traceback (most recent call last):
    memfit.errors.ConfigError: runtime.frobnicate: unknown runtime key 'frobnicate'
    """
    if isinstance(value, Runtime):
        return value
    given: dict[str, Any]
    if value is None:
        given = {}
    elif isinstance(value, str):
        given = _parse_text(value)
    elif isinstance(value, Mapping):
        given = dict(value)
    else:
        raise ConfigError(
            f"runtime must be a mapping or 'key=value,...' text, not {type(value).__name__}",
            key_path="runtime",
            hint='runtime={"torch": "1.10.0", "cuda": "11.2", "module_loading": "eager"}',
        )
    for key in given:
        if key not in RUNTIME_KEYS:
            raise ConfigError(
                f"unknown runtime key {key!r}",
                key_path=f"runtime.{key}",
                hint=f"the keys are {', '.join(RUNTIME_KEYS)}",
            )
    for key, item in given.items():
        if item is not None and not isinstance(item, str):
            raise ConfigError(
                f"runtime.{key} must be text, not {type(item).__name__} {item!r}",
                key_path=f"runtime.{key}",
                hint="write versions as text: torch='1.10.0', cuda='11.2'",
            )
    names_versions = any(given.get(k) is not None for k in ("torch", "cuda", "driver"))
    # A caller who names any version describes a target: the installed versions say nothing
    # of it, so the keys it leaves out are unknown. Otherwise the installed ones stand in.
    base: Mapping[str, str | None] = {} if installed is None or names_versions else installed
    loading = given.get("module_loading")
    if loading is None:
        loading = base.get("module_loading")
    return runtime_from_versions(
        given.get("torch", base.get("torch")),
        given.get("cuda", base.get("cuda")),
        given.get("driver", base.get("driver")),
        loading,
        given=tuple(k for k in RUNTIME_KEYS if k in given),
        origin="given" if names_versions or installed is None else installed_origin,
        cudnn=given.get("cudnn", base.get("cudnn")),
    )


def _parse_text(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for index, part in enumerate(text.split(",")):
        item = part.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise ConfigError(
                f"runtime item {index + 1} is not key=value: {item!r}",
                key_path="runtime",
                hint="write --runtime torch=1.10.0,cuda=11.2,module_loading=eager",
            )
        if key in out:
            raise ConfigError(
                f"runtime key {key!r} is given twice",
                key_path=f"runtime.{key}",
                hint="give each key once",
            )
        out[key] = value
    return out


@dataclass(frozen=True)
class ContextEstimate:
    """What the CUDA context of one process costs on one GPU.

    Attributes:
        bytes: The context, in bytes: what ``nvidia-smi`` shows for a process beyond the
            caching allocator's segments, with the kernel images its step loads
            (``kernel_images_bytes``; a process that ran no kernel holds ``bytes -
            kernel_images_bytes``).
        runtime: The runtime it assumed.
        arch: The GPU architecture it assumed (``None``: unknown).
        source: Where the figure comes from (:data:`CONTEXT_SOURCES`).
        unknowns: What the figure leaves out, for an estimate's deviations.
        kernel_images_bytes: The part of ``bytes`` that the kernels a step runs load at
            first use (lazy loading; 0 with eager loading, which loads them at start, or
            when the step's kernels were not asked for).
        basis: How the figure was obtained (:data:`memfit.core.bands.BASES`): ``fitted``
            to readings of its kind (the eager contexts by build, the lazy one on Hopper,
            measured on the project's H100, and a context that ran no step), ``assumed``
            where the kernel images of another architecture stand in for its own (a lazy
            step's context on any GPU but Hopper), ``analytic`` on the host (none).
    """

    bytes: int
    runtime: Runtime
    arch: str | None
    source: str
    unknowns: list[str] = field(default_factory=list)
    kernel_images_bytes: int = 0
    basis: str = "fitted"

    def describe(self) -> str:
        """The breakdown's label: the figure and the runtime it assumed."""
        arch = self.arch or "unknown architecture"
        return f"CUDA context {format_bytes(self.bytes)} ({self.runtime.describe()}; {arch})"

    def to_dict(self) -> dict[str, Any]:
        """The estimate as plain data."""
        return {
            "bytes": self.bytes,
            "runtime": self.runtime.to_dict(),
            "arch": self.arch,
            "source": self.source,
            "unknowns": list(self.unknowns),
            "kernel_images_bytes": self.kernel_images_bytes,
            "basis": self.basis,
        }


#: Why a JAX process's kernel images are assumed, listed with a JAX context estimate.
_JAX_IMAGES_UNKNOWN = (
    "the kernel images of a JAX step: XLA's compiled modules, the cuBLAS/cuBLASLt kernels its "
    "GEMMs and its autotuner's candidates load, cuDNN's for convolutions (no torch kernels). "
    "No public reading of a JAX process after a step, preallocation off, on a named card was "
    "found to fit them on (jax-ml/jax, brax, flax and PureJaxRL issues, JAX's docs; the JAX "
    "readings found are of a started backend, no step: tests/data/published_truth/"
    "cuda_context/readings.yaml), so memfit counts torch's H100 figure (227 MiB) for them, "
    "as an assumption: more than a JAX step may load (it does not load torch's kernels), "
    "perhaps less where XLA's autotuner tries many GEMM algorithms"
)

#: What no public source let memfit size, listed with every context estimate.
_LIBRARY_UNKNOWNS = (
    "kernel images of CUDA libraries loaded at first use (cuBLAS/cuBLASLt at the first "
    "matmul, cuDNN at the first convolution, NCCL at the first collective): with lazy "
    "loading memfit counts what the project's H100 capture loaded (torch 2.11+cu130, "
    "227 MiB), which no public measurement states for other architectures or versions; with "
    "eager loading each library's whole image for the GPU's architecture is loaded, which no "
    "public measurement found states with its versions, so it is not counted"
)


def eager_context(spec: GpuSpec | None, runtime: Runtime) -> tuple[int, str]:
    """The eager context's bytes by the build's CUDA and the GPU (``rules_torch.json``,
    ``context.eager_mib``), and how the CUDA version was known.

    The context holds every kernel the process links for the GPU's architecture, so it grows
    with the build: a CUDA 10 build of torch 1.6-1.8 takes 720-880 MiB, a CUDA 11.0-11.6 build
    1,341 MiB on a V100 and up to 1,690 MiB on Ampere, a CUDA 11.7 or later build (torch 1.13
    on) 900 MiB (their sources are the rows'). A runtime that names torch but not CUDA takes
    the CUDA of torch's default wheel (``wheel.cuda``: 10.2 for torch 1.5 to 1.12, 11.7 for
    1.13-2.0, 12.1 and later after).

    >>> eager_context(None, parse_runtime("torch=1.7.1"))[0] == 880 * MiB
    True
    >>> eager_context(None, parse_runtime("torch=1.10.0,cuda=11.2"))[0] == EAGER_CONTEXT_BYTES
    True
    """
    cuda = runtime.cuda
    how = f"CUDA {cuda} (given)" if cuda is not None else "CUDA unknown"
    if cuda is None and runtime.torch is not None:
        wheel = rule("torch", "wheel.cuda", torch=parse_version(runtime.torch, "torch"))
        if wheel is not None:
            cuda = str(wheel)
            how = f"CUDA {cuda} (torch {runtime.torch}'s default wheel)"
    capability = None if spec is None else spec.compute_capability
    mib = rule(
        "torch",
        "context.eager_mib",
        cuda=None if cuda is None else parse_version(cuda, "cuda"),
        capability=capability,
    )
    return int(mib) * MiB, f"eager context of a {how} build: {int(mib):,} MiB"


def cuda_context(
    spec: GpuSpec | None,
    runtime: Runtime | None = None,
    *,
    kernels: bool = True,
    framework: str = "torch",
) -> ContextEstimate:
    """The CUDA context a process takes on ``spec`` with ``runtime``.

    With lazy loading the context is the one CUDA holds once started
    (:func:`lazy_started_context`: a fixed part and the card's local-memory reservation)
    plus, when ``kernels``, the kernel images a training
    step loads at first use (:data:`LAZY_KERNEL_IMAGES_BYTES`: torch's kernels, cuBLAS's and
    cuDNN's; the larger figure, as a plan does not know which libraries the step calls). With
    eager loading everything is loaded at start: the larger of the eager figure and the lazy
    one.

    Args:
        spec: The GPU (``None``: unknown; ``arch="cpu"``: the host, no context).
        runtime: The target's runtime (``None``: lazy loading, versions unknown).
        kernels: Count the kernel images a step loads (``False``: a process that started
            CUDA and ran nothing on this device, such as a stray context on device 0).
        framework: ``"torch"`` or ``"jax"`` (:data:`FRAMEWORKS`). The kernel images are a
            class of their own per framework: ``fitted`` where calibration readings of a step
            in a process of that framework exist for the architecture
            (:data:`_IMAGES_FITTED_ON`: torch on Hopper), else ``assumed`` (the widest band).
            A JAX process loads XLA's compiled modules and the libraries they call, which no
            reading found isolates, so its images take torch's figure as an assumption on
            every card; the context once started is the same for both (the JAX readings of
            a started backend check it: docs/benchmarks.md, "The CUDA context").

    Returns:
        The estimate with its sources.

    Raises:
        ConfigError: When ``framework`` is not one of :data:`FRAMEWORKS`.

    >>> from memfit.hardware.catalog import gpu
    >>> lazy = cuda_context(gpu("V100"), parse_runtime("torch=2.4.1"))
    >>> eager = cuda_context(gpu("V100"), parse_runtime("torch=1.10.0,cuda=11.2"))
    >>> lazy.bytes == 552 * MiB, eager.bytes == 1341 * MiB
    (True, True)
    >>> cuda_context(gpu("H100"), parse_runtime("torch=2.11.0,cuda=13.0")).bytes // MiB
    760
    >>> cuda_context(gpu("V100"), parse_runtime("torch=2.4.1"), kernels=False).bytes // MiB
    325
    >>> h100 = gpu("H100")
    >>> lazy.basis, cuda_context(h100).basis, cuda_context(h100, framework="jax").basis
    ('assumed', 'fitted', 'assumed')
    """
    require_choice("framework", framework, FRAMEWORKS)
    rt = runtime if runtime is not None else runtime_from_versions()
    arch = None if spec is None else spec.arch
    if arch == "cpu":
        return ContextEstimate(
            0, rt, arch, "planning for the host: no CUDA context", basis="analytic"
        )
    images = LAZY_KERNEL_IMAGES_BYTES if kernels else 0
    lazy = lazy_started_context(spec) + images
    if rt.module_loading == "eager":
        eager, how = eager_context(spec, rt)
        return ContextEstimate(
            max(lazy, eager),
            rt,
            arch,
            f"{how}; {CONTEXT_SOURCES['eager']}",
            [_LIBRARY_UNKNOWNS],
            images if lazy > eager else 0,
        )
    # the kernel images are fitted per framework and architecture (torch's on the H100 only):
    # elsewhere they are assumed
    fitted_here = arch in _IMAGES_FITTED_ON[framework]
    basis = "assumed" if images and not fitted_here else "fitted"
    unknowns = [_LIBRARY_UNKNOWNS] + ([_JAX_IMAGES_UNKNOWN] if framework == "jax" else [])
    return ContextEstimate(lazy, rt, arch, CONTEXT_SOURCES["lazy"], unknowns, images, basis)
