"""``memfit fit`` through the CLI, on the CPU under a simulated GPU."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from _user_module import user_module

from memfit.cli.main import main

FACTORY = textwrap.dedent(
    """
    import torch
    from torch import nn

    from memfit.estimate import JaxStep, TorchStep

    SEEN = {}

    def build():
        torch.manual_seed(0)
        model = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 8 * 8, 10)
        )
        return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(model, optimizer, batch):
        x, y = batch
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def make_batch(n):
        return torch.randn(n, 3, 8, 8), torch.randint(0, 10, (n,))

    def factory():
        return TorchStep(build=build, step=step, make_batch=make_batch, batch_knob="batch_size")

    def jax_factory():
        return JaxStep(fn=lambda x: x, make_args=lambda n: (n,))
    """
)


@pytest.fixture
def factory_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh importable module (unique name) with a TorchStep factory, in the cwd."""
    return user_module(tmp_path, monkeypatch, "fitfactory_", FACTORY)


def _fit_argv(factory_module: str, *options: str) -> list[str]:
    """``memfit fit MODULE:factory --device cpu --budget 4MiB OPTIONS`` as argv."""
    return ["fit", f"{factory_module}:factory", "--device", "cpu", "--budget", "4MiB", *options]


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, object]:
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    data = json.loads(captured.out)
    assert isinstance(data, dict)
    return data


def test_fit_factory_on_a_simulated_gpu(
    factory_module: str, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _json(capsys, _fit_argv(factory_module, "--high", "4096", "--json"))
    probes = data["probes"]
    assert isinstance(probes, list) and 1 <= len(probes) <= 3
    value = data["value"]
    assert isinstance(value, int) and 1 <= value <= 4096
    peak = data["peak_bytes"]
    assert isinstance(peak, int) and peak <= 4 * 2**20 * 0.95
    assert data["knob"] == "batch_size" and data["device"] == "simulated"
    assert data["state_restored"] is True
    assert data["prior"] is not None
    # issue 41: the simulated GPU's budget counts no CUDA context, and says so
    assert data["context_counted"] is False
    notes = data["notes"]
    assert isinstance(notes, list) and notes[-1].startswith("no CUDA context is counted")


def test_fit_workload_file_keeps_the_knob_domain(
    factory_module: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workload = tmp_path / "w.yaml"
    workload.write_text(
        textwrap.dedent(
            f"""
            name: tiny_cnn
            family: custom
            estimator: torch
            factory: "{factory_module}:factory"
            terms:
              activations: "batch_size * 2048"
            knobs:
              batch_size: {{min: 8, max: 4096, step: 8}}
            """
        )
    )
    data = _json(capsys, ["fit", str(workload), "--device", "cpu", "--budget", "4MiB", "--json"])
    value = data["value"]
    assert isinstance(value, int) and value % 8 == 0
    assert data["workload"] == "tiny_cnn"
    assert data["domain"] == "8..4096 step 8"


@pytest.mark.slow  # tens of seconds of CPU: the slow suite runs it (issue 32)
def test_fit_human_output_and_no_prior(
    factory_module: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(_fit_argv(factory_module, "--high", "4096", "--no-prior", "--margin", "0"))
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "batch_size =" in captured.out and "probes" in captured.out
    assert "restored" in captured.err


def test_model_and_optimizer_state_are_restored(
    factory_module: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    import torch

    module = importlib.import_module(factory_module)
    built: list[tuple[torch.nn.Module, torch.optim.Optimizer]] = []
    original_build = module.build

    def recording_build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        pair = original_build()
        built.append(pair)
        return pair

    monkeypatch.setattr(module, "build", recording_build)
    _json(capsys, _fit_argv(factory_module, "--high", "512", "--no-prior", "--json"))
    model, optimizer = built[-1]
    fresh, _ = original_build()  # same seed: the weights before any probe step
    for a, b in zip(model.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(a, b)
        assert a.grad is None
    assert optimizer.state_dict()["state"] == {}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--device", "cpu"], "--budget"),
        (["--device", "tpu", "--budget", "1GiB"], "unknown device"),
        (["--device", "cpu", "--budget", "lots"], "not a size"),
        (["--device", "cpu", "--budget", "1GiB", "--margin", "150%"], "fraction"),
    ],
)
def test_bad_options_are_errors(
    factory_module: str, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code = main(["fit", f"{factory_module}:factory", *argv])
    captured = capsys.readouterr()
    assert code == 1
    assert "Error:" in captured.err and message in captured.err
    assert "Traceback" not in captured.err


def test_jax_factory_is_refused(factory_module: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["fit", f"{factory_module}:jax_factory", "--device", "cpu", "--budget", "1GiB"])
    captured = capsys.readouterr()
    assert code == 1 and "PyTorch" in captured.err


def test_workload_without_factory_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workload = tmp_path / "nofactory.yaml"
    workload.write_text(
        "name: nofactory\nfamily: custom\nterms: {weights: 1000}\n"
        "knobs:\n  batch_size: {min: 1, max: 8}\n"
    )
    code = main(["fit", str(workload), "--device", "cpu", "--budget", "1GiB"])
    captured = capsys.readouterr()
    assert code == 1 and "names no factory" in captured.err


def test_cuda_without_a_gpu_is_unavailable(
    factory_module: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    code = main(["fit", f"{factory_module}:factory", "--device", "cuda:0", "--no-prior"])
    captured = capsys.readouterr()
    assert code == 1 and "CUDA" in captured.err
