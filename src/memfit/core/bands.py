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
may have a band per family where the evidence differs: ``analytic/ppo/brax`` (the PPO formula
against Brax's compiled measurements), ``traced/reserved/conv`` (a trace's reserved peak of a
step with cuDNN convolutions). A family is a path: its band covers every calibration case
below it, and a lookup takes the most specific band with at least :data:`MIN_CASES` cases,
else its parent's (``traced/reserved/conv``, ``traced/reserved``, ``traced``). A basis with no
evidence gets the widest band seen on any basis (``assumed`` always does); so does a program
class known to differ (:data:`PROGRAM_CLASSES`) that no calibration case covers.

A compiled figure whose program gives XLA's autotuner a choice that moves the peak (Triton or
cuBLAS for a GEMM fusion, timed on the card) has two figures, one per alternative; its band is
put around both (:func:`figure_band` with ``alternatives``): the residual band
:data:`ALTERNATIVES` (``truth`` against the nearer alternative, 0 between them) below the
lower one and above the higher one. A program without such a choice has the two equal.

>>> table = load_bands()
>>> low, high = table.interval(1000, "assumed")
>>> low <= 1000 <= high
True
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

__all__ = [
    "ALTERNATIVES",
    "BASES",
    "MIN_CASES",
    "PROGRAM_CLASSES",
    "Band",
    "BandTable",
    "basis_summary",
    "figure_band",
    "load_bands",
    "plan_interval",
    "program_class",
    "traced_family",
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

#: A family band needs this many calibration cases to stand on its own; with fewer, its
#: parent's band (which covers them too) is used.
MIN_CASES = 3

#: Compiled programs whose scratch a closed library sizes on the device, known to be off in
#: their own way: each is a family band of its own, and without calibration cases it gets
#: the widest band (``bench/bands.py`` writes it so), never its basis's; its band is not
#: counted in :attr:`BandTable.widest`.
PROGRAM_CLASSES: dict[str, str] = {
    "compiled/conv": "XLA autotunes cuDNN convolutions on the device (scratch it allocates)",
    "compiled/sort": "CUB's sort scratch, sized by the library at run time",
}


#: The band of a compiled figure against its program's own alternatives (the peak if every
#: tunable GEMM fusion stays Triton, and if cuBLAS wins them): what is left after the
#: autotuner's choice, by family (``compiled/alternatives/small_tuning``: the first call's
#: tuning of GEMMs below cuBLAS's workspace sets the peak; ``compiled/alternatives/other``).
#: It does not roll up into ``compiled``, the band of a compiled figure that does not know its
#: alternatives (a plan's stored compile), which keeps the choice inside its width.
ALTERNATIVES = "compiled/alternatives"


def program_class(ops: Iterable[str]) -> str:
    """``"conv"`` for a step that runs a convolution (cuDNN's workspaces: an engine the
    library picks), else ``"other"`` (matmuls, attention, elementwise: sized from torch's
    source), from the ATen ops of a trace.

    >>> program_class(["aten.convolution", "aten.mm"]), program_class(["aten.mm"])
    ('conv', 'other')
    """
    return "conv" if any("convolution" in op for op in ops) else "other"


def traced_family(quantity: str, ops: Iterable[str]) -> str:
    """The family of a traced figure: what it counts (``allocated``: tensors and kernels'
    scratch; ``reserved``: the caching allocator's segments besides; ``device``: the
    device's use, the CUDA context included) and the step's :func:`program_class`.

    >>> traced_family("reserved", ["aten.convolution_backward"])
    'reserved/conv'
    """
    return f"{quantity}/{program_class(ops)}"


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
        """The widest band seen on any basis (for a basis without evidence). The bands of
        :data:`PROGRAM_CLASSES` are left out (without evidence they are this band)."""
        kept = [b for k, b in self.bands.items() if k not in PROGRAM_CLASSES]
        kept = kept or list(self.bands.values())
        if not kept:
            return Band(0.0, 0.0)
        return Band(min(b.low for b in kept), max(b.high for b in kept))

    def band(self, basis: str, family: str | None = None, term: str | None = None) -> Band:
        """The band of ``basis``: the term's own (``fitted/cuda_context``) or the family's
        where the evidence has one (the most specific with :data:`MIN_CASES` cases:
        ``traced/reserved/conv``, else ``traced/reserved``), else the basis's, else the
        widest of the basis's family bands (a formula checked for one family stands for
        the unchecked ones); a basis without any evidence (and ``assumed``) gets the widest
        band seen. A ``recorded`` figure is a compile stored with the workload: without
        evidence of its own it takes the ``compiled`` band."""
        keys = [f"{basis}/{term}"] if term is not None else []
        if family is not None:
            parts = family.split("/")
            keys += [f"{basis}/{'/'.join(parts[:n])}" for n in range(len(parts), 0, -1)]
        for key in keys:
            found = self.bands.get(key)
            if found is not None and (
                found.cases >= MIN_CASES or (found.cases == 0 and key in PROGRAM_CLASSES)
            ):
                return found
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
    basis_families: Mapping[str, str] | None = None,
) -> tuple[int, int]:
    """``(low, high)`` bytes for what the job needs: each term's band by its basis, added
    up (the worst case of each term at once), the unused part of a preallocated pool left
    out. A term without a basis counts as ``assumed``. ``basis_families`` names the family
    of one basis's terms where it is not the workload's ``family`` (a trace's terms:
    ``{"traced": "allocated/conv"}``)."""
    table = table or load_bands()
    low = high = 0
    for name, nbytes in breakdown.items():
        if name in NOT_NEEDED:
            continue
        basis = sources.get(name, "assumed")
        own = (basis_families or {}).get(basis, family)
        lo, hi = table.interval(nbytes, basis, own, name)
        low += lo
        high += hi
    return low, high


def figure_band(
    nbytes: int,
    basis: str,
    context_bytes: int = 0,
    table: BandTable | None = None,
    family: str | None = None,
    context_basis: str = "fitted",
    alternatives: tuple[int, int] | None = None,
) -> tuple[int, int]:
    """``(low, high)`` around one figure of an estimate made by ``basis`` (of ``family``:
    :func:`traced_family`), of which ``context_bytes`` are the CUDA context (with the
    context's own band, or the widest where its basis, ``context_basis``, is ``assumed``).
    With ``alternatives`` (the figure under each of its program's alternatives, the context
    included, ``nbytes`` between them), the band's low end is put below the lower one and its
    high end above the higher one.

    >>> low, high = figure_band(2**30, "traced")
    >>> low <= 2**30 <= high
    True
    >>> table = BandTable({"compiled/alternatives": Band(-0.5, 0.5, 5)})
    >>> figure_band(200, "compiled", table=table, family="alternatives", alternatives=(100, 200))
    (50, 300)
    """
    table = table or load_bands()
    context = max(0, min(context_bytes, nbytes))
    low_end, high_end = alternatives if alternatives is not None else (nbytes, nbytes)
    low_end, high_end = min(low_end, nbytes), max(high_end, nbytes)
    band = table.band(basis, family)
    lo = band.interval(max(0, low_end - context))[0]
    hi = band.interval(max(0, high_end - context))[1]
    clo, chi = table.interval(context, context_basis, term="cuda_context")
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
