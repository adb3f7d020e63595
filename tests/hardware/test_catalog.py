"""GPU catalog lookups and the hardware constants of core/budget.py."""

from __future__ import annotations

import pytest

import memfit
from memfit import ConfigError
from memfit.hardware.catalog import (
    ARCHITECTURES,
    GpuSpec,
    anonymous_gpu,
    gpu,
    list_gpus,
    normalize_name,
)
from memfit.hardware.cuda import (
    cublas_workspace_bytes,
    cuda_context_bytes,
    parse_cublas_workspace_config,
)
from memfit.hardware.runtime import (
    CONTEXT_BASE_BYTES,
    LAZY_KERNEL_IMAGES_BYTES,
    lazy_started_context,
    local_memory_bytes,
)
from memfit.hardware.runtime import (
    EAGER_CONTEXT_BYTES as CUDA_CONTEXT_EAGER_BYTES,
)
from memfit.hardware.runtime import (
    LAZY_CONTEXT_BYTES as CUDA_CONTEXT_BYTES,
)
from memfit.hardware.runtime import (
    LAZY_CONTEXT_UNKNOWN_BYTES as CUDA_CONTEXT_UNKNOWN_BYTES,
)
from memfit.units import GiB, MiB


def test_catalog_has_at_least_100_gpus_with_sources() -> None:
    specs = list_gpus()
    assert len(specs) >= 100
    assert len({s.name for s in specs}) == len(specs)
    for spec in specs:
        assert spec.arch in ARCHITECTURES and spec.arch != "unknown"
        assert spec.compute_capability is not None
        assert spec.total_bytes % MiB == 0 and spec.total_bytes >= 4 * GiB
        assert len(spec.source) > 10
        if spec.cuda_total_bytes is not None:
            assert spec.cuda_total_bytes < spec.total_bytes


@pytest.mark.parametrize(
    ("query", "name", "mib"),
    [
        ("4090", "NVIDIA GeForce RTX 4090", 24564),
        ("rtx4090", "NVIDIA GeForce RTX 4090", 24564),
        ("RTX 4090", "NVIDIA GeForce RTX 4090", 24564),
        ("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090", 24564),
        ("H100 80GB", "NVIDIA H100 80GB HBM3", 81559),
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3", 81559),
        ("h100-pcie", "NVIDIA H100 PCIe", 81559),
        ("a100-80gb", "NVIDIA A100-SXM4-80GB", 81920),
        ("A100 40GB", "NVIDIA A100-SXM4-40GB", 40960),
        ("t4", "Tesla T4", 15360),
        ("Tesla T4", "Tesla T4", 15360),
        ("3060 Ti", "NVIDIA GeForce RTX 3060 Ti", 8192),
        ("rtx 3050 laptop", "NVIDIA GeForce RTX 3050 Laptop GPU", 4096),
        ("gtx1650", "NVIDIA GeForce GTX 1650", 4096),
        ("H200", "NVIDIA H200", 143771),
        ("b200", "NVIDIA B200", 183359),
        ("5090", "NVIDIA GeForce RTX 5090", 32607),
        ("a10g", "NVIDIA A10G", 23028),
        ("L40S", "NVIDIA L40S", 46068),
        ("v100 32gb", "Tesla V100-SXM2-32GB", 32768),
        ("jetson agx orin 64gb", "NVIDIA Jetson AGX Orin 64GB", 65536),
    ],
)
def test_forgiving_lookup(query: str, name: str, mib: int) -> None:
    spec = gpu(query)
    assert spec.name == name
    assert spec.total_bytes == mib * MiB


def test_public_name_is_the_catalog_lookup() -> None:
    assert memfit.gpu("4090") is gpu("NVIDIA GeForce RTX 4090")
    assert isinstance(memfit.GpuSpec, type)


def test_jetson_is_marked_unified_memory() -> None:
    assert gpu("orin nano 8gb").unified_memory
    assert not gpu("4090").unified_memory


def test_laptop_4gb_class_reports_about_3_68_gib_to_cuda() -> None:
    spec = gpu("a500 laptop")
    assert spec.cuda_total_bytes is not None
    assert spec.cuda_total_bytes / GiB == pytest.approx(3.68, abs=0.005)


@pytest.mark.parametrize(
    ("size", "total"),
    [("12GiB", 12 * GiB), ("8GB", 8 * 10**9), ("8192MiB", 8 * GiB), (24 * GiB, 24 * GiB)],
)
def test_size_gives_anonymous_gpu(size: str | int, total: int) -> None:
    spec = gpu(size)
    assert spec.total_bytes == total
    assert spec.arch == "unknown"
    assert spec.compute_capability is None
    assert spec.is_anonymous


def test_too_small_size_is_rejected_with_unit_hint() -> None:
    with pytest.raises(ConfigError, match="too small") as info:
        anonymous_gpu("4096")
    assert "4096MiB" in (info.value.hint or "")
    # given as a GPU, a bare number is a card's name or nothing (issue 22)
    with pytest.raises(ConfigError, match="needs a unit") as info:
        gpu("4096")
    assert "4096MiB" in (info.value.hint or "")


@pytest.mark.parametrize("query", ["rtx 9090", "gtx 480", "foo", "titan z"])
def test_unknown_name_lists_three_nearest(query: str) -> None:
    with pytest.raises(ConfigError, match="unknown GPU") as info:
        gpu(query)
    hint = info.value.hint or ""
    names = hint.removeprefix("nearest names: ").split(";")[0].split(", ")
    assert len(names) == 3
    known = {s.name for s in list_gpus()}
    assert set(names) <= known


def test_nearest_names_are_relevant() -> None:
    with pytest.raises(ConfigError) as info:
        gpu("rtx 9090")
    assert "RTX 4090" in (info.value.hint or "")


def test_ambiguous_name_lists_candidates() -> None:
    with pytest.raises(ConfigError, match="several GPUs") as info:
        gpu("a100")
    assert "A100-SXM4-80GB" in (info.value.hint or "")
    assert "A100-SXM4-40GB" in (info.value.hint or "")


@pytest.mark.parametrize("bad", ["", "   ", True, 3.5])
def test_bad_input_types(bad: object) -> None:
    with pytest.raises(ConfigError):
        gpu(bad)  # type: ignore[arg-type]


def test_normalize_name() -> None:
    assert normalize_name("NVIDIA GeForce RTX 4090") == "rtx4090"
    assert normalize_name("H100 80GiB") == "h10080gb"


def test_to_dict_is_plain_data() -> None:
    data = gpu("h100").to_dict()
    assert data["total_bytes"] == 81559 * MiB
    assert data["compute_capability"] == [9, 0]
    assert data["arch"] == "hopper"


# -- budget hardware constants ---------------------------------------------------------------------


def test_cublas_workspace_defaults() -> None:
    assert cublas_workspace_bytes(gpu("4090")) == 8 * MiB + 128 * 1024
    assert cublas_workspace_bytes(gpu("T4")) == 8 * MiB + 128 * 1024
    assert cublas_workspace_bytes(gpu("H100")) == 32 * MiB
    assert cublas_workspace_bytes(gpu("B200")) == 32 * MiB
    assert cublas_workspace_bytes(gpu("5090")) == 32 * MiB  # sm120 is >= sm90
    assert cublas_workspace_bytes(None) == 32 * MiB
    assert cublas_workspace_bytes(gpu("12GiB")) == 32 * MiB


def test_cublas_workspace_config_and_handles() -> None:
    assert cublas_workspace_bytes(gpu("4090"), config=":4096:8") == 32 * MiB
    assert cublas_workspace_bytes(gpu("H100"), handles=3) == 96 * MiB
    assert cublas_workspace_bytes(gpu("H100"), handles=0) == 0
    assert parse_cublas_workspace_config(":16:8") == 128 * 1024


@pytest.mark.parametrize("bad", ["4096:8", ":4096", ":a:8", "", ":4096:8:"])
def test_cublas_config_rejects_malformed(bad: str) -> None:
    with pytest.raises(ConfigError, match="cuBLAS"):
        parse_cublas_workspace_config(bad)


def test_cublas_rejects_negative_handles() -> None:
    with pytest.raises(ConfigError):
        cublas_workspace_bytes(None, handles=-1)


def test_cuda_context_in_published_range() -> None:
    # a step's lazy context: the context once started (107-555 MiB published by card; 5 MiB
    # and 2 KiB per resident thread) plus the kernel images (227 MiB); the H100 capture holds
    # 742-760 MiB
    for spec in list_gpus():
        ctx = cuda_context_bytes(spec)
        floor = CONTEXT_BASE_BYTES + LAZY_KERNEL_IMAGES_BYTES
        assert floor < ctx <= CUDA_CONTEXT_BYTES[spec.arch] + LAZY_KERNEL_IMAGES_BYTES
        assert local_memory_bytes(spec) is not None, f"{spec.name}: no SM count"
        assert ctx == CONTEXT_BASE_BYTES + local_memory_bytes(spec) + LAZY_KERNEL_IMAGES_BYTES
    # an architecture's fallback is its largest card's
    for arch, fallback in CUDA_CONTEXT_BYTES.items():
        cards = [s for s in list_gpus() if s.arch == arch]
        assert max(lazy_started_context(s) for s in cards) == fallback, arch
    unknown = CUDA_CONTEXT_UNKNOWN_BYTES + LAZY_KERNEL_IMAGES_BYTES
    assert cuda_context_bytes(None) == unknown
    assert cuda_context_bytes(gpu("12GiB")) == unknown
    assert cuda_context_bytes(gpu("T4")) < cuda_context_bytes(gpu("H100"))


def test_cuda_context_eager_loading_is_larger() -> None:
    for spec in (None, gpu("T4"), gpu("H100")):
        assert cuda_context_bytes(spec, lazy_loading=False) == max(
            cuda_context_bytes(spec), CUDA_CONTEXT_EAGER_BYTES
        )
        assert cuda_context_bytes(spec, lazy_loading=False) > cuda_context_bytes(spec)


def test_custom_spec_unknown_arch_uses_conservative_figures() -> None:
    spec = GpuSpec("x", 8 * GiB, "unknown", None, "test")
    assert cublas_workspace_bytes(spec) == 32 * MiB
    hopper_no_cc = GpuSpec("y", 8 * GiB, "hopper", None, "test")
    assert cublas_workspace_bytes(hopper_no_cc) == 32 * MiB
    ampere_no_cc = GpuSpec("z", 8 * GiB, "ampere", None, "test")
    assert cublas_workspace_bytes(ampere_no_cc) == 8 * MiB + 128 * 1024
