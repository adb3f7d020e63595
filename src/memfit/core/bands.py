"""How each figure was obtained (its basis) and how far that basis has been off (its band).

Every term a plan reports carries a basis (:data:`BASES`):

* ``compiled``: XLA's compiler sized it for the card (buffers of a compiled program);
* ``traced``: a torch trace with CUDA's rules (the user's real step, fake tensors);
* ``measured``: read on a device (the process's own CUDA context, a simulator measured in
  its process);
* ``recorded``: measurements stored in the workload (their versions, platform and date);
* ``fitted``: a model fitted on published readings (the CUDA context by runtime, the
  simulator figures);
* ``analytic``: a formula over the workload's facts (a family's terms, allocator slack);
* ``assumed``: a default nobody measured.

The basis is set where a figure is made (a :class:`memfit.core.families.registry.Term`
carries it; a family's terms are ``analytic`` unless it says otherwise) and travels with it to
the plan (``Plan.sources``), its JSON and its text.

The band of a basis is how far its figures have been off on the project's truth corpus: the
lowest and highest ``truth / estimate - 1`` seen on the corpus's calibration part, derived by
``python bench/bands.py`` into ``bands.json`` beside this module (with the command and the
date); the validation part is reported in ``docs/benchmarks.md`` and never used here. A basis
may have a band per family (``analytic/ppo``: the PPO formula against Brax's compiled
measurements) where the evidence differs. A basis with no evidence gets the widest band seen
on any basis (``assumed`` always does).

>>> table = load_bands()
>>> low, high = table.interval(1000, "assumed")
>>> low <= 1000 <= high
True
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

__all__ = [
    "BASES",
    "Band",
    "BandTable",
    "basis_summary",
    "figure_band",
    "load_bands",
    "plan_interval",
    "weakest",
]

#: The ways a figure is obtained, from the most to the least direct.
BASES: tuple[str, ...] = (
    "compiled",
    "traced",
    "measured",
    "recorded",
    "fitted",
    "analytic",
    "assumed",
)

#: Terms that are not what the job needs (the unused part of JAX's preallocated pool).
NOT_NEEDED: frozenset[str] = frozenset({"jax_pool_unused"})


def weakest(a: str, b: str) -> str:
    """The less direct of two bases (a term made of both is only as sure as the weaker).

    >>> weakest("traced", "analytic")
    'analytic'
    """
    return a if BASES.index(a) >= BASES.index(b) else b


@dataclass(frozen=True)
class Band:
    """How far one basis has been off: ``truth / estimate - 1`` between ``low`` (<= 0) and
    ``high`` (>= 0), over ``cases`` calibration cases (0: no evidence, the widest band)."""

    low: float
    high: float
    cases: int = 0

    def interval(self, nbytes: int) -> tuple[int, int]:
        """``(low, high)`` bytes around an estimate of ``nbytes``."""
        return int(nbytes * (1.0 + self.low)), int(-(-nbytes * (1.0 + self.high) // 1))


@dataclass(frozen=True)
class BandTable:
    """The bands by basis (and ``basis/family``), with where they come from."""

    bands: dict[str, Band]
    command: str = ""
    derived: str = ""
    collected: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BandTable:
        bands = {
            str(k): Band(float(v["low"]), float(v["high"]), int(v.get("cases", 0)))
            for k, v in (data.get("bands") or {}).items()
        }
        return cls(
            bands=bands,
            command=str(data.get("command", "")),
            derived=str(data.get("derived", "")),
            collected={str(k): str(v) for k, v in (data.get("collected") or {}).items()},
        )

    @property
    def widest(self) -> Band:
        """The widest band seen on any basis (for a basis without evidence). A band of one
        kind of compiled program (``compiled/conv``: cuDNN's autotuning of a convolution,
        which no planned family compiles) is left out."""
        kept = [b for k, b in self.bands.items() if not k.startswith("compiled/")]
        kept = kept or list(self.bands.values())
        if not kept:
            return Band(0.0, 0.0)
        return Band(min(b.low for b in kept), max(b.high for b in kept))

    def band(self, basis: str, family: str | None = None, term: str | None = None) -> Band:
        """The band of ``basis``: the term's own (``fitted/cuda_context``) or the family's
        (``analytic/ppo/brax``) where the evidence has one, else the basis's, else the
        widest of the basis's family bands (a formula checked for one family stands for
        the unchecked ones); a basis without any evidence (and ``assumed``) gets the widest
        band seen. A ``recorded`` figure is a compile stored with the workload: without
        evidence of its own it takes the ``compiled`` band."""
        for key in (f"{basis}/{term}", f"{basis}/{family}"):
            if key in self.bands and (term is not None or family is not None):
                return self.bands[key]
        if basis in self.bands and basis != "assumed":
            return self.bands[basis]
        if basis == "recorded" and "compiled" in self.bands:
            return self.bands["compiled"]
        checked = [b for k, b in self.bands.items() if k.startswith(f"{basis}/")]
        if basis != "assumed" and checked:  # another family's evidence for this basis
            return Band(min(b.low for b in checked), max(b.high for b in checked))
        return self.widest

    def interval(
        self, nbytes: int, basis: str, family: str | None = None, term: str | None = None
    ) -> tuple[int, int]:
        """``(low, high)`` bytes around an estimate of ``nbytes`` with this basis."""
        return self.band(basis, family, term).interval(nbytes)


@lru_cache(maxsize=1)
def load_bands() -> BandTable:
    """The committed table (``bands.json``, written by ``python bench/bands.py``)."""
    text = resources.files("memfit.core").joinpath("bands.json").read_text(encoding="utf-8")
    return BandTable.from_dict(json.loads(text))


def plan_interval(
    breakdown: Mapping[str, int],
    sources: Mapping[str, str],
    family: str | None = None,
    table: BandTable | None = None,
) -> tuple[int, int]:
    """``(low, high)`` bytes for what the job needs: each term's band by its basis, added
    up (the worst case of each term at once), the unused part of a preallocated pool left
    out. A term without a basis counts as ``assumed``."""
    table = table or load_bands()
    low = high = 0
    for name, nbytes in breakdown.items():
        if name in NOT_NEEDED:
            continue
        lo, hi = table.interval(nbytes, sources.get(name, "assumed"), family, name)
        low += lo
        high += hi
    return low, high


def figure_band(
    nbytes: int, basis: str, context_bytes: int = 0, table: BandTable | None = None
) -> tuple[int, int]:
    """``(low, high)`` around one figure of an estimate made by ``basis``, of which
    ``context_bytes`` are the CUDA context (``fitted``, with the context's own band).

    >>> low, high = figure_band(2**30, "traced")
    >>> low <= 2**30 <= high
    True
    """
    table = table or load_bands()
    context = max(0, min(context_bytes, nbytes))
    lo, hi = table.interval(nbytes - context, basis)
    clo, chi = table.interval(context, "fitted", term="cuda_context")
    return lo + clo, hi + chi


def basis_summary(breakdown: Mapping[str, int], sources: Mapping[str, str]) -> str:
    """One line: each basis's share of what the job needs, largest first
    (``"basis: 71% recorded, 24% fitted, 5% analytic"``).

    >>> basis_summary({"a": 30, "b": 10}, {"a": "traced", "b": "analytic"})
    'basis: 75% traced, 25% analytic'
    """
    shares: dict[str, int] = {}
    for name, nbytes in breakdown.items():
        if name in NOT_NEEDED:
            continue
        kind = sources.get(name, "assumed")
        shares[kind] = shares.get(kind, 0) + nbytes
    total = sum(shares.values())
    if total <= 0:
        return "basis: nothing to size"
    order = sorted(shares, key=lambda k: (-shares[k], BASES.index(k) if k in BASES else 99))
    parts = [
        f"{shares[k] / total:.0%} {k}" if shares[k] / total >= 0.005 else f"<1% {k}"
        for k in order
        if shares[k]
    ]
    return "basis: " + ", ".join(parts)
