"""Analytic memory models, one module per workload family.

A family is one module of this package that defines ``FAMILY = register(Family(...))``
(:mod:`memfit.core.families.registry`, which finds the built-in ones); its terms are added up
by :func:`memfit.core.evaluate.evaluate`. The names below are served from those two modules
on first use, so that importing the registry (as the workload schema does) does not import
every family.

>>> from memfit.core.families import family_names
>>> "ppo" in family_names()
True
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "Evaluation",
    "Fallback",
    "Family",
    "Term",
    "evaluate",
    "family_for",
    "family_names",
    "family_terms",
    "get_family",
    "register",
]

_HOMES = {
    "Evaluation": "memfit.core.evaluate",
    "evaluate": "memfit.core.evaluate",
    "family_for": "memfit.core.evaluate",
    "family_terms": "memfit.core.evaluate",
    "Fallback": "memfit.core.families.registry",
    "Family": "memfit.core.families.registry",
    "Term": "memfit.core.families.registry",
    "family_names": "memfit.core.families.registry",
    "get_family": "memfit.core.families.registry",
    "register": "memfit.core.families.registry",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
