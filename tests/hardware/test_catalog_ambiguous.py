"""Card names several cards share are asked about, not silently resolved; the missing names
are there; ``memfit gpus WORDS`` filters the list (issue 46, item 6)."""

from __future__ import annotations

import pytest
from _cli_run import run

from memfit.errors import ConfigError
from memfit.hardware.catalog import gpu

MiB = 2**20


@pytest.mark.parametrize(
    ("query", "listed"),
    [
        ("4060 Ti", ("RTX 4060 Ti (8188MiB)", "RTX 4060 Ti 16GB (16380MiB)")),
        ("RTX 4060 Ti", ("RTX 4060 Ti (8188MiB)", "RTX 4060 Ti 16GB")),
        ("T1000", ("NVIDIA T1000 (4096MiB)", "NVIDIA T1000 8GB")),
        ("jetson orin", ("Orin Nano 4GB", "Orin NX 16GB", "AGX Orin 32GB", "AGX Orin 64GB")),
        ("orin nano", ("Orin Nano 4GB", "Orin Nano 8GB")),
    ],
)
def test_a_shared_name_is_asked_about(query: str, listed: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError, match="matches several GPUs") as info:
        gpu(query)
    text = f"{info.value.message} {info.value.hint}"
    for name in listed:
        assert name in text, text


@pytest.mark.parametrize(
    ("query", "name", "mib"),
    [
        ("NVIDIA GeForce RTX 4060 Ti", "NVIDIA GeForce RTX 4060 Ti", 8188),  # a full name
        ("4060 Ti 8GB", "NVIDIA GeForce RTX 4060 Ti", 8188),
        ("3070 Laptop 8GB", "NVIDIA GeForce RTX 3070 Laptop GPU", 8192),
        ("GTX 1660 Ti Laptop", "NVIDIA GeForce GTX 1660 Ti Laptop", 6144),
        ("GTX 1650 Ti", "NVIDIA GeForce GTX 1650 Ti", 4096),
        ("GTX 1650 Laptop", "NVIDIA GeForce GTX 1650 Laptop", 4096),
        ("RTX 2050", "NVIDIA GeForce RTX 2050", 4096),
        ("T600", "NVIDIA T600", 4096),
        ("Quadro T1000", "Quadro T1000", 4096),
        ("H100", "NVIDIA H100 80GB HBM3", 81559),  # the catalog's chosen default stays
    ],
)
def test_names_users_type(query: str, name: str, mib: int) -> None:
    spec = gpu(query)
    assert (spec.name, spec.total_bytes) == (name, mib * MiB)
    assert "nvidia-smi" in spec.source or "spec sheet" in spec.source


def test_gpus_words_filter_the_list(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "gpus", "laptop", "--json")
    assert code == 0, err
    import json

    names = [g["name"] for g in json.loads(out)["gpus"]]
    assert len(names) > 20
    assert all("Laptop" in n or "laptop" in " ".join(gpu(n).aliases) for n in names)
    code, out, _err = run(capsys, "gpus", "4060 ti")
    assert code == 0 and "4060 Ti 16GB" in out and "known GPUs matching" in out
    code, _out, err = run(capsys, "gpus", "nosuchcardname")
    assert code == 1 and "unknown GPU" in err
