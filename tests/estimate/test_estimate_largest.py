"""``memfit estimate`` gives the number asked for: the largest batch that fits the card
(``--gpu NAME``, a size, or ``cpu``), and takes a factory by its file's path (issue 46,
items 3 and 10)."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

from memfit.cli.estimate import _bisect, largest_batch
from memfit.cli.main import main
from memfit.estimate.bridge import load_factory

SOURCE = textwrap.dedent(
    """
    import torch
    from memfit.estimate import TorchStep

    def _build():
        nn = torch.nn
        model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 4))
        return model, torch.optim.Adam(model.parameters())

    def _step(model, opt, batch):
        opt.zero_grad(set_to_none=True)
        model(batch).square().mean().backward()
        opt.step()

    def factory():
        return TorchStep(_build, _step, lambda b: torch.randn(b, 64))
    """
)


@pytest.fixture
def est_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    folder = tmp_path / "est"
    folder.mkdir()
    (folder / "tinypol46.py").write_text(SOURCE)
    monkeypatch.chdir(tmp_path)
    return "est/tinypol46.py:factory"


def test_a_factory_is_named_by_its_file_path(est_file: str) -> None:
    factory = load_factory(est_file)
    assert type(factory()).__name__ == "TorchStep"
    assert load_factory(est_file) is factory  # loaded once


def test_a_missing_file_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    from memfit.errors import ConfigError

    with pytest.raises(ConfigError, match="no such Python file"):
        load_factory("est/nothing.py:factory")


def test_bisect_finds_the_largest_value_that_holds() -> None:
    assert _bisect(lambda v: v <= 1000, 1) == 1000
    assert _bisect(lambda v: v <= 1, 1) == 1
    assert _bisect(lambda v: False, 1) is None


def test_jax_line_answers_from_the_pool() -> None:
    data = {"framework": "jax", "fit": {"intercept": 2**20, "slope": 2**10}}
    got = largest_batch(None, data, ("card", 8 * 2**30, "gpu"))
    assert got is not None and got["batch_size"] is not None
    usable = int(got["limit_bytes"] * 0.95)
    assert 2**20 + 2**10 * got["batch_size"] <= usable < 2**20 + 2**10 * (got["batch_size"] + 1)


def test_estimate_prints_the_largest_batch_that_fits(
    est_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["estimate", est_file, "--batch", "32,64", "--gpu", "RTX 3070 Laptop"])
    out, err = capsys.readouterr()
    assert code == 0, err
    found = re.search(r"largest batch_size that fits on (.+ 3070 Laptop GPU): ([\d,]+) ", out)
    assert found is not None, out
    assert int(found.group(2).replace(",", "")) > 64


def test_estimate_accepts_gpu_cpu(est_file: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["estimate", est_file, "--batch", "32,64", "--gpu", "cpu", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    largest = json.loads(out)["largest_fitting"]
    assert largest["device"].startswith("CPU") and largest["batch_size"] > 64
    assert largest["peak_bytes"] <= largest["limit_bytes"]
