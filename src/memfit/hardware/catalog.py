"""Known NVIDIA GPUs and the memory their driver reports.

``total_bytes`` is the total ``nvidia-smi`` (NVML) shows, not the marketing figure: an
"80 GB" H100 reports 81559 MiB, a "24 GB" RTX 4090 24564 MiB, a "16 GB" T4 15360 MiB. PyTorch's
``torch.cuda.get_device_properties(i).total_memory`` is a little less again (the "total
capacity" in its out-of-memory message); where a public report shows that figure it is kept
in ``cuda_total_bytes``. Every entry says in ``source`` where its figure comes from: an
``nvidia-smi`` output seen in a public bug report (named), or the spec sheet where no such
report was found (then the figure is the nominal binary size and may be a few MiB high).

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
import re
from dataclasses import dataclass
from typing import Any

from memfit._checks import require
from memfit.errors import ConfigError
from memfit.units import GiB, MiB, format_bytes, format_mib, parse_bytes

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


# -- sources ----------------------------------------------------------------------------------

_MODAL = (
    "nvidia-smi totals listed in modal-labs/modal-client PR #2797 (2025-01): H100 81559MiB, "
    "A100 80GB 81920MiB, A100 40GB 40960MiB, A10 23028MiB, L40S 46068MiB, L4 23034MiB, "
    "T4 15360MiB"
)


def _nvidia_smi_report(where: str) -> str:
    """Source text for a total read from ``nvidia-smi`` output in a public report."""
    return f"nvidia-smi output in a public bug report ({where})"


def _public_smi(detail: str) -> str:
    """Source text for a total read from ``nvidia-smi`` tables in public GitHub files.

    Found with a code search for the total as ``nvidia-smi`` prints it (``"/  8188MiB"``,
    2026-11); the files are READMEs, notes and logs, several per card, that agree.
    """
    return f"nvidia-smi tables in public GitHub files ({detail}; code search, 2026-11)"


def _spec_sheet(detail: str) -> str:
    """Source text for a total taken from the spec sheet (no ``nvidia-smi`` report checked)."""
    return (
        f"spec sheet ({detail}); no public nvidia-smi report was checked, so the driver's "
        "figure may be a few MiB lower"
    )


def _torch_total_gib(gib: float) -> int:
    """Bytes of a "total capacity of X GiB" that PyTorch printed with two decimals."""
    return round(gib * GiB)


#: Blackwell GeForce cards report 0.995 of their nominal size (RTX 5070: 12227 of 12288 MiB,
#: RTX 5090: 32607 of 32768 MiB).
_BLACKWELL_16GB_ESTIMATE = (
    "16 GB GDDR7; the driver's total is estimated as 0.995 of 16384 MiB, as the RTX 5070 "
    "(12227 of 12288 MiB) and 5090 (32607 of 32768 MiB) report"
)


def _catalog_entry(
    name: str,
    mib: int,
    arch: str,
    cc: tuple[int, int] | None,
    source: str,
    aliases: tuple[str, ...] = (),
    *,
    unified: bool = False,
    cuda_total: int | None = None,
) -> GpuSpec:
    """One catalog row: its total in MiB as ``nvidia-smi`` shows it, and where that comes from."""
    return GpuSpec(
        name=name,
        total_bytes=mib * MiB,
        arch=arch,
        compute_capability=cc,
        source=source,
        aliases=aliases,
        unified_memory=unified,
        cuda_total_bytes=cuda_total,
    )


_CATALOG: tuple[GpuSpec, ...] = (
    # -- 4 GB laptop / entry class: torch sees about 3.7-3.8 GiB -------------------------------
    _catalog_entry(
        "NVIDIA GeForce GTX 1650",
        4096,
        "turing",
        (7, 5),
        _spec_sheet("4 GB GDDR5/GDDR6")
        + "; torch reports 3.81 GiB total capacity (ultralytics/yolov5#285)",
        ("gtx 1650", "1650", "gtx1650 4gb"),
        cuda_total=_torch_total_gib(3.81),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 3050 Laptop GPU",
        4096,
        "ampere",
        (8, 6),
        _spec_sheet("4 GB GDDR6")
        + "; 4 GB laptop cards show about 3.68 GiB to torch (see RTX A500 Laptop GPU)",
        ("rtx 3050 laptop", "3050 laptop", "rtx 3050 laptop 4gb", "3050m", "rtx 3050 mobile"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 3050 Ti Laptop GPU",
        4096,
        "ampere",
        (8, 6),
        _spec_sheet("4 GB GDDR6"),
        ("rtx 3050 ti laptop", "3050 ti laptop", "3050ti laptop", "3050 ti mobile"),
    ),
    _catalog_entry(
        "NVIDIA RTX A500 Laptop GPU",
        4096,
        "ampere",
        (8, 6),
        _spec_sheet("4 GB GDDR6")
        + "; torch reports 3.68 GiB total capacity (Robbyant/lingbot-map#73)",
        ("rtx a500 laptop", "a500 laptop", "a500"),
        cuda_total=_torch_total_gib(3.68),
    ),
    # -- consumer Turing / Ampere ----------------------------------------------------------------
    _catalog_entry(
        "NVIDIA GeForce RTX 2080 Ti",
        11264,
        "turing",
        (7, 5),
        _public_smi("11264MiB, several RTX 2080 Ti servers and desktops"),
        ("2080 ti", "2080ti", "rtx 2080ti"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 3060",
        12288,
        "ampere",
        (8, 6),
        _nvidia_smi_report("geerlingguy/raspberry-pi-pcie-devices#790: 12288MiB"),
        ("rtx 3060 12gb", "3060", "3060 12gb"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 3060 Ti",
        8192,
        "ampere",
        (8, 6),
        _public_smi("8192MiB, several RTX 3060 Ti desktops"),
        ("3060 ti", "3060ti", "rtx 3060ti"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 3070",
        8192,
        "ampere",
        (8, 6),
        _public_smi("8192MiB, an RTX 3070 desktop at 220 W"),
        ("3070", "rtx 3070 8gb"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 3080",
        10240,
        "ampere",
        (8, 6),
        _spec_sheet("10 GB GDDR6X")
        + "; torch reports 9.78 GiB total capacity on Linux (zai-org/CogVideo#34)",
        ("3080", "rtx 3080 10gb", "3080 10gb"),
        cuda_total=_torch_total_gib(9.78),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 3080 12GB",
        12288,
        "ampere",
        (8, 6),
        _spec_sheet("12 GB GDDR6X; NVML names it 'NVIDIA GeForce RTX 3080' too"),
        ("3080 12gb", "rtx 3080 12 gb"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 3080 Ti",
        12288,
        "ampere",
        (8, 6),
        _spec_sheet(
            "12 GB GDDR6X = 12288 MiB; Ampere cards report the full size, as the RTX 3060 "
            "(12288MiB) does"
        ),
        ("3080 ti", "3080ti", "rtx 3080ti"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 3090",
        24576,
        "ampere",
        (8, 6),
        _nvidia_smi_report("noonghunna/club-3090#1127: 24576MiB"),
        ("3090",),
    ),
    # -- consumer Ada / Blackwell ----------------------------------------------------------------
    _catalog_entry(
        "NVIDIA GeForce RTX 4060 Ti",
        8188,
        "ada",
        (8, 9),
        _spec_sheet("8 GB GDDR6; Ada cards report a few MiB under the nominal size"),
        ("4060 ti", "4060ti", "4060 ti 8gb", "rtx 4060 ti 8gb"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 4060 Ti 16GB",
        16380,
        "ada",
        (8, 9),
        _spec_sheet("16 GB GDDR6; NVML names it 'NVIDIA GeForce RTX 4060 Ti' too"),
        ("4060 ti 16gb", "4060ti 16gb", "rtx 4060ti 16gb"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 4070",
        12282,
        "ada",
        (8, 9),
        _public_smi("12282MiB, several RTX 4070 desktops at 200 W"),
        ("4070",),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 4080",
        16376,
        "ada",
        (8, 9),
        _spec_sheet("16 GB GDDR6X"),
        ("4080",),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 4070 SUPER",
        12282,
        "ada",
        (8, 9),
        _spec_sheet("12 GB GDDR6X; taken equal to the RTX 4070's figure, same memory"),
        ("4070 super", "4070super", "rtx 4070super"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 4070 Ti",
        12282,
        "ada",
        (8, 9),
        _public_smi("12282MiB, an RTX 4070 Ti at 285 W"),
        ("4070 ti", "4070ti", "rtx 4070ti"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 4070 Ti SUPER",
        16376,
        "ada",
        (8, 9),
        _public_smi("16376MiB, an 'RTX 4070 ...' (name cut by nvidia-smi) at 285 W"),
        ("4070 ti super", "4070ti super", "rtx 4070 ti super"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 4080 SUPER",
        16376,
        "ada",
        (8, 9),
        _public_smi("16376MiB, an 'RTX 4080 ...' (name cut by nvidia-smi) at 320 W"),
        ("4080 super", "4080super", "rtx 4080super"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 4090",
        24564,
        "ada",
        (8, 9),
        _nvidia_smi_report("RLinf/RLinf#255: 24564MiB"),
        ("4090",),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 5070",
        12227,
        "blackwell",
        (12, 0),
        _nvidia_smi_report("shkhln/libc6-shim#14: 12227MiB"),
        ("5070",),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 5070 Ti",
        16303,
        "blackwell",
        (12, 0),
        _spec_sheet(_BLACKWELL_16GB_ESTIMATE),
        ("5070 ti", "5070ti", "rtx 5070ti"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 5080",
        16303,
        "blackwell",
        (12, 0),
        _spec_sheet(_BLACKWELL_16GB_ESTIMATE),
        ("5080",),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 5090",
        32607,
        "blackwell",
        (12, 0),
        _nvidia_smi_report("noonghunna/club-3090#617: 32607MiB"),
        ("5090",),
    ),
    # -- workstation -----------------------------------------------------------------------------
    _catalog_entry(
        "NVIDIA RTX A5000",
        24564,
        "ampere",
        (8, 6),
        _public_smi("24564MiB, an RTX A5000 with ECC off"),
        ("a5000", "rtx a5000"),
    ),
    _catalog_entry(
        "NVIDIA RTX A6000",
        49140,
        "ampere",
        (8, 6),
        _public_smi(
            "49140MiB, RTX A6000 cards with ECC off; with ECC on the driver shows "
            "about 46068MiB, as the A40 does"
        ),
        ("a6000", "rtx a6000"),
    ),
    # -- data centre -----------------------------------------------------------------------------
    _catalog_entry(
        "Tesla T4",
        15360,
        "turing",
        (7, 5),
        _MODAL,
        ("t4", "nvidia t4", "tesla t4 16gb"),
    ),
    _catalog_entry(
        "NVIDIA L4",
        23034,
        "ada",
        (8, 9),
        _MODAL,
        ("l4",),
    ),
    _catalog_entry(
        "NVIDIA A10G",
        23028,
        "ampere",
        (8, 6),
        _nvidia_smi_report("NVIDIA/DCGM#232: 23028MiB (AWS g5)"),
        ("a10g",),
    ),
    _catalog_entry(
        "NVIDIA A10",
        23028,
        "ampere",
        (8, 6),
        _MODAL,
        ("a10",),
    ),
    _catalog_entry(
        "NVIDIA L40S",
        46068,
        "ada",
        (8, 9),
        _MODAL,
        ("l40s",),
    ),
    _catalog_entry(
        "Tesla V100-SXM2-16GB",
        16384,
        "volta",
        (7, 0),
        _spec_sheet("16 GB HBM2; older drivers show about 16160MiB"),
        ("v100", "v100 16gb", "v100-16gb", "v100 sxm2 16gb", "tesla v100", "v100-pcie-16gb"),
    ),
    _catalog_entry(
        "Tesla V100-SXM2-32GB",
        32768,
        "volta",
        (7, 0),
        _spec_sheet("32 GB HBM2; older drivers show about 32510MiB"),
        ("v100 32gb", "v100-32gb", "v100 sxm2 32gb", "v100-pcie-32gb"),
    ),
    _catalog_entry(
        "NVIDIA A100-SXM4-40GB",
        40960,
        "ampere",
        (8, 0),
        _MODAL,
        ("a100 40gb", "a100-40gb", "a100 sxm4 40gb", "a100 sxm 40gb", "a100 40"),
    ),
    _catalog_entry(
        "NVIDIA A100-SXM4-80GB",
        81920,
        "ampere",
        (8, 0),
        _MODAL,
        ("a100 80gb", "a100-80gb", "a100 sxm4 80gb", "a100 sxm 80gb", "a100 80"),
    ),
    _catalog_entry(
        "NVIDIA A100 80GB PCIe",
        81920,
        "ampere",
        (8, 0),
        _spec_sheet("80 GB HBM2e, same memory as the SXM4 80GB"),
        ("a100 pcie 80gb", "a100-pcie-80gb", "a100 80gb pcie"),
    ),
    _catalog_entry(
        "NVIDIA H100 80GB HBM3",
        81559,
        "hopper",
        (9, 0),
        _nvidia_smi_report("NVIDIA/nccl#1264: 81559MiB") + "; also " + _MODAL,
        ("h100", "h100 80gb", "h100-80gb", "h100 sxm", "h100 sxm5", "h100 sxm 80gb"),
    ),
    _catalog_entry(
        "NVIDIA H100 PCIe",
        81559,
        "hopper",
        (9, 0),
        _spec_sheet("80 GB HBM2e; taken equal to the SXM figure"),
        ("h100 pcie", "h100-pcie", "h100 pcie 80gb"),
    ),
    _catalog_entry(
        "NVIDIA H200",
        143771,
        "hopper",
        (9, 0),
        "nvidia-smi total commonly reported for the 141 GB H200 SXM (143771MiB); not checked "
        "against a public report here",
        ("h200", "h200 141gb", "h200 sxm"),
    ),
    _catalog_entry(
        "NVIDIA GH200 480GB",
        97871,
        "hopper",
        (9, 0),
        "nvidia-smi total commonly reported for the GH200 with 96 GB HBM3 (97871MiB); not "
        "checked against a public report here. The Grace CPU's LPDDR5X is reachable over "
        "NVLink-C2C but is not counted here",
        ("gh200", "gh200 96gb", "grace hopper"),
    ),
    _catalog_entry(
        "NVIDIA B200",
        183359,
        "blackwell",
        (10, 0),
        _nvidia_smi_report("NVIDIA/TensorRT-LLM#10278: 183359MiB"),
        ("b200", "b200 180gb", "b200 192gb"),
    ),
    # -- Jetson (unified memory) -----------------------------------------------------------------
    _catalog_entry(
        "NVIDIA Jetson AGX Orin 64GB",
        65536,
        "ampere",
        (8, 7),
        _spec_sheet("64 GB LPDDR5 shared by CPU and GPU (unified memory)"),
        ("jetson orin", "agx orin", "jetson agx orin", "orin 64gb", "agx orin 64gb", "orin"),
        unified=True,
    ),
    _catalog_entry(
        "NVIDIA Jetson AGX Orin 32GB",
        32768,
        "ampere",
        (8, 7),
        _spec_sheet("32 GB LPDDR5 shared by CPU and GPU (unified memory)"),
        ("agx orin 32gb", "orin 32gb", "jetson agx orin 32gb"),
        unified=True,
    ),
    _catalog_entry(
        "NVIDIA Jetson Orin Nano 8GB",
        8192,
        "ampere",
        (8, 7),
        _spec_sheet("8 GB LPDDR5 shared by CPU and GPU (unified memory)"),
        ("orin nano", "jetson orin nano", "orin nano 8gb"),
        unified=True,
    ),
)


# -- more of the cards people train on (issue 22) ----------------------------------------------
# GeForce desktop and laptop (Pascal to Blackwell), workstation, data centre, Jetson. A figure
# from ``_public_smi`` is the total nvidia-smi printed; ``_spec_sheet`` marks the nominal size.

_PASCAL = "pascal"
_BLACKWELL_ESTIMATE = (
    "the driver's total is estimated as 0.995 of the nominal size, as the RTX 5070 (12227 of "
    "12288 MiB) and 5090 (32607 of 32768 MiB) report"
)

_MORE: tuple[GpuSpec, ...] = (
    # -- GeForce 10 (Pascal) and Pascal data centre --------------------------------------------
    _catalog_entry(
        "NVIDIA GeForce GTX 1050 Ti", 4096, _PASCAL, (6, 1),
        _spec_sheet("4 GB GDDR5"), ("gtx 1050 ti", "1050 ti", "1050ti"),
    ),
    _catalog_entry(
        "NVIDIA GeForce GTX 1060 6GB", 6144, _PASCAL, (6, 1),
        _public_smi("6144MiB, a GTX 1060 6GB beside another card"),
        ("gtx 1060", "1060", "1060 6gb", "gtx 1060 6gb"),
    ),
    _catalog_entry(
        "NVIDIA GeForce GTX 1070", 8192, _PASCAL, (6, 1),
        _public_smi("8192MiB, a GTX 1070 at 151 W"), ("gtx 1070", "1070"),
    ),
    _catalog_entry(
        "NVIDIA GeForce GTX 1070 Ti", 8192, _PASCAL, (6, 1),
        _spec_sheet("8 GB GDDR5, as the GTX 1070"), ("gtx 1070 ti", "1070 ti", "1070ti"),
    ),
    _catalog_entry(
        "NVIDIA GeForce GTX 1080", 8192, _PASCAL, (6, 1),
        _public_smi("8192MiB, a GTX 1080 at 180 W"), ("gtx 1080", "1080"),
    ),
    _catalog_entry(
        "NVIDIA GeForce GTX 1080 Ti", 11264, _PASCAL, (6, 1),
        _public_smi("11264MiB, several GTX 1080 Ti desktops"),
        ("gtx 1080 ti", "1080 ti", "1080ti"),
    ),
    _catalog_entry(
        "NVIDIA TITAN Xp", 12288, _PASCAL, (6, 1),
        _spec_sheet("12 GB GDDR5X"), ("titan xp",),
    ),
    _catalog_entry(
        "Tesla P100-PCIE-16GB", 16276, _PASCAL, (6, 0),
        "16276 MiB: a public test's recorded `nvidia-smi --query-gpu` CSV and hashcat's "
        "device listing (16276 MB) for the P100 Kaggle and clusters run; TensorFlow shows "
        "15.90 GiB",
        ("p100", "tesla p100", "p100 16gb", "p100-pcie-16gb"),
    ),
    _catalog_entry(
        "Tesla P40", 24576, _PASCAL, (6, 1),
        _spec_sheet("24 GB GDDR5"), ("p40", "tesla p40"),
    ),
    # -- GeForce 16 / 20 (Turing) and Turing workstation -----------------------------------------
    _catalog_entry(
        "NVIDIA GeForce GTX 1650 SUPER", 4096, "turing", (7, 5),
        _spec_sheet("4 GB GDDR6"), ("gtx 1650 super", "1650 super", "1650super"),
    ),
    _catalog_entry(
        "NVIDIA GeForce GTX 1660", 6144, "turing", (7, 5),
        _public_smi("6144MiB, a GTX 1660 at 140 W"), ("gtx 1660", "1660"),
    ),
    _catalog_entry(
        "NVIDIA GeForce GTX 1660 SUPER", 6144, "turing", (7, 5),
        _spec_sheet("6 GB GDDR6, as the GTX 1660"), ("gtx 1660 super", "1660 super", "1660super"),
    ),
    _catalog_entry(
        "NVIDIA GeForce GTX 1660 Ti", 6144, "turing", (7, 5),
        _public_smi("6144MiB, GTX 1660 Ti desktops and an 80 W laptop; NVML gives laptops the "
                    "same name"),
        ("gtx 1660 ti", "1660 ti", "1660ti", "gtx 1660 ti laptop", "1660 ti laptop"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 2060", 6144, "turing", (7, 5),
        _public_smi("6144MiB, RTX 2060 desktops at 170-183 W and a 90 W laptop"),
        ("rtx 2060", "2060", "rtx 2060 6gb"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 2060 SUPER", 8192, "turing", (7, 5),
        _public_smi("8192MiB, an 'RTX 2060 ...' (name cut by nvidia-smi) at 175 W"),
        ("rtx 2060 super", "2060 super", "2060super"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 2060 Laptop GPU", 6144, "turing", (7, 5),
        _spec_sheet("6 GB GDDR6"), ("rtx 2060 laptop", "2060 laptop", "2060m"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 2070", 8192, "turing", (7, 5),
        _spec_sheet("8 GB GDDR6; Turing cards report the full size"), ("rtx 2070", "2070"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 2070 SUPER", 8192, "turing", (7, 5),
        _public_smi("8192MiB, 'RTX 2070 ...' cards (name cut by nvidia-smi) at 215 W"),
        ("rtx 2070 super", "2070 super", "2070super"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 2070 Laptop GPU", 8192, "turing", (7, 5),
        _spec_sheet("8 GB GDDR6"), ("rtx 2070 laptop", "2070 laptop", "2070m"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 2080", 8192, "turing", (7, 5),
        _spec_sheet("8 GB GDDR6; Turing cards report the full size"), ("rtx 2080", "2080"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 2080 SUPER", 8192, "turing", (7, 5),
        _public_smi("8192MiB, an 'RTX 2080 ...' (name cut by nvidia-smi) at 250 W"),
        ("rtx 2080 super", "2080 super", "2080super"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 2080 Laptop GPU", 8192, "turing", (7, 5),
        _spec_sheet("8 GB GDDR6"), ("rtx 2080 laptop", "2080 laptop", "2080m"),
    ),
    _catalog_entry(
        "NVIDIA TITAN RTX", 24576, "turing", (7, 5),
        _spec_sheet("24 GB GDDR6"), ("titan rtx",),
    ),
    _catalog_entry(
        "Quadro RTX 4000", 8192, "turing", (7, 5),
        _nvidia_smi_report("akash-network/provider-configs#12: 8192MiB"),
        ("quadro rtx 4000", "rtx 4000 quadro"),
    ),
    _catalog_entry(
        "Quadro RTX 5000", 16384, "turing", (7, 5),
        _spec_sheet("16 GB GDDR6"), ("quadro rtx 5000", "rtx 5000"),
    ),
    _catalog_entry(
        "Quadro RTX 6000", 24576, "turing", (7, 5),
        _spec_sheet("24 GB GDDR6 (ECC off; ECC on leaves about 6% less)"),
        ("quadro rtx 6000", "rtx 6000"),
    ),
    _catalog_entry(
        "Quadro RTX 8000", 49152, "turing", (7, 5),
        _spec_sheet("48 GB GDDR6 (ECC off; ECC on leaves about 6% less)"),
        ("quadro rtx 8000", "rtx 8000"),
    ),
    # -- GeForce 30 (Ampere) desktop and laptop, Ampere workstation and data centre ------------
    _catalog_entry(
        "NVIDIA GeForce RTX 3050", 8192, "ampere", (8, 6),
        _spec_sheet("8 GB GDDR6 (the desktop card; a 6 GB version exists)"),
        ("rtx 3050", "3050", "rtx 3050 8gb"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 3060 Laptop GPU", 6144, "ampere", (8, 6),
        _public_smi("6144MiB, 'RTX 3060 ...' laptops at 25-115 W; Windows' WMI says 4 GB, "
                    "wrongly"),
        ("rtx 3060 laptop", "3060 laptop", "3060m", "rtx 3060 mobile"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 3070 Laptop GPU", 8192, "ampere", (8, 6),
        _nvidia_smi_report("Akisoft41/py-nvtool#2: 'RTX 3070 ...' at 115 W, 8192MiB"),
        ("rtx 3070 laptop", "3070 laptop", "3070m", "rtx 3070 mobile"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 3070 Ti", 8192, "ampere", (8, 6),
        _spec_sheet("8 GB GDDR6X; Ampere cards report the full size"),
        ("rtx 3070 ti", "3070 ti", "3070ti"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 3070 Ti Laptop GPU", 8192, "ampere", (8, 6),
        _spec_sheet("8 GB GDDR6"), ("rtx 3070 ti laptop", "3070 ti laptop", "3070ti laptop"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 3080 Laptop GPU", 8192, "ampere", (8, 6),
        _nvidia_smi_report("Akisoft41/py-nvtool#2: 'RTX 3080 ...' at 115 W, 8192MiB")
        + "; a 16 GB version exists: give --gpu 16GiB for it",
        ("rtx 3080 laptop", "3080 laptop", "3080m", "rtx 3080 mobile"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 3080 Ti Laptop GPU", 16384, "ampere", (8, 6),
        _spec_sheet("16 GB GDDR6"), ("rtx 3080 ti laptop", "3080 ti laptop", "3080ti laptop"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 3090 Ti", 24564, "ampere", (8, 6),
        _public_smi("24564MiB, an RTX 3090 Ti in an external enclosure"),
        ("rtx 3090 ti", "3090 ti", "3090ti"),
    ),
    _catalog_entry(
        "NVIDIA RTX A2000", 6144, "ampere", (8, 6),
        _spec_sheet("6 GB GDDR6 with ECC support"), ("rtx a2000", "a2000", "a2000 6gb"),
    ),
    _catalog_entry(
        "NVIDIA RTX A2000 12GB", 12288, "ampere", (8, 6),
        _spec_sheet("12 GB GDDR6 with ECC support"), ("rtx a2000 12gb", "a2000 12gb"),
    ),
    _catalog_entry(
        "NVIDIA RTX A4000", 16376, "ampere", (8, 6),
        _public_smi("16376MiB, several RTX A4000 servers with ECC off"),
        ("rtx a4000", "a4000"),
    ),
    _catalog_entry(
        "NVIDIA RTX A4500", 20480, "ampere", (8, 6),
        _spec_sheet("20 GB GDDR6 with ECC support"), ("rtx a4500", "a4500"),
    ),
    _catalog_entry(
        "NVIDIA A2", 15356, "ampere", (8, 6),
        _public_smi("15356MiB, several A2 servers with ECC on"), ("a2", "nvidia a2"),
    ),
    _catalog_entry(
        "NVIDIA A16", 15356, "ampere", (8, 6),
        _public_smi("15356MiB per GPU (an A16 board holds four), ECC on"),
        ("a16", "nvidia a16"),
    ),
    _catalog_entry(
        "NVIDIA A30", 24576, "ampere", (8, 0),
        _spec_sheet("24 GB HBM2"), ("a30", "nvidia a30"),
    ),
    _catalog_entry(
        "NVIDIA A40", 46068, "ampere", (8, 6),
        _public_smi("46068MiB, several A40 servers with ECC on"), ("a40", "nvidia a40"),
    ),
    _catalog_entry(
        "NVIDIA A100-PCIE-40GB", 40960, "ampere", (8, 0),
        _spec_sheet("40 GB HBM2, as the SXM4 40GB"),
        ("a100 pcie 40gb", "a100-pcie-40gb", "a100 40gb pcie"),
    ),
    # -- GeForce 40 (Ada) desktop and laptop, Ada workstation and data centre -------------------
    _catalog_entry(
        "NVIDIA GeForce RTX 4060", 8188, "ada", (8, 9),
        _public_smi("8188MiB, several RTX 4060 desktops at 115 W"),
        ("rtx 4060", "4060", "rtx 4060 8gb"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 4050 Laptop GPU", 6141, "ada", (8, 9),
        _public_smi("6141MiB, 'RTX 4050 ...' laptops at 30-125 W"),
        ("rtx 4050 laptop", "4050 laptop", "4050", "rtx 4050", "4050m"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 4060 Laptop GPU", 8188, "ada", (8, 9),
        _public_smi("8188MiB, 'RTX 4060 ...' laptops at 42-80 W"),
        ("rtx 4060 laptop", "4060 laptop", "4060m", "rtx 4060 mobile"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 4070 Laptop GPU", 8188, "ada", (8, 9),
        _public_smi("8188MiB, an 'RTX 4070 ...' laptop at 115 W"),
        ("rtx 4070 laptop", "4070 laptop", "4070m", "rtx 4070 mobile"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 4080 Laptop GPU", 12282, "ada", (8, 9),
        _public_smi("12282MiB, 'RTX 4080 ...' laptops at 105-160 W"),
        ("rtx 4080 laptop", "4080 laptop", "4080m", "rtx 4080 mobile"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 4090 Laptop GPU", 16376, "ada", (8, 9),
        _public_smi("16376MiB, 'RTX 4090 ...' laptops at 155 W"),
        ("rtx 4090 laptop", "4090 laptop", "4090m", "rtx 4090 mobile"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 4090 D", 24564, "ada", (8, 9),
        _spec_sheet("24 GB GDDR6X, as the RTX 4090 (24564MiB)"), ("rtx 4090 d", "4090 d", "4090d"),
    ),
    _catalog_entry(
        "NVIDIA RTX 1000 Ada Generation Laptop GPU", 6141, "ada", (8, 9),
        _public_smi("6141MiB, an RTX 1000 Ada laptop"),
        ("rtx 1000 ada laptop", "rtx 1000 ada", "1000 ada"),
    ),
    _catalog_entry(
        "NVIDIA RTX 2000 Ada Generation Laptop GPU", 8188, "ada", (8, 9),
        _spec_sheet("8 GB GDDR6; Ada cards report a few MiB under the nominal size"),
        ("rtx 2000 ada laptop", "2000 ada laptop"),
    ),
    _catalog_entry(
        "NVIDIA RTX 3500 Ada Generation Laptop GPU", 12282, "ada", (8, 9),
        _spec_sheet("12 GB GDDR6; Ada cards report a few MiB under the nominal size"),
        ("rtx 3500 ada laptop", "rtx 3500 ada", "3500 ada"),
    ),
    _catalog_entry(
        "NVIDIA RTX 5000 Ada Generation Laptop GPU", 16376, "ada", (8, 9),
        _spec_sheet("16 GB GDDR6; taken equal to the RTX 4090 Laptop GPU's 16376MiB"),
        ("rtx 5000 ada laptop", "5000 ada laptop"),
    ),
    _catalog_entry(
        "NVIDIA RTX 2000 Ada Generation", 16376, "ada", (8, 9),
        _spec_sheet("16 GB GDDR6 with ECC support; taken equal to the RTX A4000's 16376MiB"),
        ("rtx 2000 ada", "2000 ada"),
    ),
    _catalog_entry(
        "NVIDIA RTX 4000 SFF Ada Generation", 20475, "ada", (8, 9),
        _public_smi("20475MiB, RTX 4000 SFF Ada servers at 70 W"),
        ("rtx 4000 sff ada", "4000 sff ada", "rtx 4000 sff"),
    ),
    _catalog_entry(
        "NVIDIA RTX 4000 Ada Generation", 20475, "ada", (8, 9),
        _public_smi("20475MiB, several RTX 4000 Ada cards at 130 W"),
        ("rtx 4000 ada", "4000 ada"),
    ),
    _catalog_entry(
        "NVIDIA RTX 4500 Ada Generation", 24564, "ada", (8, 9),
        _spec_sheet("24 GB GDDR6; taken equal to the RTX 4090's 24564MiB"),
        ("rtx 4500 ada", "4500 ada"),
    ),
    _catalog_entry(
        "NVIDIA RTX 5000 Ada Generation", 32760, "ada", (8, 9),
        _public_smi("32760MiB, RTX 5000 Ada workstations at 250 W"),
        ("rtx 5000 ada", "5000 ada"),
    ),
    _catalog_entry(
        "NVIDIA RTX 6000 Ada Generation", 49140, "ada", (8, 9),
        _public_smi("49140MiB, several RTX 6000 Ada workstations with ECC off"),
        ("rtx 6000 ada", "6000 ada"),
    ),
    _catalog_entry(
        "NVIDIA L20", 46068, "ada", (8, 9),
        _public_smi("46068MiB with ECC on, 49140MiB with it off"), ("l20",),
    ),
    _catalog_entry(
        "NVIDIA L40", 46068, "ada", (8, 9),
        _spec_sheet("48 GB GDDR6 with ECC on by default; taken equal to the L40S (46068MiB)"),
        ("l40",),
    ),
    # -- Hopper ----------------------------------------------------------------------------------
    _catalog_entry(
        "NVIDIA H100 NVL", 95830, "hopper", (9, 0),
        _public_smi("95830MiB, several H100 NVL servers"), ("h100 nvl", "h100nvl", "h100 94gb"),
    ),
    _catalog_entry(
        "NVIDIA H200 NVL", 143771, "hopper", (9, 0),
        _spec_sheet("141 GB HBM3e; taken equal to the H200 SXM's 143771MiB"),
        ("h200 nvl", "h200nvl"),
    ),
    # -- GeForce 50 (Blackwell) and Blackwell workstation ----------------------------------------
    _catalog_entry(
        "NVIDIA GeForce RTX 5060", 8151, "blackwell", (12, 0),
        _spec_sheet("8 GB GDDR7; " + _BLACKWELL_ESTIMATE), ("rtx 5060", "5060"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 5060 Ti", 16303, "blackwell", (12, 0),
        _spec_sheet("16 GB GDDR7 (the 16 GB card; an 8 GB one is 'RTX 5060 Ti 8GB'); "
                    + _BLACKWELL_ESTIMATE),
        ("rtx 5060 ti", "5060 ti", "5060ti", "5060 ti 16gb"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 5060 Ti 8GB", 8151, "blackwell", (12, 0),
        _spec_sheet("8 GB GDDR7; NVML names it 'NVIDIA GeForce RTX 5060 Ti' too; "
                    + _BLACKWELL_ESTIMATE),
        ("rtx 5060 ti 8gb", "5060 ti 8gb", "5060ti 8gb"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 5060 Laptop GPU", 8151, "blackwell", (12, 0),
        _spec_sheet("8 GB GDDR7; " + _BLACKWELL_ESTIMATE), ("rtx 5060 laptop", "5060 laptop"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 5070 Laptop GPU", 8151, "blackwell", (12, 0),
        _spec_sheet("8 GB GDDR7; " + _BLACKWELL_ESTIMATE), ("rtx 5070 laptop", "5070 laptop"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 5070 Ti Laptop GPU", 12227, "blackwell", (12, 0),
        _spec_sheet("12 GB GDDR7; taken equal to the RTX 5070's 12227MiB"),
        ("rtx 5070 ti laptop", "5070 ti laptop"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 5080 Laptop GPU", 16303, "blackwell", (12, 0),
        _spec_sheet("16 GB GDDR7; " + _BLACKWELL_ESTIMATE), ("rtx 5080 laptop", "5080 laptop"),
    ),
    _catalog_entry(
        "NVIDIA GeForce RTX 5090 Laptop GPU", 24453, "blackwell", (12, 0),
        _spec_sheet("24 GB GDDR7; " + _BLACKWELL_ESTIMATE), ("rtx 5090 laptop", "5090 laptop"),
    ),
    _catalog_entry(
        "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", 97812, "blackwell", (12, 0),
        _spec_sheet("96 GB GDDR7 with ECC support; " + _BLACKWELL_ESTIMATE),
        ("rtx pro 6000", "rtx pro 6000 blackwell", "pro 6000"),
    ),
    # -- Volta -----------------------------------------------------------------------------------
    _catalog_entry(
        "NVIDIA TITAN V", 12288, "volta", (7, 0), _spec_sheet("12 GB HBM2"), ("titan v",),
    ),
    _catalog_entry(
        "Quadro GV100", 32768, "volta", (7, 0),
        _spec_sheet("32 GB HBM2"), ("quadro gv100", "gv100"),
    ),
    # -- Jetson (unified memory) -----------------------------------------------------------------
    _catalog_entry(
        "NVIDIA Jetson Orin Nano 4GB", 4096, "ampere", (8, 7),
        _spec_sheet("4 GB LPDDR5 shared by CPU and GPU (unified memory)"),
        ("orin nano 4gb", "jetson orin nano 4gb"), unified=True,
    ),
    _catalog_entry(
        "NVIDIA Jetson Orin NX 8GB", 8192, "ampere", (8, 7),
        _spec_sheet("8 GB LPDDR5 shared by CPU and GPU (unified memory)"),
        ("orin nx 8gb", "jetson orin nx 8gb"), unified=True,
    ),
    _catalog_entry(
        "NVIDIA Jetson Orin NX 16GB", 16384, "ampere", (8, 7),
        _spec_sheet("16 GB LPDDR5 shared by CPU and GPU (unified memory)"),
        ("orin nx", "jetson orin nx", "orin nx 16gb", "jetson orin nx 16gb"), unified=True,
    ),
    _catalog_entry(
        "NVIDIA Jetson Xavier NX 8GB", 8192, "volta", (7, 2),
        _spec_sheet("8 GB LPDDR4x shared by CPU and GPU (unified memory)"),
        ("xavier nx", "jetson xavier nx", "xavier nx 8gb"), unified=True,
    ),
    _catalog_entry(
        "NVIDIA Jetson Xavier NX 16GB", 16384, "volta", (7, 2),
        _spec_sheet("16 GB LPDDR4x shared by CPU and GPU (unified memory)"),
        ("xavier nx 16gb", "jetson xavier nx 16gb"), unified=True,
    ),
    _catalog_entry(
        "NVIDIA Jetson AGX Xavier 32GB", 32768, "volta", (7, 2),
        _spec_sheet("32 GB LPDDR4x shared by CPU and GPU (unified memory)"),
        ("agx xavier", "jetson agx xavier", "xavier", "agx xavier 32gb"), unified=True,
    ),
    _catalog_entry(
        "NVIDIA Jetson AGX Xavier 64GB", 65536, "volta", (7, 2),
        _spec_sheet("64 GB LPDDR4x shared by CPU and GPU (unified memory)"),
        ("agx xavier 64gb", "jetson agx xavier 64gb"), unified=True,
    ),
)  # fmt: skip

_CATALOG = _CATALOG + _MORE


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


def _build_index() -> dict[str, tuple[GpuSpec, ...]]:
    index: dict[str, list[GpuSpec]] = {}
    for spec in _CATALOG:
        for key in _keys_for(spec):
            bucket = index.setdefault(key, [])
            if spec not in bucket:
                bucket.append(spec)
    return {k: tuple(v) for k, v in index.items()}


_INDEX: dict[str, tuple[GpuSpec, ...]] = _build_index()
_BARE_NUMBER = re.compile(r"^\s*\d+(\.\d+)?\s*$")
_SIZE_LIKE = re.compile(
    r"^\s*[+-]?\d+(\.\d+)?(e[+-]?\d+)?\s*([kmgt]i?b|[kmgt]|b)?\s*$", re.IGNORECASE
)


def list_gpus() -> list[GpuSpec]:
    """Every GPU in the catalog, by memory: discrete cards small to large, then Jetson
    modules (unified memory) small to large."""
    return sorted(_CATALOG, key=lambda s: (s.unified_memory, s.total_bytes, s.name))


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
    if isinstance(total_bytes, bool) or total_bytes <= 0:
        raise ConfigError(
            f"host memory must be a positive size, not {total_bytes!r}",
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
    found = _INDEX.get(normalize_name(text), ())
    if len(found) != 1:
        return None
    number = text.strip()
    return f"{number} is read as the {found[0].name}; for a size, give a unit ({number}MiB)"


def _nearest(query: str, n: int = 3) -> list[str]:
    """The ``n`` catalog names whose lookup keys are most like ``query`` (difflib ratio)."""
    scored: list[tuple[float, int, str]] = []
    for order, spec in enumerate(_CATALOG):
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
    key = normalize_name(name_or_size)
    found = _INDEX.get(key, ())
    if len(found) == 1:
        return found[0]
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
    prefixed = [s for s in _CATALOG if key and any(k.startswith(key) for k in _keys_for(s))]
    if len(prefixed) > 1:
        names = ", ".join(s.name for s in prefixed[:3])
        more = f" (and {len(prefixed) - 3} more)" if len(prefixed) > 3 else ""
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


# The catalog must stay consistent; checked once at import (cheap, pure).
def _check_catalog() -> None:
    names = [s.name for s in _CATALOG]
    if len(set(names)) != len(names):
        raise RuntimeError("memfit catalog: duplicate GPU names")
    for spec in _CATALOG:
        if spec.arch not in ARCHITECTURES or spec.total_bytes <= 0 or not spec.source:
            raise RuntimeError(f"memfit catalog: bad entry {spec.name!r}")


_check_catalog()
