"""The estimators take several GPUs (``gpu="4xRTX 4090"``) and add the collective terms per
device, with their basis (issue 44)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from memfit.cli.main import main
from memfit.errors import ConfigError
from memfit.estimate._devices import collectives, split_gpu
from memfit.units import MiB

SOURCE = textwrap.dedent(
    """
    import torch
    from memfit.estimate import TorchStep

    def _build():
        model = torch.nn.Linear(32, 32)
        return model, torch.optim.SGD(model.parameters(), lr=0.1)

    def _step(model, opt, batch):
        opt.zero_grad(set_to_none=True)
        model(batch).sum().backward()
        opt.step()

    def factory():
        return TorchStep(_build, _step, lambda b: torch.randn(b, 32))
    """
)


def test_the_count_is_split_from_the_card() -> None:
    assert split_gpu("4xRTX 4090") == ("RTX 4090", 4)
    assert split_gpu("H100") == ("H100", 1)
    assert split_gpu(None) == (None, 1)
    with pytest.raises(ConfigError, match="--gpu"):
        split_gpu("0xH100")


@pytest.mark.parametrize(
    ("gpu", "framework", "topology", "names"),
    [
        # GeForce over PCIe: no peer access, NCCL's buffers in host memory (SHM)
        (
            "4xRTX 4090",
            "torch",
            "pcie",
            ["nccl_channel_buffers", "nccl_dev_structs", "nccl_comm_base"],
        ),
        (
            "2xA100 80GB",
            "torch",
            "nvlink",
            ["nccl_channel_buffers", "nccl_dev_structs", "nccl_comm_base"],
        ),
        (
            "8xH100",
            "jax",
            "nvswitch",
            ["nccl_channel_buffers", "nccl_nvls", "nccl_dev_structs", "nccl_comm_base"],
        ),
    ],
)
def test_each_topology_gives_its_terms(
    gpu: str, framework: str, topology: str, names: list[str]
) -> None:
    several = collectives(gpu, framework=framework)
    assert several is not None and several.topology == topology
    assert [t.name for t in several.terms] == names
    assert all(t.basis in ("analytic", "fitted") for t in several.terms)
    assert several.every_device_bytes == sum(t.bytes for t in several.terms)
    assert any(topology in line for line in several.notes())


def test_jax_communicators_follow_the_jaxlib_and_devices_overrides() -> None:
    v = {"nccl": "2.21.5"}
    old = collectives("8xH100", framework="jax", jaxlib="0.4.25", devices=v)
    jax8 = collectives("8xH100", framework="jax", devices=v)
    torch8 = collectives("8xH100", framework="torch", jaxlib="0.4.25")
    three = collectives("8xH100", framework="jax", devices={"communicators": 3, **v})
    assert old is not None and jax8 is not None and torch8 is not None and three is not None
    # XLA's per-stream cliques before jaxlib 0.4.30; one clique per device group after
    assert old.every_device_bytes == 2 * torch8.every_device_bytes
    assert jax8.every_device_bytes == torch8.every_device_bytes
    assert three.every_device_bytes == 3 * torch8.every_device_bytes
    off = collectives("8xH100", framework="torch", devices={"nccl_env": {"NCCL_NVLS_ENABLE": "0"}})
    assert off is not None and "nccl_nvls" not in [t.name for t in off.terms]


def test_jax_without_an_nccl_version_takes_the_largest_release() -> None:
    unknown = collectives("8xH100", framework="jax")
    pinned = collectives("8xH100", framework="jax", devices={"nccl": "2.20.5"})
    newer = collectives("8xH100", framework="jax", devices={"nccl": "2.27.3"})
    assert unknown is not None and pinned is not None and newer is not None
    # jax[cuda12] leaves NCCL open: 2.20's NVLS (by the 24 collective channels) is the largest
    assert unknown.every_device_bytes == pinned.every_device_bytes > newer.every_device_bytes
    assert unknown.nccl is not None and unknown.nccl.nccl == (2, 20, 5)
    assert any("nvidia-nccl-cu12>=2.18.1" in note for note in unknown.nccl.notes)


def test_stray_contexts_follow_the_runtime() -> None:
    from memfit.hardware.runtime import parse_runtime

    stray = collectives(
        "8xV100",
        framework="torch",
        devices={"set_device": False},
        runtime=parse_runtime("torch=1.7.1"),
    )
    assert stray is not None and (stray.count, stray.strategy) == (8, "ddp")
    [term] = [t for t in stray.terms if t.device0_only]
    assert term.bytes == 7 * 880 * MiB  # a CUDA 10.2 build's eager context, on device 0


@pytest.mark.parametrize(
    ("gpu", "devices", "key"),
    [
        ("8xH100", {"topologyx": "pcie"}, "devices.topologyx"),
        ("8xH100", {"topology": "ring"}, "devices.topology"),
        ("H100", {"topology": "pcie"}, "devices"),
        ("8xH100", {"strategy": "single"}, "devices.strategy"),
    ],
)
def test_bad_device_settings_are_named(gpu: str, devices: dict[str, str], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        collectives(gpu, framework="torch", devices=devices)
    assert info.value.key_path == key


def test_estimate_jax_adds_the_terms_to_each_device() -> None:
    jax = pytest.importorskip("jax")
    import memfit

    arg = jax.ShapeDtypeStruct((64, 64), jax.numpy.float32)
    env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    one = memfit.estimate_jax(lambda x: x @ x, arg, gpu="H100", compiler="cpu", environ=env)
    eight = memfit.estimate_jax(lambda x: x @ x, arg, gpu="8xH100", compiler="cpu", environ=env)
    assert eight.collectives is not None and one.device_used_bytes is not None
    assert eight.device_used_bytes == one.device_used_bytes + eight.collectives.every_device_bytes
    names = [name for name, _, _ in eight.breakdown]
    assert {"nccl_channel_buffers", "nccl_nvls", "nccl_comm_base"} <= set(names)
    assert eight.to_dict()["collectives"]["count"] == 8


def test_the_cli_lines_name_each_term_its_basis_and_where() -> None:
    from memfit.cli.estimate import _collective_lines

    several = collectives("4xRTX 4090", framework="torch", devices={"set_device": False})
    assert several is not None and (several.card, several.count) == ("RTX 4090", 4)
    lines = _collective_lines({"collectives": several.to_dict()})
    assert lines[0].startswith("per device on 4 x RTX 4090 (pcie, ddp)")
    assert any(line.startswith("  nccl_comm_base (fitted, every device)") for line in lines)
    assert any(line.startswith("  stray_cuda_contexts (analytic, device 0 only)") for line in lines)
    assert _collective_lines({"points": [{"collectives": None}]}) == []


@pytest.mark.slow  # traces a step twice (about 20 s on the loaded VM)
def test_estimate_cli_names_the_terms(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "tinyddp44.py").write_text(SOURCE)
    monkeypatch.chdir(tmp_path)
    argv = ["estimate", "tinyddp44.py:factory", "--batch", "8,16", "--gpu", "4xRTX 4090"]
    assert main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "per device on 4 x RTX 4090 (pcie, ddp)" in out
    assert "nccl_comm_base (fitted, every device): 400.00 MiB" in out
    assert "in host memory (SHM transport)" in out


def _jax_prior(gpu: str) -> object:
    from memfit.estimate.xla.step import JaxEstimate

    return JaxEstimate(
        argument_bytes=0,
        output_bytes=0,
        alias_bytes=0,
        temp_bytes=0,
        generated_code_bytes=0,
        peak_bytes=None,
        executable_peak_bytes=1024,
        device_used_bytes=None,
        backend="cpu",
        batch_size=8,
        collectives=collectives(gpu, framework="jax"),
    )


def test_fit_leaves_the_collectives_share_of_the_default_budget() -> None:
    from memfit.errors import InfeasiblePlan
    from memfit.runtime.fit import _less_collectives

    several = collectives("4xRTX 4090", framework="jax")
    assert several is not None and (several.card, several.count) == ("RTX 4090", 4)
    share = several.every_device_bytes
    assert _less_collectives(2048 * MiB, _jax_prior("4xRTX 4090")) == 2048 * MiB - share
    assert _less_collectives(2048 * MiB, _jax_prior("RTX 4090")) == 2048 * MiB
    with pytest.raises(InfeasiblePlan, match="collective terms of 4 GPUs"):
        _less_collectives(share, _jax_prior("4xRTX 4090"))


@pytest.mark.slow  # two simulated fits (8 s each on the loaded VM)
def test_fit_runs_under_the_budget_less_the_collectives() -> None:
    import torch

    import memfit

    several = collectives("4xRTX 4090", framework="jax")
    assert several is not None and (several.card, several.count) == ("RTX 4090", 4)
    share = several.every_device_bytes

    def run(batch: int) -> None:
        (torch.ones(batch, 256) * 2).sum()

    with memfit.simulate_gpu("2GiB"):
        plain = memfit.fit(run, low=1, high=2, margin=0.0, max_probes=1)
        shared = memfit.fit(
            run, low=1, high=2, margin=0.0, max_probes=1, prior=_jax_prior("4xRTX 4090")
        )
    jax = collectives("4xRTX 4090", framework="jax")  # the prior's: one communicator per group
    assert jax is not None and jax.every_device_bytes == share  # SHM: the base alone
    assert shared.budget_bytes == plain.budget_bytes - jax.every_device_bytes
