"""Allocator configuration for PyTorch and JAX, in one pure place: read, validate, recommend.

PyTorch reads ``PYTORCH_CUDA_ALLOC_CONF`` / ``PYTORCH_ALLOC_CONF`` (comma-separated
``key:value`` options) once, when CUDA is first used; JAX reads ``XLA_PYTHON_CLIENT_*`` when
it starts its GPU backend. This module holds everything memfit knows about those settings,
as functions of plain data (nothing here reads or writes the process environment, imports
torch or JAX, or applies anything; :mod:`memfit.runtime.allocator_env` applies them):

* the one reading of each setting: :func:`read_jax_env` (what JAX's client will do with
  ``XLA_PYTHON_CLIENT_PREALLOCATE``, the memory fraction and the allocator) and
  :func:`torch_allocator_options` (expandable segments and ``max_split_size`` from a torch
  string, for the allocator replay);
* validation (:mod:`memfit.allocator.settings_check`): ``check_torch_conf``, ``check_jax_env``,
  ``check_environment`` and ``check_shell`` (which also catches a variable exported twice,
  where the second silently replaces the first); every problem has a code and names the
  variable and option;
* recommendations per use (:func:`recommend`: ``training``, ``inference``, ``shared-gpu``),
  each with a one-line reason, the settings a planned workload runs with
  (:func:`workload_settings`, whose XLA fraction is the one memfit recommends everywhere:
  :func:`memfit.allocator.xla_fraction.recommended_xla_fraction`), and shell snippets
  (:func:`render_shell`).

The option table follows PyTorch's ``c10/core/AllocatorConfig`` and
``c10/cuda/CUDAAllocatorConfig.h`` (2.13): booleans are exactly ``True`` / ``False``,
``max_split_size_mb`` must be more than 20, ``garbage_collection_threshold`` in (0, 1),
``roundup_power2_divisions`` a power of two or a ``[size:divisions, ..., >:divisions]``
list. JAX's follow ``jaxlib/xla_client.py`` (0.10, ``generate_pjrt_gpu_plugin_options``):
the allocator is one of ``default``, ``platform``, ``bfc``, ``cuda_async``, ``vmm`` (read in
lower case); only ``false`` / ``False`` / ``0`` turn preallocation off (``no`` or ``FALSE``
leave it on); ``XLA_CLIENT_MEM_FRACTION`` is read first and setting both fraction variables
stops the backend from starting.

>>> read_jax_env({"XLA_PYTHON_CLIENT_PREALLOCATE": "no"}).preallocate
True
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from memfit._checks import parse_int
from memfit._plain import plain_fields
from memfit.allocator.settings_check import (
    JAX_ALLOCATORS,
    TORCH_VARIABLES,
    as_float,
    check_value,
    parse_torch_conf,
)
from memfit.allocator.xla_fraction import (
    FRACTION_VARIABLES,
    recommended_xla_fraction,
    xla_fraction_variable,
)
from memfit.errors import ConfigError
from memfit.hardware.catalog import GpuSpec

__all__ = [
    "PROFILES",
    "SHELLS",
    "JaxAllocator",
    "Recommendation",
    "Setting",
    "read_jax_env",
    "recommend",
    "render_shell",
    "torch_allocator_options",
    "workload_settings",
]


#: Use profiles :func:`recommend` knows.
PROFILES: tuple[str, ...] = ("training", "inference", "shared-gpu")

#: Shells :func:`render_shell` writes for.
SHELLS: tuple[str, ...] = ("bash", "fish", "powershell")


@dataclass(frozen=True)
class Setting:
    """One recommended environment variable.

    Attributes:
        variable: Its name.
        value: Its value.
        reason: Why, in one line.
        framework: ``"torch"`` or ``"jax"``.
    """

    variable: str
    value: str
    reason: str
    framework: str

    def to_dict(self) -> dict[str, Any]:
        """The setting as plain JSON data."""
        return plain_fields(self)


@dataclass(frozen=True)
class Recommendation:
    """Recommended settings for one use, with per-option reasons.

    Attributes:
        profile: ``"training"``, ``"inference"`` or ``"shared-gpu"``.
        settings: Environment variables to set.
        options: For the torch variable, each option with its reason.
        notes: Remarks (torch version handling, platform limits).
    """

    profile: str
    settings: tuple[Setting, ...]
    options: tuple[tuple[str, str, str], ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        """The recommendation as plain JSON data."""
        return {
            "profile": self.profile,
            "settings": [s.to_dict() for s in self.settings],
            "torch_options": [{"option": k, "value": v, "reason": r} for k, v, r in self.options],
            "notes": list(self.notes),
        }

    def environ(self) -> dict[str, str]:
        """The settings as a ``{variable: value}`` mapping."""
        return {s.variable: s.value for s in self.settings}


# -- PyTorch option strings ----------------------------------------------------------------------


# -- JAX variables ---------------------------------------------------------------------------------


# -- whole environments and shell snippets -------------------------------------------------------


# -- recommendations ------------------------------------------------------------------------------

#: The two names of XLA's pool fraction: the one JAX now documents, and the older one (read
#: by every JAX; by newer ones as a deprecated name). Both are accepted; setting both stops
#: a newer JAX's GPU backend from starting.
JAX_FRACTION_VARIABLES: tuple[str, str] = FRACTION_VARIABLES


def recommend(
    profile: str = "training",
    *,
    platform: str | None = None,
    torch_version: tuple[int, int] | None = None,
    gpu: GpuSpec | None = None,
    jax_fraction_variable: str | None = None,
) -> Recommendation:
    """Recommended allocator settings for a use.

    Args:
        profile: ``"training"`` (one job owns the GPU), ``"inference"`` (changing request
            shapes) or ``"shared-gpu"`` (several processes on one GPU).
        platform: ``"linux"``, ``"win32"``, ...; default ``sys.platform``. On Windows,
            where PyTorch has no expandable segments, ``max_split_size_mb`` takes their
            place.
        torch_version: ``(major, minor)`` of the PyTorch in use, deciding which variable
            name(s) to set; ``None`` (unknown) sets both.
            :func:`memfit.runtime.allocator_env.recommend` reads the installed version.
        gpu: The GPU, for the XLA pool fraction of ``training``
            (:func:`memfit.allocator.xla_fraction.recommended_xla_fraction`); ``None``: a
            card not named (the fraction that leaves room on every card memfit knows).
        jax_fraction_variable: The name to set the XLA pool fraction under:
            ``XLA_CLIENT_MEM_FRACTION`` (the name JAX now documents) or
            ``XLA_PYTHON_CLIENT_MEM_FRACTION`` (the older one, which every JAX reads; newer
            ones as a deprecated name); ``None``: the one the installed jaxlib reads
            (:func:`memfit.allocator.xla_fraction.xla_fraction_variable`).

    Raises:
        ConfigError: When the profile is unknown.

    >>> rec = recommend("shared-gpu", platform="linux", torch_version=(2, 13))
    >>> rec.environ()["XLA_PYTHON_CLIENT_PREALLOCATE"]
    'false'
    """
    if profile not in PROFILES:
        raise ConfigError(
            f"unknown profile {profile!r}",
            key_path="--for",
            hint="use one of " + ", ".join(PROFILES),
        )
    if jax_fraction_variable is None:
        jax_fraction_variable = xla_fraction_variable()[0]
    if jax_fraction_variable not in JAX_FRACTION_VARIABLES:
        raise ConfigError(
            f"not a JAX memory-fraction variable: {jax_fraction_variable!r}",
            key_path="jax_fraction_variable",
            hint="use " + " or ".join(JAX_FRACTION_VARIABLES),
        )
    plat = sys.platform if platform is None else platform
    version = torch_version
    windows = plat.startswith("win")
    options: list[tuple[str, str, str]] = []
    if windows:
        options.append(
            (
                "max_split_size_mb",
                "512",
                "expandable segments are not supported on Windows; not splitting blocks over "
                "512 MiB keeps large free blocks whole for large tensors",
            )
        )
    elif version is not None and version < (2, 1):
        options.append(
            (
                "max_split_size_mb",
                "512",
                f"torch {version[0]}.{version[1]} has no expandable segments (torch 2.1 on); "
                "not splitting blocks over 512 MiB keeps large free blocks whole for large "
                "tensors",
            )
        )
    else:
        options.append(
            (
                "expandable_segments",
                "True",
                "grows one segment instead of many fixed ones: the fix PyTorch's own OOM "
                "message suggests for fragmentation",
            )
        )
    if profile == "inference":
        options.append(
            (
                "roundup_power2_divisions",
                "[256:1,512:2,1024:4,>:8]",
                "rounds changing request sizes to a few size classes so freed blocks fit the "
                "next request",
            )
        )
    if profile == "shared-gpu":
        options.append(
            (
                "garbage_collection_threshold",
                "0.6",
                "gives cached, unused blocks back once 60% of the allowed memory is in use, so "
                "neighbours can have them",
            )
        )
    conf = ",".join(f"{k}:{v}" for k, v, _r in options)
    notes: list[str] = []
    settings: list[Setting] = []
    torch_reason = "; ".join(f"{k}: {r}" for k, _v, r in options)
    if version is not None and version < (2, 8):
        names: tuple[str, ...] = ("PYTORCH_CUDA_ALLOC_CONF",)
        notes.append(f"torch {version[0]}.{version[1]} reads only PYTORCH_CUDA_ALLOC_CONF")
    else:
        names = TORCH_VARIABLES
        notes.append(
            "both torch names are set to the same value: torch >= 2.8 reads PYTORCH_ALLOC_CONF "
            "(and warns about the old name up to 2.11), but some versions ignore it for CUDA "
            "(pytorch/pytorch#183387); older ones read only PYTORCH_CUDA_ALLOC_CONF"
        )
    for name in names:
        settings.append(Setting(name, conf, torch_reason, "torch"))
    if profile == "training":
        advice = recommended_xla_fraction(gpu)
        settings.append(
            Setting(
                jax_fraction_variable,
                advice.value,
                advice.reason,
                "jax",
            )
        )
    elif profile == "inference":
        settings.append(
            Setting(
                "XLA_PYTHON_CLIENT_PREALLOCATE",
                "false",
                "allocate on demand, so the server holds what its requests need rather than "
                "75% of the GPU",
                "jax",
            )
        )
    else:
        settings.append(
            Setting(
                "XLA_PYTHON_CLIENT_PREALLOCATE",
                "false",
                "do not take 75% of a GPU other processes also use",
                "jax",
            )
        )
        settings.append(
            Setting(
                jax_fraction_variable,
                ".50",
                "cap this process at half the GPU (with preallocation off it is a limit, not "
                "a reservation)",
                "jax",
            )
        )
    notes.append(
        "set these before the framework starts on the GPU: in the shell, or with "
        "memfit.configure() before importing torch/jax code that touches CUDA"
    )
    return Recommendation(profile, tuple(settings), tuple(options), tuple(notes))


def render_shell(settings: Sequence[Setting] | Mapping[str, str], shell: str = "bash") -> str:
    """The settings as lines to paste into ``shell`` (``bash``, ``fish``, ``powershell``).

    Raises:
        ConfigError: When the shell is unknown.

    >>> print(render_shell({"A": "x:1,y:[2]"}, "fish"))
    set -gx A 'x:1,y:[2]'
    """
    if shell not in SHELLS:
        raise ConfigError(
            f"unknown shell {shell!r}", key_path="--shell", hint="use bash, fish or powershell"
        )
    pairs = (
        list(settings.items())
        if isinstance(settings, Mapping)
        else [(s.variable, s.value) for s in settings]
    )
    lines = []
    for name, value in pairs:
        if shell == "bash":
            lines.append(f"export {name}={shlex.quote(value)}")
        elif shell == "fish":
            lines.append(f"set -gx {name} {shlex.quote(value)}")
        else:
            escaped = value.replace("'", "''")
            lines.append(f"$env:{name} = '{escaped}'")
    return "\n".join(lines)


# -- the one reading of each framework's settings ------------------------------------------------


@dataclass(frozen=True)
class JaxAllocator:
    """What JAX's GPU client will do with its allocator variables.

    Attributes:
        preallocate: Whether the client reserves ``fraction`` of the GPU at its start.
        fraction: Fraction of the GPU's total memory the client may use (and preallocates).
        fraction_variable: The variable the fraction came from, or ``None`` (JAX's 0.75).
        allocator: ``"default"``, ``"platform"``, ``"bfc"``, ``"cuda_async"`` or ``"vmm"``.
    """

    preallocate: bool
    fraction: float
    fraction_variable: str | None
    allocator: str

    @property
    def platform_allocator(self) -> bool:
        """``XLA_PYTHON_CLIENT_ALLOCATOR=platform``: exact allocations, no pool."""
        return self.allocator == "platform"

    @property
    def pools(self) -> bool:
        """Whether the client reserves its pool up front (preallocation with a pooling
        allocator)."""
        return self.preallocate and not self.platform_allocator


#: JAX's default pool fraction (``jaxlib/xla_client.py``; shared REFERENCE.md).
_JAX_DEFAULT_FRACTION = 0.75


def read_jax_env(env: Mapping[str, str]) -> JaxAllocator:
    """Read JAX's allocator variables from ``env`` exactly as ``jaxlib`` does.

    ``XLA_PYTHON_CLIENT_PREALLOCATE`` turns preallocation off only for ``false``, ``False``
    or ``0`` (any other text leaves it on: :func:`check_jax_env` warns about such values);
    ``XLA_CLIENT_MEM_FRACTION`` is read before the deprecated
    ``XLA_PYTHON_CLIENT_MEM_FRACTION``; the allocator name is read in lower case.

    Raises:
        ConfigError: Where JAX would refuse to start its GPU backend: both fraction variables
            set, a fraction that is not a number in (0, 1], or an unknown allocator.

    >>> read_jax_env({})
    JaxAllocator(preallocate=True, fraction=0.75, fraction_variable=None, allocator='default')
    >>> read_jax_env({"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}).preallocate
    False
    """
    new = env.get("XLA_CLIENT_MEM_FRACTION", "")
    old = env.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "")
    if new and old:
        raise ConfigError(
            "XLA_CLIENT_MEM_FRACTION and XLA_PYTHON_CLIENT_MEM_FRACTION are both set: JAX "
            "refuses to start its GPU backend",
            key_path="XLA_PYTHON_CLIENT_MEM_FRACTION",
            hint="keep XLA_CLIENT_MEM_FRACTION and unset XLA_PYTHON_CLIENT_MEM_FRACTION",
        )
    fraction = _JAX_DEFAULT_FRACTION
    variable: str | None = None
    if new or old:
        variable = "XLA_CLIENT_MEM_FRACTION" if new else "XLA_PYTHON_CLIENT_MEM_FRACTION"
        raw = new or old
        value = as_float(raw)
        if value is None or not 0 < value <= 1:
            raise ConfigError(
                f"{variable} must be a fraction in (0, 1], not {raw!r}",
                key_path=variable,
                hint=f"for instance {variable}=.75",
            )
        fraction = value
    allocator = env.get("XLA_PYTHON_CLIENT_ALLOCATOR", "default").lower() or "default"
    if allocator not in JAX_ALLOCATORS:
        raise ConfigError(
            f"unknown allocator {env.get('XLA_PYTHON_CLIENT_ALLOCATOR')!r}",
            key_path="XLA_PYTHON_CLIENT_ALLOCATOR",
            hint="use one of " + ", ".join(JAX_ALLOCATORS),
        )
    preallocate_text = env.get("XLA_PYTHON_CLIENT_PREALLOCATE", "")
    preallocate = not preallocate_text or preallocate_text not in ("false", "False", "0")
    return JaxAllocator(preallocate, fraction, variable, allocator)


def torch_allocator_options(text: str | None, variable: str) -> tuple[bool, int | None]:
    """``(expandable_segments, max_split_size in bytes)`` from a PyTorch allocator string:
    the two options the allocator replay (:mod:`memfit.estimate.torch.trace`) models.

    Raises:
        ConfigError: When the string is malformed or one of the two values is not what
            PyTorch accepts (the range of ``max_split_size_mb`` is the replay's to check).

    >>> torch_allocator_options("expandable_segments:True,max_split_size_mb:128", "X")
    (True, 134217728)
    >>> torch_allocator_options(None, "X")
    (False, None)
    """
    if not text:
        return False, None
    pairs, problems = parse_torch_conf(text, variable=variable)
    errors = [p for p in problems if p.severity == "error"]
    if errors:
        raise ConfigError(errors[0].message, key_path=variable, hint=errors[0].hint)
    expandable = False
    max_split: int | None = None
    for key, value in pairs:
        if key == "expandable_segments":
            problem = check_value(variable, key, value)
            if problem is not None:
                raise ConfigError(problem.message, key_path=variable, hint=problem.hint)
            expandable = value == "True"
        elif key == "max_split_size_mb":
            if not re.fullmatch(r"[0-9]{1,12}", value):  # isdigit() also takes '²'
                raise ConfigError(
                    f"max_split_size_mb must be a whole number of MiB, not {value!r}",
                    key_path=variable,
                    hint="write e.g. max_split_size_mb:128",
                )
            max_split = parse_int(variable, value, lo=0) * 1024 * 1024
    return expandable, max_split


def workload_settings(
    framework: str,
    *,
    jax_preallocate: bool = True,
    pool_fraction: float | None = None,
    gpu: GpuSpec | None = None,
    platform: str | None = None,
    torch_version: tuple[int, int] | None = None,
    fraction_variable: str | None = None,
) -> dict[str, str]:
    """The allocator settings a planned job runs with (``memfit plan``'s last lines,
    ``--write``'s ``environment``, ``Plan.environment``).

    JAX: preallocation and the pool's fraction exactly as the plan modelled them (the plan
    checks the job against that pool); ``pool_fraction=None`` gives memfit's recommendation
    for ``gpu``. PyTorch: the torch part of :func:`recommend` for training (expandable
    segments; the plan's allocator slack assumes classic segments, so with expandable
    segments the job holds at most what the plan predicts). On the host (``gpu.arch ==
    "cpu"``) there is no device allocator to configure. The pool's fraction goes under
    ``fraction_variable``, by default the name the installed jaxlib reads
    (:func:`memfit.allocator.xla_fraction.xla_fraction_variable`: one name everywhere).

    >>> workload_settings("jax", pool_fraction=0.9, fraction_variable="XLA_CLIENT_MEM_FRACTION")
    {'XLA_PYTHON_CLIENT_PREALLOCATE': 'true', 'XLA_CLIENT_MEM_FRACTION': '0.90'}
    >>> workload_settings("jax", jax_preallocate=False)
    {'XLA_PYTHON_CLIENT_PREALLOCATE': 'false'}
    """
    if gpu is not None and gpu.arch == "cpu":
        return {}
    if framework == "jax":
        if not jax_preallocate:
            return {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
        fraction = (
            pool_fraction if pool_fraction is not None else (recommended_xla_fraction(gpu).fraction)
        )
        name = fraction_variable or xla_fraction_variable()[0]
        return {"XLA_PYTHON_CLIENT_PREALLOCATE": "true", name: f"{fraction:.2f}"}
    rec = recommend("training", platform=platform, torch_version=torch_version)
    return {s.variable: s.value for s in rec.settings if s.framework == "torch"}
