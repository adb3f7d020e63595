"""Issue 22: the seeds' cards by their everyday names, and a catalog of the cards people have."""

from __future__ import annotations

import pytest

from memfit.errors import ConfigError
from memfit.hardware.catalog import gpu, list_gpus, reading_note
from memfit.units import MiB


@pytest.mark.parametrize(
    ("query", "name", "mib"),
    [
        # seed 000's 8 GB card, by the names its owner uses
        ("4060", "NVIDIA GeForce RTX 4060", 8188),
        ("RTX 4060", "NVIDIA GeForce RTX 4060", 8188),
        ("NVIDIA GeForce RTX 4060", "NVIDIA GeForce RTX 4060", 8188),
        # laptops are their own entries, by NVML's name or a shorter one
        ("RTX 4060 Laptop GPU", "NVIDIA GeForce RTX 4060 Laptop GPU", 8188),
        ("NVIDIA GeForce RTX 4060 Laptop GPU", "NVIDIA GeForce RTX 4060 Laptop GPU", 8188),
        ("RTX 3060 Laptop", "NVIDIA GeForce RTX 3060 Laptop GPU", 6144),
        ("3060 mobile", "NVIDIA GeForce RTX 3060 Laptop GPU", 6144),
        # an exact name beats its Ti / SUPER / 16GB variants, which stay reachable
        ("RTX 4060 Ti 8GB", "NVIDIA GeForce RTX 4060 Ti", 8188),
        ("4060 Ti 16GB", "NVIDIA GeForce RTX 4060 Ti 16GB", 16380),
        ("RTX 3080", "NVIDIA GeForce RTX 3080", 10240),
        ("2060", "NVIDIA GeForce RTX 2060", 6144),
        ("2060 super", "NVIDIA GeForce RTX 2060 SUPER", 8192),
        # workstation, data centre, Jetson
        ("RTX 6000 Ada", "NVIDIA RTX 6000 Ada Generation", 49140),
        ("NVIDIA RTX 6000 Ada Generation", "NVIDIA RTX 6000 Ada Generation", 49140),
        ("H100 NVL", "NVIDIA H100 NVL", 95830),
        ("A100-PCIE-40GB", "NVIDIA A100-PCIE-40GB", 40960),
        ("xavier nx 8gb", "NVIDIA Jetson Xavier NX 8GB", 8192),
    ],
)
def test_everyday_names(query: str, name: str, mib: int) -> None:
    spec = gpu(query)
    assert spec.name == name and spec.total_bytes == mib * MiB


def test_a_bare_number_is_a_card_or_nothing() -> None:
    assert gpu("4060").name == "NVIDIA GeForce RTX 4060"
    note = reading_note("4060")
    assert note is not None and "RTX 4060" in note and "4060MiB" in note
    assert reading_note("RTX 4060") is None and reading_note("12GiB") is None
    for bare in ("4096", "12884901888", "8"):
        with pytest.raises(ConfigError, match="needs a unit") as info:
            gpu(bare)
        assert f"{bare}MiB" in (info.value.hint or "")
    # with a unit it is a size, as before
    assert gpu("4060MiB").total_bytes == 4060 * MiB and gpu("4060MiB").is_anonymous


_CC_ARCH = {
    (6, 0): "pascal", (6, 1): "pascal", (7, 0): "volta", (7, 2): "volta", (7, 5): "turing",
    (8, 0): "ampere", (8, 6): "ampere", (8, 7): "ampere", (8, 9): "ada", (9, 0): "hopper",
    (10, 0): "blackwell", (12, 0): "blackwell",
}  # fmt: skip


def test_every_entry_has_its_architecture_and_a_source() -> None:
    specs = list_gpus()
    assert len(specs) >= 100
    for spec in specs:
        assert spec.compute_capability is not None, spec.name
        assert _CC_ARCH[spec.compute_capability] == spec.arch, spec.name
        # provenance: the driver's figure from a named public output, or the spec sheet
        assert "nvidia-smi" in spec.source or "spec sheet" in spec.source or "MiB" in spec.source
    # the table is ordered by memory (discrete cards, then Jetson)
    totals = [s.total_bytes for s in specs if not s.unified_memory]
    assert totals == sorted(totals)


@pytest.mark.parametrize(
    "query",
    [
        # the families issue 22 names
        "GTX 1080 Ti", "GTX 1660 Ti", "RTX 2080 SUPER", "RTX 3090 Ti", "RTX 4090 Laptop",
        "RTX 5060", "RTX 5090 Laptop", "RTX A2000 6GB", "RTX A4000", "RTX A5000", "RTX A6000",
        "RTX 4000 Ada", "RTX 5000 Ada", "RTX 6000 Ada", "T4", "A2", "A10", "A16", "A30", "A40",
        "L4", "L40", "L40S", "A100 40GB", "A100 80GB", "A100 PCIe 80GB", "A100-PCIE-40GB",
        "H100 PCIe", "H100 SXM", "H100 NVL", "H200", "GH200", "B200", "AGX Orin 64GB",
        "Orin Nano 8GB", "Orin NX 16GB", "AGX Xavier 32GB", "Xavier NX 8GB",
    ],
)  # fmt: skip
def test_the_issue_families_are_in_the_catalog(query: str) -> None:
    assert not gpu(query).is_anonymous


def test_laptop_and_desktop_differ_where_their_memory_does() -> None:
    assert gpu("RTX 3060").total_bytes == 12288 * MiB
    assert gpu("RTX 3060 Laptop").total_bytes == 6144 * MiB
    assert gpu("RTX 4090 Laptop").total_bytes < gpu("RTX 4090").total_bytes
