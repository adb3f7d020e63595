"""The target runtime and the CUDA context it costs (core/runtime.py, backends/software.py)."""

from __future__ import annotations

import pytest

import memfit
from memfit import ConfigError
from memfit.backends.software import installed_versions, target_runtime
from memfit.core.budget import compose_budget
from memfit.hardware.catalog import gpu
from memfit.hardware.runtime import (
    CONTEXT_SOURCES,
    EAGER_CONTEXT_BYTES,
    LAZY_CONTEXT_BYTES,
    LAZY_KERNEL_IMAGES_BYTES,
    cuda_context,
    parse_runtime,
    parse_version,
)
from memfit.units import MiB


@pytest.mark.parametrize(
    ("given", "loading", "because"),
    [
        ({"torch": "1.10.0", "cuda": "11.2"}, "eager", "no lazy loading"),
        ({"torch": "1.12.1", "cuda": "11.6"}, "eager", "no lazy loading"),
        ({"torch": "1.12.1", "cuda": "11.7"}, "eager", "before 1.13"),
        ({"torch": "1.13.0", "cuda": "11.7"}, "lazy", "from 1.13"),
        ({"torch": "2.4.1", "cuda": "12.1", "driver": "470.57.02"}, "eager", "R515"),
        ({"cuda": "12.2"}, "lazy", "from 12.2"),
        ({"torch": "1.12.1", "cuda": "12.4"}, "lazy", "from 12.2"),
        ({"torch": "2.4.1", "module_loading": "EAGER"}, "eager", "(given)"),
        ({}, "lazy", "no versions known"),
    ],
)
def test_module_loading_follows_the_documented_rules(
    given: dict[str, str], loading: str, because: str
) -> None:
    rt = parse_runtime(given)
    assert rt.module_loading == loading
    assert because in rt.loading_reason


def test_cli_text_and_mapping_read_the_same() -> None:
    text = parse_runtime("torch=1.10.0, cuda=11.2 ,driver=460.91.03,module_loading=eager")
    mapping = parse_runtime(
        {"torch": "1.10.0", "cuda": "11.2", "driver": "460.91.03", "module_loading": "eager"}
    )
    assert text == mapping


@pytest.mark.parametrize(
    ("value", "key_path"),
    [
        ({"cudaa": "11.2"}, "runtime.cudaa"),
        ("torch=1.10,nvcc=11", "runtime.nvcc"),
        ({"cuda": "eleven"}, "runtime.cuda"),
        ({"torch": 1.10}, "runtime.torch"),
        ({"driver": "R470"}, "runtime.driver"),
        ({"module_loading": "sometimes"}, "runtime.module_loading"),
        ("torch=1.10.0,torch=2.0.0", "runtime.torch"),
        ("torch", "runtime"),
        (["torch=1.10.0"], "runtime"),
        (11.2, "runtime"),
    ],
)
def test_a_bad_runtime_is_a_config_error_naming_the_key(value: object, key_path: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_runtime(value)  # type: ignore[arg-type]
    assert info.value.key_path == key_path
    assert info.value.hint


def test_versions_with_local_and_prerelease_tails() -> None:
    assert parse_version("2.6.0a0+gitabc", "torch") == (2, 6, 0)
    assert parse_version("1.13.0.dev20221005", "torch") == (1, 13, 0)
    assert parse_version("12.1", "cuda") == (12, 1)


def test_naming_a_version_forgets_the_installed_ones() -> None:
    installed = {"torch": "2.13.0", "cuda": "12.8", "driver": None, "module_loading": None}
    target = parse_runtime({"torch": "1.10.0"}, installed=installed)
    assert target.cuda is None and target.module_loading == "eager"
    same = parse_runtime(None, installed=installed, installed_origin="installed torch 2.13.0")
    assert same.torch == "2.13.0" and same.cuda == "12.8" and same.module_loading == "lazy"
    assert same.origin == "installed torch 2.13.0"


def test_installed_versions_read_the_wheel_and_the_environment() -> None:
    found = installed_versions({"CUDA_MODULE_LOADING": "EAGER"})
    assert found["torch"] is not None and "+" not in found["torch"]
    assert found["module_loading"] == "eager"
    assert target_runtime(None).torch == found["torch"]
    assert installed_versions({})["module_loading"] is None


def test_eager_context_is_the_published_v100_figure_and_lazy_the_arch_table() -> None:
    v100 = gpu("V100")
    eager = cuda_context(v100, parse_runtime("torch=1.10.0,cuda=11.2"))
    lazy = cuda_context(v100, parse_runtime("torch=2.4.1,cuda=12.1"))
    assert eager.bytes == EAGER_CONTEXT_BYTES == 1341 * MiB
    # lazily: the context once started plus the kernel images a step loads, whose figure
    # was measured on the H100 only (assumed here)
    # (the context once started: 5 MiB and 80 SMs x 2,048 threads x 2 KiB per thread)
    assert lazy.bytes == LAZY_CONTEXT_BYTES["volta"] + LAZY_KERNEL_IMAGES_BYTES == 552 * MiB
    assert lazy.kernel_images_bytes == LAZY_KERNEL_IMAGES_BYTES and lazy.basis == "assumed"
    assert cuda_context(v100, lazy.runtime, kernels=False).bytes == (5 + 320) * MiB
    # a small card reserves less local memory: a T4's 40 SMs x 1,024 threads
    assert cuda_context(gpu("T4"), lazy.runtime, kernels=False).bytes == (5 + 80) * MiB
    h100 = cuda_context(gpu("H100"), parse_runtime("torch=2.11.0,cuda=13.0"))
    assert (h100.bytes, h100.basis) == (760 * MiB, "fitted")  # the project's own capture
    assert eager.source.endswith(CONTEXT_SOURCES["eager"]) and "V100" in eager.source
    assert "CUDA 11.2 (given) build: 1,341 MiB" in eager.source
    assert "#86509" in lazy.source and eager.unknowns
    # Where the sources disagree, the larger (conservative) figure is taken.
    assert "takes the larger" in CONTEXT_SOURCES["eager"]
    # a CUDA 11 build on Ampere and newer carries more kernels (pytorch#55277: 1,685 MiB)
    assert cuda_context(gpu("H100"), eager.runtime).bytes == 1690 * MiB
    assert cuda_context(memfit.hardware.catalog.host_device(2**34), eager.runtime).bytes == 0


def test_a_jax_process_has_its_own_kernel_image_class() -> None:
    """Issue 41/44: the kernel images are a class per framework. A JAX process's are fitted
    nowhere (no reading of a JAX step isolates them): torch's figure stands in, ``assumed``,
    and the estimate says why; its context once started is the same as torch's."""
    rt = parse_runtime("torch=2.11.0,cuda=13.0")
    for card in ("H100", "RTX 4070", "L40S"):
        torch = cuda_context(gpu(card), rt)
        jax = cuda_context(gpu(card), rt, framework="jax")
        assert jax.bytes == torch.bytes and jax.kernel_images_bytes == LAZY_KERNEL_IMAGES_BYTES
        assert jax.basis == "assumed"
        assert any("JAX step" in u for u in jax.unknowns)
        assert not any("JAX step" in u for u in torch.unknowns)
        started = cuda_context(gpu(card), rt, kernels=False, framework="jax")
        assert started.bytes == cuda_context(gpu(card), rt, kernels=False).bytes
        assert started.basis == "fitted"  # no kernel images: the started context's rule
    assert cuda_context(gpu("H100"), rt).basis == "fitted"  # torch's H100 capture


def test_cuda_context_names_a_framework_it_does_not_know() -> None:
    with pytest.raises(ConfigError, match="framework must be one of 'torch', 'jax'"):
        cuda_context(gpu("H100"), framework="tensorflow")


@pytest.mark.parametrize(
    ("card", "runtime", "mib"),
    [
        # torch 1.7.1 without CUDA: its default wheel is the CUDA 10.2 build
        ("V100", "torch=1.7.1", 880),
        ("GTX 1080", "torch=1.8.2,cuda=10.1", 720),
        ("V100", "torch=1.10.0,cuda=11.2", 1341),
        ("RTX 3090", "torch=1.8.2,cuda=11.1", 1690),
        # nothing known of the build: the V100 CUDA 11.2 figure
        ("V100", "module_loading=eager", 1341),
    ],
)
def test_the_eager_context_follows_the_build(card: str, runtime: str, mib: int) -> None:
    est = cuda_context(gpu(card), parse_runtime(runtime))
    assert est.bytes == mib * MiB
    assert f"{mib:,} MiB" in est.source


def test_the_budget_and_the_plan_carry_the_runtime_they_assumed() -> None:
    eager = parse_runtime("torch=1.10.0,cuda=11.2")
    budget = compose_budget(gpu("V100"), runtime=eager)
    assert budget.context_bytes == EAGER_CONTEXT_BYTES
    assert budget.context is not None and budget.context.runtime is eager
    lazy_plan = memfit.plan("dqn_fire_raster", gpu="V100", runtime={"torch": "2.4.1"})
    eager_plan = memfit.plan("dqn_fire_raster", gpu="V100", runtime="torch=1.10.0,cuda=11.2")
    assert eager_plan.breakdown["cuda_context"] - lazy_plan.breakdown["cuda_context"] == (
        EAGER_CONTEXT_BYTES - LAZY_CONTEXT_BYTES["volta"] - LAZY_KERNEL_IMAGES_BYTES
    )
    assert eager_plan.context is not None
    assert eager_plan.context["runtime"]["module_loading"] == "eager"
    assert eager_plan.to_dict()["context"]["runtime"]["cuda"] == "11.2"
    with pytest.raises(ConfigError, match=r"runtime\.cudaa"):
        memfit.plan("dqn_fire_raster", gpu="V100", runtime={"cudaa": "11.2"})


def test_a_given_context_is_not_described_as_estimated() -> None:
    budget = compose_budget(gpu("V100"), context_bytes=0)
    assert budget.context is None and budget.context_bytes == 0


def test_the_feasible_space_of_a_sweep_takes_the_runtime_too() -> None:
    from memfit.planning import feasible

    lazy = feasible("dqn_fire_raster@device_replay", gpu="3.68GiB", runtime="torch=2.4.1")
    eager = feasible("dqn_fire_raster@device_replay", gpu="3.68GiB", runtime="cuda=11.2")
    assert len(eager) < len(lazy)  # a 1.3 GiB context leaves room for fewer configurations
    assert set(map(str, eager.configs)) <= set(map(str, lazy.configs))
    best = memfit.plan("dqn_fire_raster@device_replay", gpu="3.68GiB", runtime="cuda=11.2")
    assert best.knobs in eager.configs


def test_the_cudnn_version_is_part_of_the_runtime_and_decides_the_conv_rules() -> None:
    from memfit.estimate.torch._cuda_target import CudaTarget

    rt = parse_runtime("torch=2.11.0,cuda=13.0,cudnn=9.19.0")
    assert rt.cudnn == "9.19.0" and "cudnn" in rt.given
    assert rt.describe().endswith("cuDNN 9.19.0") and rt.to_dict()["cudnn"] == "9.19.0"
    assert parse_runtime({"torch": "2.11.0"}).cudnn is None
    with pytest.raises(ConfigError, match="cudnn"):
        parse_runtime("cudnn=nine")
    # a given cuDNN wins over the one the torch wheels bundle (cuDNN 9 from torch 2.4)
    assert CudaTarget(None, (2, 6), (12, 4), 0, cudnn_text="8.9.7").cudnn_major == 8
    assert CudaTarget(None, (2, 6), (12, 4), 0).cudnn_major == 9
