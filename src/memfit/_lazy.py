"""Import a framework on first use, with one error and one install hint for all integrations."""

from __future__ import annotations

import importlib
from types import ModuleType

from memfit.errors import BackendUnavailable

__all__ = ["require"]

#: Package to install for each top-level module an integration needs.
_PIP: dict[str, str] = {
    "brax": "pip install brax (it brings jax, flax, optax and mujoco)",
    "jax": "pip install jax",
    "lightning": "pip install lightning",
    "transformers": "pip install transformers",
    "gymnasium": "pip install gymnasium",
    "isaaclab": "install Isaac Lab (https://isaac-sim.github.io/IsaacLab), which needs Isaac Sim",
    "torch": "pip install torch",
    "optuna": "pip install 'memfit[optuna]' (or pip install optuna)",
    "ray": "pip install 'memfit[ray]' (or pip install 'ray[tune]')",
    "prometheus_client": "pip install memfit[prometheus] (prometheus-client)",
    "skrl": "pip install memfit[skrl] (skrl)",
    "tensorboard": "pip install memfit[tensorboard] (tensorboard)",
}


def require(module: str) -> ModuleType:
    """Import ``module``, or say which package to install.

    Args:
        module: A dotted module name (``"lightning.pytorch"``).

    Returns:
        The module.

    Raises:
        BackendUnavailable: When it cannot be imported; the hint says what to install.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".")[0]
        missing = (getattr(exc, "name", None) or top).split(".")[0]
        if missing != top and missing in _PIP:
            # The framework is there but one of its own requirements is not (torch under
            # lightning or transformers): name the package that is really missing.
            raise BackendUnavailable(
                f"{module} needs {missing}, which is not installed ({exc})",
                hint=_PIP[missing],
            ) from exc
        raise BackendUnavailable(
            f"{module} is not installed ({exc})",
            hint=_PIP.get(top, f"pip install {top}"),
        ) from exc
