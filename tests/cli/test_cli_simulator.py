"""``memfit simulator``: the figures a plan uses on a card, and fitting your own (issue 33)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _cli_run import run, run_json, user_error

from memfit.cli.simulator import parse_reading
from memfit.core.simulator_figures import CARD_FIGURES

CARD = "NVIDIA GeForce RTX 4090"


def test_it_shows_the_published_figures_of_a_card(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMFIT_CACHE_DIR", str(tmp_path))
    data = run_json(capsys, "simulator", "--gpu", "4090", "--json")
    assert data["gpu"] == CARD and data["measured"] is None
    assert data["published"]["base_bytes"] == CARD_FIGURES[CARD].base_bytes
    assert data["published"]["notes"] == []
    unknown = run_json(capsys, "simulator", "--gpu", "RTX 4060 Ti 8GB", "--json")
    assert any("no reading of Isaac Sim" in n for n in unknown["published"]["notes"])
    code, out, err = run(capsys, "simulator", "--gpu", "RTX 4060 Ti 8GB")
    assert code == 0 and "renderer base" in out and "note: no reading" in err


def test_readings_fit_store_and_show(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMFIT_CACHE_DIR", str(tmp_path))
    args = ["simulator", "--gpu", "RTX 4090", "--sim-version", "2.3"]
    readings = ["num_envs=16:3GiB", "num_envs=1040:4GiB"]
    data = run_json(capsys, *args, *[x for r in readings for x in ("--reading", r)], "--json")
    assert data["per_env_bytes"] == 2**30 // 1024 and data["pixel_bytes"] is None
    assert Path(data["file"]).is_file() and data["version"] == "2.3"
    shown = run_json(capsys, "simulator", "--gpu", "4090", "--json")
    assert shown["measured"]["per_env_bytes"] == 2**30 // 1024
    code, out, _ = run(capsys, *args, "--reading", readings[0], "--reading", readings[1],
                       "--no-store")  # fmt: skip
    assert code == 0 and "not stored" in out


def test_parse_reading() -> None:
    settings, used = parse_reading("num_envs=64,camera=2x128x96,standard=480x640:7.5GB")
    assert used == 7_500_000_000
    assert settings == {
        "num_envs": 64,
        "cameras": [
            {"kind": "tiled", "height": 128, "width": 96, "count": 2},
            {"kind": "standard", "height": 480, "width": 640, "count": 1},
        ],
    }


@pytest.mark.parametrize(
    ("reading", "words"),
    [
        ("num_envs=64", "no ':USED'"),
        ("num_envs=x:5GB", "unknown reading setting"),
        ("camera=8x8:5GB", "has no num_envs"),
        ("num_envs=8,camera=big:5GB", "is not [COUNTx]HEIGHTxWIDTH"),
        ("num_envs=8:lots", "lots"),
    ],
)
def test_a_bad_reading_is_a_user_error(
    capsys: pytest.CaptureFixture[str], reading: str, words: str
) -> None:
    code, _, err = run(capsys, "simulator", "--gpu", "4090", "--reading", reading, "--no-store")
    user_error(code, err, words)


def test_one_reading_cannot_be_fitted(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(
        capsys, "simulator", "--gpu", "4090", "--reading", "num_envs=8:5GB", "--no-store"
    )
    user_error(code, err, "two or more numbers of environments")
