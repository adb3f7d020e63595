"""The registry of workload families: what each family declares, in one place per family.

A family is one module of :mod:`memfit.core.families` that defines ``FAMILY = Family(...)``:
its name, the workload section that holds its own settings and that section's schema, the
names it reads from knobs or settings, the workload fields it cannot do without, its memory
terms, and what of its state may live on the device or in host RAM (a replay buffer). The
workload schema (:mod:`memfit.core.workload`) and the planner (:mod:`memfit.core.plan`)
consult the registry instead of naming families, so a new family (SAC with a replay buffer,
say) is one new module; :func:`register` also takes a family defined outside memfit.

>>> from memfit.core.families import family_names
>>> family_names()
['custom', 'offpolicy', 'ppo', 'sac', 'vision_inference']
>>> get_family("ppo").section
'ppo'
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from memfit.errors import ConfigError, did_you_mean

#: A workload, as the families receive it (:class:`memfit.core.workload.Workload`). The
#: registry does not import the schema: the schema asks the registry for its families.
Workload = Any

__all__ = [
    "Fallback",
    "Family",
    "FamilyTerms",
    "Term",
    "device_terms",
    "family_names",
    "get_family",
    "register",
    "registered",
]

#: ``terms(workload, values, on_device=...)`` -> the device terms and the host bytes.
FamilyTerms = Callable[..., tuple[list["Term"], int]]


@dataclass(frozen=True)
class Term:
    """A named memory term and the buffers that make it up (bytes each).

    Attributes:
        name: The term's name in the breakdown (``"rollout_buffer"``).
        tensors: Sizes of the separate buffers, for the allocator model.
        outside_allocator: ``True`` for device memory the framework's allocator does not
            hand out (a simulator or renderer in the job's process): no allocator slack, and
            not inside JAX's preallocated pool.
        basis: How the figure was obtained (:data:`memfit.core.bands.BASES`): a family's
            formula is ``analytic``; a term from a compile, a trace, a measurement or a fit
            says so where it is made, and the plan carries it (``Plan.sources``).
    """

    name: str
    tensors: tuple[int, ...]
    outside_allocator: bool = False
    basis: str = "analytic"

    @property
    def nbytes(self) -> int:
        """Total bytes of the term."""
        return sum(self.tensors)


@dataclass(frozen=True)
class Fallback:
    """One change that may make a workload fit when its requested configuration does not.

    Attributes:
        label: What the change is, for humans (``"replay buffer in host RAM"``).
        changes: The workload keys it sets, as a nested mapping merged over the workload
            (``{"replay": {"placement": "host"}}``).
        unpin: Knobs whose pinned value the change releases (``("buffer_size",)``: let the
            planner choose a smaller buffer).
    """

    label: str
    changes: Mapping[str, Any] = field(default_factory=dict)
    unpin: tuple[str, ...] = ()


def _no_names(_workload: Workload) -> tuple[str, ...]:
    return ()


@dataclass(frozen=True)
class Family:
    """What one workload family declares.

    Attributes:
        name: The ``family:`` value (``"ppo"``).
        summary: One line for ``docs/workload.md`` and error hints.
        terms: ``terms(workload, values, *, on_device: bool) -> (terms, host_bytes)``: the
            memory terms per device at these knob values, and the host RAM the job needs
            (``on_device`` says where the placeable state lives, for families that have one).
        section: The workload key that holds the family's own settings (``"ppo"``,
            ``"replay"``, ``"vision"``, ``"terms"``), or ``None``.
        schema: The model of that section (its defaults apply when the section is absent).
        requires: ``(workload field, message)`` pairs: fields the family cannot do without.
        required_names: ``workload -> names`` the family reads from knobs or settings.
        key: ``workload -> str``: the family and its layout (``"ppo/brax"``), for rules that
            depend on the layout.
        placement: ``workload -> "gpu" | "host" | "auto"``: where the family's placeable
            state lives (``None``: everything on the device).
        placement_knob: The name under which a plan reports the chosen placement
            (``"replay_placement"``) when the workload lets the planner choose.
        fallbacks: ``workload -> [Fallback, ...]``: changes to try when the requested
            configuration does not fit.
        check: ``workload -> message | None``: a family's own consistency rule (the
            networks it names exist), run when the workload is validated.
    """

    name: str
    summary: str
    terms: FamilyTerms
    section: str | None = None
    schema: type[Any] | None = None
    requires: tuple[tuple[str, str], ...] = ()
    required_names: Callable[[Workload], tuple[str, ...]] = _no_names
    key: Callable[[Workload], str] | None = None
    placement: Callable[[Workload], str] | None = None
    placement_knob: str | None = None
    fallbacks: Callable[[Workload], list[Fallback]] | None = None
    check: Callable[[Workload], str | None] | None = None

    def family_key(self, workload: Workload) -> str:
        """The family and its layout (``"ppo/brax"``), or the bare name."""
        return self.key(workload) if self.key is not None else self.name

    def section_of(self, workload: Workload) -> Any:
        """The workload's section for this family, or the schema's defaults."""
        if self.section is None:
            return None
        value = getattr(workload, self.section, None)
        if value is None and self.schema is not None:
            return self.schema()
        return value

    def placement_of(self, workload: Workload) -> str:
        """Where the placeable state lives: ``"gpu"``, ``"host"`` or ``"auto"``."""
        return self.placement(workload) if self.placement is not None else "gpu"


_REGISTRY: dict[str, Family] = {}


def device_terms(fn: Callable[..., list[Term]]) -> FamilyTerms:
    """A family's ``terms`` for a family whose terms all live on the device:
    ``fn(workload, values)`` with no host bytes and no placement choice."""

    def family_terms(
        workload: Workload, values: Mapping[str, int], *, on_device: bool = True
    ) -> tuple[list[Term], int]:
        return fn(workload, values), 0

    return family_terms


def register(family: Family, *, replace: bool = False) -> Family:
    """Add a family to the registry (the built-in ones register when imported).

    Raises:
        ConfigError: When another family of that name is registered and ``replace`` is off.
    """
    if family.name in _REGISTRY and not replace and _REGISTRY[family.name] is not family:
        raise ConfigError(
            f"a workload family named {family.name!r} is already registered",
            key_path="family",
            hint="pick another name, or pass replace=True",
        )
    _REGISTRY[family.name] = family
    return family


#: Modules of this package that hold no family.
_NOT_FAMILIES = frozenset({"common", "registry"})
_discovered = False


def _discover() -> None:
    """Import every built-in family module once (each registers its ``FAMILY``).

    The modules are found by name in this package, as plugins are: the registry imports no
    family (they import it), so the schema can ask the registry without a circle."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    package = __name__.rpartition(".")[0]
    for info in pkgutil.iter_modules(importlib.import_module(package).__path__):
        if info.name not in _NOT_FAMILIES and not info.name.startswith("_"):
            importlib.import_module(f"{package}.{info.name}")


def registered() -> dict[str, Family]:
    """Every registered family by name (a copy)."""
    _discover()
    return dict(_REGISTRY)


def family_names() -> list[str]:
    """Names of the registered families, sorted."""
    return sorted(registered())


def get_family(name: str) -> Family:
    """The registered family ``name``.

    Raises:
        ConfigError: When no family has that name (with the nearest name).
    """
    found = _REGISTRY.get(name)
    if found is None:
        _discover()
        found = _REGISTRY.get(name)
    if found is None:
        known = sorted(_REGISTRY)
        raise ConfigError(
            f"unknown family {name!r}",
            key_path="family",
            hint=did_you_mean(name, known, otherwise="known: " + ", ".join(known)),
        )
    return found
