"""``--runtime`` on estimate, plan and fit: the target's software sizes the CUDA context."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from _cli_run import run, run_json, user_error
from _user_module import user_module

from memfit.hardware.runtime import (
    EAGER_CONTEXT_BYTES,
    LAZY_CONTEXT_BYTES,
    LAZY_KERNEL_IMAGES_BYTES,
)

FACTORY = textwrap.dedent(
    """
    import torch
    from torch import nn
    from memfit.estimate import TorchStep

    def build():
        model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
        return model, torch.optim.SGD(model.parameters(), lr=0.1)

    def step(model, optimizer, batch):
        nn.functional.cross_entropy(model(batch[0]), batch[1]).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def make_batch(n):
        return torch.randn(n, 64), torch.randint(0, 4, (n,))

    def factory():
        return TorchStep(build=build, step=step, make_batch=make_batch)
    """
)


@pytest.fixture
def factory_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    return user_module(tmp_path, monkeypatch, "rtfactory_", FACTORY)


def test_plan_runtime_changes_only_the_context_and_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = ["plan", "dqn_fire_raster", "--gpu", "V100", "--set", "buffer_size=100000"]
    lazy = run_json(capsys, *base, "--json", "--runtime", "torch=2.4.1")
    eager = run_json(capsys, *base, "--json", "--runtime", "torch=1.10.0,cuda=11.2")
    assert lazy["breakdown"]["cuda_context"] == (
        LAZY_CONTEXT_BYTES["volta"] + LAZY_KERNEL_IMAGES_BYTES
    )
    assert eager["breakdown"]["cuda_context"] == EAGER_CONTEXT_BYTES
    assert eager["context"]["runtime"]["loading_reason"].startswith("CUDA 11.2 has no lazy")
    code, out, _ = run(capsys, *base, "--runtime", "torch=1.10.0,cuda=11.2")
    assert code == 0
    assert "cuda_context: 1.31 GiB with eager module loading" in " ".join(out.split())


def test_plan_tiers_take_the_runtime(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(
        capsys, "plan", "dqn_fire_raster", "--all-gpus", "--json", "--runtime", "cuda=11.2"
    )
    contexts = [p["breakdown"]["cuda_context"] for p in data["plans"] if "error" not in p]
    # a CUDA 11 build's eager context: 1,341 MiB before Ampere, 1,690 MiB from Ampere on
    assert contexts and all(c in (EAGER_CONTEXT_BYTES, 1690 * 2**20) for c in contexts)
    assert 1690 * 2**20 in contexts and EAGER_CONTEXT_BYTES in contexts


@pytest.mark.parametrize(
    ("value", "where"),
    [("cudaa=11.2", "runtime.cudaa"), ("cuda=11.x", "runtime.cuda"), ("torch", "runtime")],
)
def test_a_bad_runtime_is_a_user_error(
    capsys: pytest.CaptureFixture[str], value: str, where: str
) -> None:
    code, _, err = run(capsys, "plan", "dqn_fire_raster", "--gpu", "V100", "--runtime", value)
    user_error(code, err, where)


def test_estimate_runtime_moves_device_used_by_the_context_difference(
    factory_module: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["estimate", f"{factory_module}:factory", "--batch", "8", "--gpu", "V100", "--json"]
    lazy = run_json(capsys, *argv, "--runtime", "torch=2.4.1")
    eager = run_json(capsys, *argv, "--runtime", "torch=1.10.0,cuda=11.2,driver=460.91.03")
    assert eager["context"]["runtime"]["driver"] == "460.91.03"
    gap = eager["points"][0]["device_used_peak"] - lazy["points"][0]["device_used_peak"]
    assert gap == EAGER_CONTEXT_BYTES - LAZY_CONTEXT_BYTES["volta"] - LAZY_KERNEL_IMAGES_BYTES
    assert eager["points"][0]["reserved_peak"] == lazy["points"][0]["reserved_peak"]
    code, out, _ = run(capsys, *argv[:-1], "--runtime", "torch=1.10.0,cuda=11.2")
    assert code == 0 and "CUDA context 1.31 GiB (eager module loading" in " ".join(out.split())
    code, _, err = run(capsys, *argv, "--runtime", "module_loading=fast")
    user_error(code, err, "runtime.module_loading")


def test_fit_prior_reports_the_runtime(
    factory_module: str, capsys: pytest.CaptureFixture[str]
) -> None:
    data = run_json(
        capsys,
        "fit",
        f"{factory_module}:factory",
        "--device",
        "cpu",
        "--budget",
        "8MiB",
        "--high",
        "512",
        "--json",
        "--runtime",
        "torch=1.10.0,cuda=11.2",
    )
    assert data["prior"]["context"]["runtime"]["module_loading"] == "eager"
