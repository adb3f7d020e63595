"""Applying allocator settings for PyTorch and JAX in this process, before initialisation.

PyTorch reads ``PYTORCH_CUDA_ALLOC_CONF`` / ``PYTORCH_ALLOC_CONF`` once, when CUDA is first
used; JAX reads ``XLA_PYTHON_CLIENT_*`` when it starts its GPU backend. Set later, they silently
do nothing. This module is the applying side: :func:`configure` writes settings into the
environment and refuses once torch or JAX has started on the GPU
(:func:`torch_cuda_initialized`, :func:`jax_gpu_started`); :func:`installed_torch_version`
and :func:`check_environment` read what only the running process knows (the installed torch,
``os.environ``).

What the settings mean (reading, validation, recommendations, shell snippets) lives in one pure
place, :mod:`memfit.allocator.settings`; import those names from there.

>>> [p.code for p in check_environment({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:true"})]
['bad-value']
>>> configure(jax_preallocate=False, environ={})
{'XLA_PYTHON_CLIENT_PREALLOCATE': 'false'}
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Literal

from memfit._checks import require, require_mapping
from memfit.allocator.settings_check import (
    Problem,
    check_jax_env,
    check_torch_conf,
    parse_torch_conf,
)
from memfit.allocator.settings_check import check_environment as _check_environment
from memfit.allocator.xla_fraction import FRACTION_VARIABLES, xla_fraction_variable
from memfit.errors import ConfigError

__all__ = [
    "check_environment",
    "check_jax_install",
    "configure",
    "installed_torch_version",
    "jax_build",
    "jax_fraction_name",
    "jax_gpu_started",
    "nvidia_gpu_present",
    "torch_cuda_initialized",
]


def check_environment(env: Mapping[str, str] | None = None) -> list[Problem]:
    """:func:`memfit.allocator.settings.check_environment` of ``env`` (default: this
    process's ``os.environ``).

    >>> [p.code for p in check_environment({"XLA_PYTHON_CLIENT_MEM_FRACTION": "2"})]
    ['bad-value']
    """
    return _check_environment(os.environ if env is None else env)


def installed_torch_version() -> tuple[int, int] | None:
    """The installed torch's ``(major, minor)`` from its package metadata (torch is not
    imported), or ``None`` when torch is not installed."""
    from importlib import metadata

    try:
        text = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None
    match = re.match(r"(\d{1,9})\.(\d{1,9})", text, re.ASCII)
    return (int(match.group(1)), int(match.group(2))) if match else None


#: Packages whose presence means jax can use an NVIDIA GPU (``pip install "jax[cuda12]"``
#: installs a plugin; jaxlib builds before the plugins carried ``+cuda`` in their version).
_JAX_CUDA_PLUGINS: tuple[str, ...] = ("jax-cuda12-plugin", "jax-cuda13-plugin", "jax-cuda11-plugin")


def jax_fraction_name() -> tuple[str, str]:
    """The name of XLA's pool fraction to recommend here, and why:
    :func:`memfit.allocator.xla_fraction.xla_fraction_variable`, the one place memfit decides
    it."""
    return xla_fraction_variable()


def jax_build() -> str | None:
    """``"cuda"`` when the installed jax can use an NVIDIA GPU, ``"cpu"`` when it is the
    CPU-only build, ``None`` when jax is not installed (package metadata; nothing imported)."""
    from importlib import metadata

    try:
        jaxlib = metadata.version("jaxlib")
    except metadata.PackageNotFoundError:
        return None
    if "cuda" in jaxlib:
        return "cuda"
    for name in _JAX_CUDA_PLUGINS:
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        return "cuda"
    return "cpu"


def nvidia_gpu_present(
    proc_gpus: Path = Path("/proc/driver/nvidia/gpus"), device: Path = Path("/dev/nvidia0")
) -> bool:
    """Whether this machine has an NVIDIA GPU with its driver loaded (Linux: the driver's
    ``/proc`` entries or ``/dev/nvidia0``; elsewhere whether ``nvidia-smi`` is on the PATH)."""
    import shutil

    # the driver's /proc entries may not be readable: the device node below decides then
    with contextlib.suppress(OSError):
        if proc_gpus.is_dir() and any(proc_gpus.iterdir()):
            return True
    if device.exists():
        return True
    return not sys.platform.startswith("linux") and shutil.which("nvidia-smi") is not None


def check_jax_install(
    *, gpu_present: bool | None = None, build: str | Literal["read"] | None = "read"
) -> list[Problem]:
    """A warning when jax is the CPU-only build on a machine with an NVIDIA GPU: JAX (and
    Brax) then trains on the CPU without a word, and no XLA setting does anything.

    Args:
        gpu_present: Whether the machine has an NVIDIA GPU; default :func:`nvidia_gpu_present`.
        build: The jax build (``"cuda"``, ``"cpu"``, ``None`` for none); default
            :func:`jax_build`.

    >>> [p.code for p in check_jax_install(gpu_present=True, build="cpu")]
    ['cpu-only-jax']
    >>> check_jax_install(gpu_present=False, build="cpu")
    []
    """
    have = jax_build() if build == "read" else build
    if have != "cpu":
        return []
    if not (nvidia_gpu_present() if gpu_present is None else gpu_present):
        return []
    return [
        Problem(
            "cpu-only-jax",
            "warning",
            "jax",
            None,
            "this machine has an NVIDIA GPU but the installed jax is the CPU-only build: JAX "
            "and Brax would run on the CPU and the XLA settings do nothing",
            'pip install -U "jax[cuda12]"',
        )
    ]


# -- applying in-process -------------------------------------------------------------------------


def torch_cuda_initialized() -> bool:
    """Whether torch is imported and has initialised CUDA in this process (imports nothing)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    cuda = getattr(torch, "cuda", None)
    is_init = getattr(cuda, "is_initialized", None)
    return bool(is_init()) if callable(is_init) else False


def jax_gpu_started() -> bool:
    """Whether jax is imported and has started a GPU backend in this process (imports nothing).

    Uses ``jax._src.xla_bridge`` (private: ``backends_are_initialized()`` and the
    ``_backends`` mapping), guarded so a JAX that moved them reads as "not started".
    """
    if "jax" not in sys.modules:
        return False
    bridge = sys.modules.get("jax._src.xla_bridge")
    if bridge is None:
        return False
    started = getattr(bridge, "backends_are_initialized", None)
    try:
        if callable(started) and not started():
            return False
        backends = getattr(bridge, "_backends", None)
        if not isinstance(backends, Mapping):
            return False
        for name, client in backends.items():
            platform = str(getattr(client, "platform", name)).lower()
            if platform in ("gpu", "cuda", "rocm") or str(name).lower() in ("gpu", "cuda", "rocm"):
                return True
    except Exception:  # a JAX internals change must not break configure()
        return False
    return False


def configure(
    *,
    expandable_segments: bool | None = None,
    max_split_size_mb: int | None = None,
    garbage_collection_threshold: float | None = None,
    roundup_power2_divisions: int | str | None = None,
    backend: str | None = None,
    jax_preallocate: bool | None = None,
    jax_mem_fraction: float | None = None,
    jax_allocator: str | None = None,
    environ: MutableMapping[str, str] | None = None,
) -> dict[str, str]:
    """Apply allocator settings to the environment of this process, before initialisation.

    Torch options are merged into the existing allocator string (an option given here
    replaces the same option there) and written to both ``PYTORCH_ALLOC_CONF`` and
    ``PYTORCH_CUDA_ALLOC_CONF``, so every PyTorch version reads the same value. ``None``
    leaves a setting as it is.

    Args:
        expandable_segments: Torch ``expandable_segments``.
        max_split_size_mb: Torch ``max_split_size_mb`` (more than 20).
        garbage_collection_threshold: Torch ``garbage_collection_threshold`` in (0, 1).
        roundup_power2_divisions: A power of two, or a list text such as
            ``"[256:1,>:4]"``.
        backend: ``"native"`` or ``"cudaMallocAsync"``.
        jax_preallocate: ``XLA_PYTHON_CLIENT_PREALLOCATE``.
        jax_mem_fraction: ``XLA_PYTHON_CLIENT_MEM_FRACTION`` in (0, 1] (or
            ``XLA_CLIENT_MEM_FRACTION`` where that is already the one set).
        jax_allocator: ``XLA_PYTHON_CLIENT_ALLOCATOR``.
        environ: The mapping to change; ``os.environ`` by default.

    Returns:
        The variables written, ``{name: value}``.

    Raises:
        ConfigError: When torch has already initialised CUDA or JAX has started a GPU backend
            (the settings would silently not apply), or a value is invalid (nothing is
            written then).

    >>> env = {}
    >>> written = configure(expandable_segments=True, jax_preallocate=False, environ=env)
    >>> written["PYTORCH_ALLOC_CONF"]
    'expandable_segments:True'
    >>> env["XLA_PYTHON_CLIENT_PREALLOCATE"]
    'false'
    """
    for name, value, kinds in (
        ("expandable_segments", expandable_segments, ("bool",)),
        ("max_split_size_mb", max_split_size_mb, ("int",)),
        ("garbage_collection_threshold", garbage_collection_threshold, ("number",)),
        ("roundup_power2_divisions", roundup_power2_divisions, ("int", "str")),
        ("backend", backend, ("str",)),
        ("jax_preallocate", jax_preallocate, ("bool",)),
        ("jax_mem_fraction", jax_mem_fraction, ("number",)),
        ("jax_allocator", jax_allocator, ("str",)),
    ):
        require(name, value, *kinds, optional=True)
    require_mapping("environ", environ, optional=True)
    target: MutableMapping[str, str] = os.environ if environ is None else environ
    wants_torch = any(
        v is not None
        for v in (
            expandable_segments,
            max_split_size_mb,
            garbage_collection_threshold,
            roundup_power2_divisions,
            backend,
        )
    )
    wants_jax = any(v is not None for v in (jax_preallocate, jax_mem_fraction, jax_allocator))
    if wants_torch and torch_cuda_initialized():
        raise ConfigError(
            "torch has already initialised CUDA: allocator settings would silently not apply",
            key_path="PYTORCH_ALLOC_CONF",
            hint="call memfit.configure() before the first CUDA tensor, or set the variables "
            "in the shell (memfit env)",
        )
    if wants_jax and jax_gpu_started():
        raise ConfigError(
            "JAX has already started its GPU backend: XLA_PYTHON_CLIENT_* settings would "
            "silently not apply",
            key_path="XLA_PYTHON_CLIENT_PREALLOCATE",
            hint="call memfit.configure() before the first JAX operation, or set the "
            "variables in the shell (memfit env)",
        )
    written: dict[str, str] = {}
    if wants_torch:
        updates: dict[str, str] = {}
        if expandable_segments is not None:
            updates["expandable_segments"] = "True" if expandable_segments else "False"
        if max_split_size_mb is not None:
            updates["max_split_size_mb"] = str(max_split_size_mb)
        if garbage_collection_threshold is not None:
            updates["garbage_collection_threshold"] = repr(float(garbage_collection_threshold))
        if roundup_power2_divisions is not None:
            updates["roundup_power2_divisions"] = str(roundup_power2_divisions).replace(" ", "")
        if backend is not None:
            updates["backend"] = backend
        existing = target.get("PYTORCH_ALLOC_CONF") or target.get("PYTORCH_CUDA_ALLOC_CONF") or ""
        pairs = dict(parse_torch_conf(existing)[0])
        pairs.update(updates)
        conf = ",".join(f"{k}:{v}" for k, v in pairs.items())
        problems = [
            p for p in check_torch_conf(conf) if p.severity == "error" and p.option in updates
        ]
        if problems:
            first = problems[0]
            raise ConfigError(first.message, key_path=first.option, hint=first.hint)
        written["PYTORCH_ALLOC_CONF"] = conf
        written["PYTORCH_CUDA_ALLOC_CONF"] = conf
    if wants_jax:
        jax_env: dict[str, str] = {}
        if jax_preallocate is not None:
            jax_env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "true" if jax_preallocate else "false"
        if jax_mem_fraction is not None:
            # the name already set wins (setting the other too stops a newer JAX), else the
            # one the installed jaxlib reads
            already = [name for name in FRACTION_VARIABLES if target.get(name)]
            var = already[0] if already else xla_fraction_variable()[0]
            jax_env[var] = repr(float(jax_mem_fraction))
        if jax_allocator is not None:
            jax_env["XLA_PYTHON_CLIENT_ALLOCATOR"] = jax_allocator
        errors = [p for p in check_jax_env(jax_env) if p.severity == "error"]
        if errors:
            raise ConfigError(errors[0].message, key_path=errors[0].variable, hint=errors[0].hint)
        written.update(jax_env)
    target.update(written)
    return written
