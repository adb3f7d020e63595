"""The software installed here, as the default target runtime of a plan or an estimate.

``memfit.hardware.runtime`` is pure: it is told the target's torch, CUDA and driver versions.
When the caller names none, the target is assumed to run what this machine has installed:
the installed torch's version (from its package metadata, so torch is not imported for it),
the CUDA it was built with (``torch.version.cuda`` where torch is already imported, else the
wheel's local tag such as ``+cu121``; a ``+cpu`` build names none) and a
``CUDA_MODULE_LOADING`` set in this environment.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from typing import Any

from memfit.hardware.runtime import Runtime, parse_runtime

__all__ = ["installed_jaxlib", "installed_versions", "target_runtime"]

_CU_TAG = re.compile(r"\+cu(\d+)(\d)$")


def installed_versions(env: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """This machine's torch and CUDA versions and module-loading setting (``None``: unknown).

    Args:
        env: The environment to read ``CUDA_MODULE_LOADING`` from (default ``os.environ``).
    """
    from importlib import metadata

    environ = os.environ if env is None else env
    out: dict[str, str | None] = {"torch": None, "cuda": None, "driver": None}
    try:
        text = metadata.version("torch")
    except metadata.PackageNotFoundError:
        text = None
    if text is not None:
        out["torch"] = text.split("+", 1)[0]
        tag = _CU_TAG.search(text)
        if tag is not None:
            out["cuda"] = f"{tag.group(1)}.{tag.group(2)}"
    torch = sys.modules.get("torch")
    version = getattr(torch, "version", None)
    cuda = getattr(version, "cuda", None)
    if isinstance(cuda, str) and cuda:
        out["cuda"] = cuda
    loading = environ.get("CUDA_MODULE_LOADING", "").strip().lower()
    out["module_loading"] = loading if loading in ("lazy", "eager") else None
    return out


def installed_jaxlib() -> str | None:
    """This machine's jaxlib version, from its package metadata (jax is not imported), or
    ``None`` where jaxlib is not installed."""
    from importlib import metadata

    try:
        return metadata.version("jaxlib")
    except metadata.PackageNotFoundError:
        return None


def target_runtime(value: Runtime | Mapping[str, Any] | str | None) -> Runtime:
    """The target's runtime: what the caller gave, the rest from this machine's software.

    Raises:
        ConfigError: For an unknown key or a malformed value (the key is named).
    """
    installed = installed_versions()
    origin = f"installed torch {installed['torch']}" if installed["torch"] else "defaults"
    return parse_runtime(value, installed=installed, installed_origin=origin)
