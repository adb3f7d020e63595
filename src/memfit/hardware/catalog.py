"""Known NVIDIA GPUs and the memory their driver reports.

``total_bytes`` is the total ``nvidia-smi`` (NVML) shows, not the marketing figure: an
"80 GB" H100 reports 81559 MiB, a "24 GB" RTX 4090 24564 MiB, a "16 GB" T4 15360 MiB. PyTorch's
``torch.cuda.get_device_properties(i).total_memory`` is a little less again (the "total
capacity" in its out-of-memory message); where a public report shows that figure it is kept
in ``cuda_total_bytes``. Every entry says in ``source`` where its figure comes from: an
``nvidia-smi`` output seen in a public bug report (named), or the spec sheet where no such
report was found (then the figure is the nominal binary size and may be a few MiB high).
The table is data: ``gpus.json`` beside this module, read on first use (a new card is one
row there, with its source).

Lookup is forgiving: ``"4090"``, ``"rtx4090"``, ``"RTX 4090"`` and ``"NVIDIA GeForce RTX 4090"``
all find the same card; an exact name beats its Ti / SUPER / 16GB variants (``"RTX 4060"`` is
the RTX 4060), laptop cards are their own entries (``"RTX 4060 Laptop"``, ``"3060 mobile"``),
and a bare number is a card's name, never a size. A size with its unit (``"12GiB"``,
``"8GB"``) or an ``int`` of bytes (``12 * 2**30``) gives an anonymous GPU of that size.

>>> gpu("4090").total_bytes // 2**20
24564
>>> gpu("H100 80GB").name
'NVIDIA H100 80GB HBM3'
>>> gpu("12GiB").arch, gpu("12GiB").total_bytes == 12 * 2**30
('unknown', True)
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memfit._checks import require, require_count
from memfit.errors import ConfigError
from memfit.units import MAX_BYTES, GiB, MiB, format_bytes, format_mib, parse_bytes

__all__ = [
    "ARCHITECTURES",
    "MIN_GPU_BYTES",
    "GpuSpec",
    "anonymous_gpu",
    "gpu",
    "host_device",
    "list_gpus",
    "normalize_name",
    "reading_note",
    "size_note",
]

#: Architecture names a :class:`GpuSpec` may carry.
ARCHITECTURES: tuple[str, ...] = (
    "cpu",
    "pascal",
    "volta",
    "turing",
    "ampere",
    "ada",
    "hopper",
    "blackwell",
    "unknown",
)

#: Smallest size accepted for an anonymous GPU (a smaller "GPU" is almost surely a unit slip,
#: such as ``"4096"`` meant as MiB).
MIN_GPU_BYTES = 64 * MiB


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model and its memory.

    Attributes:
        name: The name NVML reports (``"NVIDIA GeForce RTX 4090"``); for an anonymous GPU,
            a description of its size.
        total_bytes: Total memory as the driver reports it (``nvidia-smi``'s total).
        arch: ``"pascal"``, ``"volta"``, ``"turing"``, ``"ampere"``, ``"ada"``,
            ``"hopper"``, ``"blackwell"`` or ``"unknown"`` (``"cpu"`` for the host).
        compute_capability: ``(major, minor)``, or ``None`` when unknown.
        source: Where ``total_bytes`` comes from.
        aliases: Other names the lookup accepts.
        unified_memory: ``True`` where CPU and GPU share one memory (Jetson): the GPU gets
            what the OS and other processes leave, not ``total_bytes``.
        cuda_total_bytes: What CUDA / PyTorch report as total capacity, where a public
            report shows it (slightly below ``total_bytes``), else ``None``.
        given_as: For a GPU made from a size, the text the user gave (``"3.7GB"``).
    """

    name: str
    total_bytes: int
    arch: str
    compute_capability: tuple[int, int] | None
    source: str
    aliases: tuple[str, ...] = ()
    unified_memory: bool = False
    cuda_total_bytes: int | None = None
    given_as: str | None = None

    def __post_init__(self) -> None:
        """A spec built by hand is checked as the catalog's are: the same argument checks
        as every public entry (a ``ConfigError`` naming the field)."""
        require("name", self.name, "str")
        require("total_bytes", self.total_bytes, "int", hint="the total in bytes, e.g. 8 * 2**30")
        if not 0 < self.total_bytes <= MAX_BYTES:
            raise ConfigError(
                f"total_bytes must be a size from 1 byte to 16 EiB, not {self.total_bytes}",
                key_path="total_bytes",
                hint="the GPU's total memory in bytes, as nvidia-smi reports it",
            )
        require("arch", self.arch, "str")
        if self.compute_capability is not None and not (
            isinstance(self.compute_capability, tuple)
            and len(self.compute_capability) == 2
            and all(type(v) is int and v >= 0 for v in self.compute_capability)
        ):
            raise ConfigError(
                f"compute_capability must be (major, minor) or None, not "
                f"{self.compute_capability!r:.40}",
                key_path="compute_capability",
            )
        require("source", self.source, "str")
        if not isinstance(self.aliases, tuple) or not all(isinstance(a, str) for a in self.aliases):
            raise ConfigError("aliases must be a tuple of names", key_path="aliases")
        require("unified_memory", self.unified_memory, "bool")
        require("cuda_total_bytes", self.cuda_total_bytes, "int", optional=True)
        if self.cuda_total_bytes is not None and not 0 < self.cuda_total_bytes <= MAX_BYTES:
            raise ConfigError(
                f"cuda_total_bytes must be a size, not {self.cuda_total_bytes}",
                key_path="cuda_total_bytes",
            )
        require("given_as", self.given_as, "str", optional=True)

    @property
    def is_anonymous(self) -> bool:
        """``True`` for a GPU made from a bare size (not a catalog model)."""
        return self.arch == "unknown" and self.compute_capability is None and not self.aliases

    @property
    def is_host(self) -> bool:
        """``True`` for the host (``--gpu cpu``): the job runs on the CPU, in host RAM."""
        return self.arch == "cpu"

    def to_dict(self) -> dict[str, Any]:
        """The spec as plain JSON data."""
        return {
            "name": self.name,
            "total_bytes": self.total_bytes,
            "total_mib": round(self.total_bytes / MiB, 1),
            "arch": self.arch,
            "compute_capability": (
                list(self.compute_capability) if self.compute_capability is not None else None
            ),
            "unified_memory": self.unified_memory,
            "cuda_total_bytes": self.cuda_total_bytes,
            "source": self.source,
            "aliases": list(self.aliases),
        }


# -- the table: gpus.json beside this module, read on first use -------------------------------

#: The catalog's data file (shipped in the package).
CATALOG_FILE = Path(__file__).with_name("gpus.json")


def _spec_of(row: Mapping[str, Any]) -> GpuSpec:
    cc = row.get("compute_capability")
    total = int(row["total_mib"]) * MiB if "total_mib" in row else int(row["total_bytes"])
    return GpuSpec(
        name=str(row["name"]),
        total_bytes=total,
        arch=str(row["arch"]),
        compute_capability=(
            (int(cc.split(".")[0]), int(cc.split(".")[1])) if isinstance(cc, str) else None
        ),
        source=str(row["source"]),
        aliases=tuple(str(a) for a in row.get("aliases", ())),
        unified_memory=bool(row.get("unified_memory", False)),
        cuda_total_bytes=(
            int(row["cuda_total_bytes"]) if row.get("cuda_total_bytes") is not None else None
        ),
    )


@functools.cache
def _catalog() -> tuple[GpuSpec, ...]:
    """Every catalog row, read once from :data:`CATALOG_FILE` and checked."""
    rows = json.loads(CATALOG_FILE.read_text(encoding="utf-8"))["gpus"]
    specs = tuple(_spec_of(row) for row in rows)
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise RuntimeError("memfit catalog: duplicate GPU names")
    for spec in specs:
        if spec.arch not in ARCHITECTURES or spec.total_bytes <= 0 or not spec.source:
            raise RuntimeError(f"memfit catalog: bad entry {spec.name!r}")
    return specs


# -- lookup -----------------------------------------------------------------------------------

_DROP_WORDS = ("nvidia", "geforce", "tesla", "graphics", "gpu", "generation")
#: Words read as another: NVML says "Laptop GPU", people say "mobile" too.
_SYNONYMS = {"mobile": "laptop"}
_NON_ALNUM = re.compile(r"[^a-z0-9]+")


def normalize_name(text: str) -> str:
    """Reduce a GPU name to the key the lookup compares (lower case, letters and digits).

    Vendor and family words (``NVIDIA``, ``GeForce``, ``Tesla``, ``GPU``, ``Generation``) are
    dropped, ``GiB`` is read as ``GB`` and ``mobile`` as ``laptop``.

    >>> normalize_name("NVIDIA GeForce RTX 4090"), normalize_name("a100-80GB")
    ('rtx4090', 'a10080gb')
    """
    lowered = text.lower().replace("gib", "gb")
    words = [_SYNONYMS.get(w, w) for w in _NON_ALNUM.split(lowered) if w]
    return "".join(w for w in words if w not in _DROP_WORDS)


def _keys_for(spec: GpuSpec) -> set[str]:
    keys = {normalize_name(spec.name)} | {normalize_name(a) for a in spec.aliases}
    for key in list(keys):
        for prefix in ("rtx", "gtx"):
            if key.startswith(prefix) and len(key) > len(prefix):
                keys.add(key[len(prefix) :])
    keys.discard("")
    return keys


@functools.cache
def _index() -> dict[str, tuple[GpuSpec, ...]]:
    index: dict[str, list[GpuSpec]] = {}
    for spec in _catalog():
        for key in _keys_for(spec):
            bucket = index.setdefault(key, [])
            if spec not in bucket:
                bucket.append(spec)
    return {k: tuple(v) for k, v in index.items()}


_SIZE_WORD = re.compile(r"^\d+gi?b$", re.IGNORECASE)
_SIZED_KEY = re.compile(r"^(.*?)(\d+)gb$")


def _without_prefix(key: str) -> set[str]:
    """``key`` and, for ``rtx4060ti``, ``4060ti``."""
    out = {key}
    for prefix in ("rtx", "gtx"):
        if key.startswith(prefix) and len(key) > len(prefix):
            out.add(key[len(prefix) :])
    return out


@functools.cache
def _families() -> dict[str, tuple[GpuSpec, ...]]:
    """Cards by their name without its memory size: ``"4060ti"`` -> the RTX 4060 Ti and the
    RTX 4060 Ti 16GB (from names and aliases that end in a size word such as ``16GB``)."""
    out: dict[str, list[GpuSpec]] = {}
    for spec in _catalog():
        for text in (spec.name, *spec.aliases):
            words = [w for w in re.split(r"[\s_]+", text.strip()) if w]
            if len(words) > 1 and _SIZE_WORD.match(words[-1]):
                base = normalize_name(" ".join(words[:-1]))
                for key in _without_prefix(base):
                    bucket = out.setdefault(key, [])
                    if spec not in bucket:
                        bucket.append(spec)
    return {k: tuple(v) for k, v in out.items()}


@functools.cache
def _by_name() -> dict[str, GpuSpec]:
    """Each card by its full catalog name, lower case (``memfit plan --all-gpus`` rows, a
    fitted file's ``planned_for``): a full name is never ambiguous."""
    return {spec.name.lower(): spec for spec in _catalog()}


def _alias_keys(spec: GpuSpec) -> set[str]:
    keys: set[str] = set()
    for alias in spec.aliases:
        keys |= _without_prefix(normalize_name(alias))
    return keys


def _same_name_sizes(key: str, found: GpuSpec) -> list[GpuSpec]:
    """The cards that share the name ``key`` with ``found`` but not its memory (the RTX 4060
    Ti and the RTX 4060 Ti 16GB), unless ``key`` is one of ``found``'s own aliases (a
    catalog's chosen default, such as ``"H100"`` for the 80 GB card)."""
    if key in _alias_keys(found):
        return []
    family = _families().get(key, ())
    return [s for s in family if s is not found and abs(s.total_bytes - found.total_bytes) > GiB]


def _nominal_gb(spec: GpuSpec) -> int:
    """The card's memory as sold, in GB (8188 MiB -> 8, 81559 MiB -> 80)."""
    return round(spec.total_bytes / GiB)


def _by_size(key: str) -> GpuSpec | None:
    """``"3070laptop8gb"``: the card named without its size whose memory is that size."""
    match = _SIZED_KEY.match(key)
    if match is None:
        return None
    head, digits = match.group(1), match.group(2)
    for cut in range(len(digits) - 1, -1, -1):  # "rtxa20006gb": "rtxa2000" and 6
        base, size = head + digits[:cut], int(digits[cut:])
        named = {*_index().get(base, ()), *_families().get(base, ())}
        fitting = [s for s in named if _nominal_gb(s) == size]
        if len(fitting) == 1:
            return fitting[0]
    return None


def _ambiguous(text: str, specs: list[GpuSpec]) -> ConfigError:
    """``text`` names several cards of different memory: ask which."""
    shown = sorted(specs, key=lambda s: (s.total_bytes, s.name))
    names = ", ".join(f"{s.name} ({format_mib(s.total_bytes)})" for s in shown[:6])
    more = f" (and {len(shown) - 6} more)" if len(shown) > 6 else ""
    return ConfigError(
        f"{text!r} matches several GPUs with different memory: {names}{more}",
        key_path="gpu",
        hint="name the one you have, with its size where the name is shared (e.g. "
        f"'{text} {_nominal_gb(shown[0])}GB'), or give the size itself, e.g. 8GiB",
    )


_BARE_NUMBER = re.compile(r"^\s*\d+(\.\d+)?\s*$")
_SIZE_LIKE = re.compile(
    r"^\s*[+-]?\d+(\.\d+)?(e[+-]?\d+)?\s*([kmgt]i?b|[kmgt]|b)?\s*$", re.IGNORECASE
)


def list_gpus() -> list[GpuSpec]:
    """Every GPU in the catalog, by memory: discrete cards small to large, then Jetson
    modules (unified memory) small to large."""
    return sorted(_catalog(), key=lambda s: (s.unified_memory, s.total_bytes, s.name))


def anonymous_gpu(size: int | str) -> GpuSpec:
    """A GPU known only by its size (``"12GiB"``, ``"8GB"``, bytes).

    Raises:
        ConfigError: When the size is not a size, or under :data:`MIN_GPU_BYTES`.

    >>> anonymous_gpu("8GB").total_bytes
    8000000000
    """
    try:
        total = parse_bytes(size)
    except ConfigError as exc:
        raise ConfigError(exc.message, key_path="gpu", hint=exc.hint) from exc
    if total < MIN_GPU_BYTES:
        bare = isinstance(size, int) or size.strip().isdigit()
        raise ConfigError(
            f"{size!r} is {total} bytes, too small for a GPU",
            key_path="gpu",
            hint=f"give a unit, for instance {size}MiB or {size}GB"
            if bare and total > 0
            else f"a GPU has at least {format_bytes(MIN_GPU_BYTES)}; give its memory, e.g. 12GiB",
        )
    return GpuSpec(
        name=f"GPU with {format_mib(total)}",
        total_bytes=total,
        arch="unknown",
        compute_capability=None,
        source=f"size given by the user ({size!r})",
        given_as=size.strip() if isinstance(size, str) else None,
    )


def host_device(total_bytes: int, *, source: str = "host RAM") -> GpuSpec:
    """The host as a device to plan for (``--gpu cpu``): a job that trains on the CPU, with
    everything in host RAM. No CUDA context, no cuBLAS workspace, no JAX pool.

    Raises:
        ConfigError: When ``total_bytes`` is not positive.

    >>> host_device(16 * 2**30).name, host_device(16 * 2**30).is_host
    ('CPU (host RAM)', True)
    """
    require_count(
        "host memory",
        total_bytes,
        lo=1,
        what="a size in bytes",
        key_path="--host-memory",
        hint="give the RAM to plan for, e.g. --host-memory 16GiB",
    )
    return GpuSpec(
        name="CPU (host RAM)",
        total_bytes=int(total_bytes),
        arch="cpu",
        compute_capability=None,
        source=source,
    )


_DECIMAL_UNIT = re.compile(r"^\s*[\d.]+\s*([kmgt]b)\s*$", re.IGNORECASE)
_BINARY_UNIT = re.compile(r"^\s*[\d.]+\s*([kmgt]i?b?|[kmgt])\s*$", re.IGNORECASE)


def size_note(spec: GpuSpec) -> str | None:
    """For a GPU given as a size, what that size is in bytes and in the other unit system.

    ``GB`` is decimal (10^9 bytes, as on a spec sheet), ``GiB`` binary (2^30, as
    ``nvidia-smi`` and PyTorch count): ``--gpu 3.7GB`` is 3.45 GiB, about 6% less than the
    3.68 GiB a 4 GB laptop card shows to torch, so the two plan different knobs.

    >>> print(size_note(gpu("3.7GB")))  # doctest: +ELLIPSIS
    3.7GB is decimal: 3,700,000,000 bytes = 3.45 GiB. nvidia-smi and PyTorch count in GiB ...
    >>> size_note(gpu("RTX 4090")) is None
    True
    """
    text = spec.given_as
    if text is None or not spec.is_anonymous:
        return None
    total = spec.total_bytes
    if _DECIMAL_UNIT.match(text):
        return (
            f"{text} is decimal: {total:,} bytes = {format_bytes(total)}. nvidia-smi and "
            "PyTorch count in GiB (2^30 bytes): a 4 GB laptop card shows 3.68 GiB to torch "
            f"({round(3.68 * GiB):,} bytes); give --gpu 3.68GiB to plan for that, or the "
            "card's name"
        )
    if _BINARY_UNIT.match(text) or text.isdigit():
        return (
            f"{text} is binary: {total:,} bytes ({total / 10**9:.2f} GB in the decimal units "
            "of a spec sheet), as nvidia-smi and PyTorch count"
        )
    return None


def reading_note(text: str | int) -> str | None:
    """What to tell a user whose ``--gpu`` text was a bare number read as a card's name.

    A bare number names a card (``"4060"`` is the RTX 4060); a size needs its unit. Where
    the number could also be meant as a size (in MiB, as ``nvidia-smi`` counts), say which
    reading was taken and how to ask for the other.

    >>> print(reading_note("4060"))
    4060 is read as the NVIDIA GeForce RTX 4060; for a size, give a unit (4060MiB)
    >>> reading_note("RTX 4060") is None
    True
    """
    if not isinstance(text, str) or not _BARE_NUMBER.match(text):
        return None
    found = _index().get(normalize_name(text), ())
    if len(found) != 1:
        return None
    number = text.strip()
    return f"{number} is read as the {found[0].name}; for a size, give a unit ({number}MiB)"


def _nearest(query: str, n: int = 3) -> list[str]:
    """The ``n`` catalog names whose lookup keys are most like ``query`` (difflib ratio)."""
    scored: list[tuple[float, int, str]] = []
    for order, spec in enumerate(_catalog()):
        best = max(difflib.SequenceMatcher(None, query, key).ratio() for key in _keys_for(spec))
        if query and any(query in key for key in _keys_for(spec)):
            best += 1.0
        scored.append((-best, order, spec.name))
    scored.sort()
    return [name for _score, _order, name in scored[:n]]


def gpu(name_or_size: str | int) -> GpuSpec:
    """Find a GPU by name (forgiving) or make an anonymous one from a size.

    Names are compared after :func:`normalize_name`, so ``"4090"``, ``"rtx4090"``,
    ``"RTX 4090"`` and ``"NVIDIA GeForce RTX 4090"`` are the same card; catalog aliases
    (``"H100 80GB"``, ``"a100-80gb"``) count too. A text that is not a known name but reads as
    a size (``"12GiB"``, ``"8GB"``) gives an anonymous GPU of that size, as does an ``int``
    (bytes).

    Args:
        name_or_size: A GPU name, a size text, or a number of bytes.

    Returns:
        The catalog entry, or an anonymous :class:`GpuSpec` with ``arch="unknown"``.

    Raises:
        ConfigError: When the name is unknown or matches several GPUs (the hint lists the
            three nearest names), or the size is not a valid size.

    >>> gpu("NVIDIA GeForce RTX 4090") is gpu("rtx4090")
    True
    """
    require("name_or_size", name_or_size, "str", "int")
    if isinstance(name_or_size, bool):
        raise ConfigError(f"not a GPU name or size: {name_or_size!r}", key_path="gpu")
    if isinstance(name_or_size, int):
        return anonymous_gpu(name_or_size)
    if not isinstance(name_or_size, str) or not name_or_size.strip():
        raise ConfigError(
            f"not a GPU name or size: {name_or_size!r}",
            key_path="gpu",
            hint="give a GPU name such as 'RTX 4090' or a size such as 12GiB",
        )
    exact = _by_name().get(name_or_size.strip().lower())
    if exact is not None:
        return exact
    key = normalize_name(name_or_size)
    found = _index().get(key, ())
    if len(found) == 1:
        siblings = _same_name_sizes(key, found[0])
        if siblings:
            raise _ambiguous(name_or_size.strip(), [found[0], *siblings])
        return found[0]
    if not found:
        sized = _by_size(key)
        if sized is not None:
            return sized
    if len(found) > 1:
        names = ", ".join(s.name for s in found[:3])
        raise ConfigError(
            f"{name_or_size!r} matches several GPUs",
            key_path="gpu",
            hint=f"be more specific: {names}",
        )
    if _BARE_NUMBER.match(name_or_size):
        # a bare number is a card's name ("4060") or nothing: a size needs its unit
        number = name_or_size.strip()
        units = f"{number}MiB, {number}GB or {number}GiB" if float(number) > 0 else "e.g. 12GiB"
        raise ConfigError(
            f"{number!r} names no GPU, and a size needs a unit",
            key_path="gpu",
            hint=f"for a card, give its name (memfit gpus lists them); for a size, a unit: {units}",
        )
    if _SIZE_LIKE.match(name_or_size):
        return anonymous_gpu(name_or_size)
    prefixed = [s for s in _catalog() if key and any(k.startswith(key) for k in _keys_for(s))]
    words = [normalize_name(w) for w in name_or_size.split()]
    words = [w for w in words if w]
    if len(words) > 1:  # "jetson orin": every card whose name has each word
        prefixed += [
            s
            for s in _catalog()
            if s not in prefixed and all(w in normalize_name(s.name) for w in words)
        ]
    if len(prefixed) > 1:
        shown = sorted(prefixed, key=lambda s: (s.total_bytes, s.name))
        names = ", ".join(f"{s.name} ({format_mib(s.total_bytes)})" for s in shown[:6])
        more = f" (and {len(shown) - 6} more)" if len(shown) > 6 else ""
        raise ConfigError(
            f"{name_or_size!r} matches several GPUs",
            key_path="gpu",
            hint=f"be more specific: {names}{more}",
        )
    nearest = _nearest(key)
    hint = (
        "nearest names: " + ", ".join(nearest)
        if nearest
        else "run `memfit gpus` for the list, or give a size such as 12GiB"
    )
    if nearest:
        hint += "; or give a size such as 12GiB"
    raise ConfigError(f"unknown GPU {name_or_size!r}", key_path="gpu", hint=hint)
