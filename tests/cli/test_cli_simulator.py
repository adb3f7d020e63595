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
        ("num_envs=x:5GB", "--reading num_envs"),
        ("envs=8:5GB", "unknown reading setting"),
        ("num_envs=16,num_envs=32:5GB", "num_envs twice"),
        ("num_envs=8,camera=2x8x8x8:5GB", "is not [COUNTx]HEIGHTxWIDTH"),
        ("num_envs=8,standard=2x8x8:5GB", "is not HEIGHTxWIDTH"),
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


def test_isaac_lab_3_figures_with_their_basis(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 47: the figures of a physics backend and renderer, each with its basis."""
    monkeypatch.setenv("MEMFIT_CACHE_DIR", str(tmp_path))
    args = ["simulator", "--gpu", "4090", "--physics", "newton", "--renderer", "newton_warp"]
    data = run_json(capsys, *args, "--json")
    assert (data["physics"], data["renderer"]) == ("newton", "newton_warp")
    basis = data["published"]["basis"]
    assert basis["simulator_envs"]["kind"] == "fitted"
    assert basis["renderer_cameras"]["kind"] == "assumed"
    assert "memfit simulator" in basis["renderer_cameras"]["measure"]
    code, out, _ = run(capsys, *args)
    assert code == 0 and "basis: renderer_cameras" in out and "assumed" in out
    # readings taken by hand are stored for that backend and renderer, and shown with them
    readings = ["num_envs=256:1GiB", "num_envs=4352:2GiB"]
    stored = run_json(capsys, *args, *[x for r in readings for x in ("--reading", r)], "--json")
    assert (stored["physics"], stored["renderer"]) == ("newton", "newton_warp")
    assert run_json(capsys, *args, "--json")["measured"]["per_env_bytes"] == 2**30 // 4096
    assert run_json(capsys, "simulator", "--gpu", "4090", "--json")["measured"] is None


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--physics", "physx", "--renderer", "newton_warp"], "needs Newton physics"),
        (["--physics", "bullet"], "physx, newton"),
        (["--renderer", "vulkan"], "rtx, newton_warp, ovrtx, none"),
    ],
)
def test_a_bad_backend_is_a_user_error(
    capsys: pytest.CaptureFixture[str], extra: list[str], words: str
) -> None:
    code, _, err = run(capsys, "simulator", "--gpu", "4090", *extra)
    user_error(code, err, words)


#: Every number a reading holds, and where it goes in the text.
READING_FIELDS = {
    "num_envs": "num_envs={}:5GB",
    "camera count": "num_envs=16,camera={}x80x80:5GB",
    "camera height": "num_envs=16,camera={}x80:5GB",
    "camera width": "num_envs=16,camera=80x{}:5GB",
    "standard height": "num_envs=16,standard={}x80:5GB",
    "standard width": "num_envs=16,standard=80x{}:5GB",
}

#: Numbers that cannot be real, or are not numbers written in 0-9 (issue 45: each of these
#: was a raw pydantic error, "Exceeds the limit (4300 digits)" or "invalid literal").
UNREAL_NUMBERS = ["0", "-1", "9" * 5000, "9" * 40, str(2**63), "\u00b2", "\u0663", "1.5", "", "x"]


@pytest.mark.parametrize("number", UNREAL_NUMBERS, ids=lambda n: repr(n[:12]))
@pytest.mark.parametrize("field", sorted(READING_FIELDS))
def test_every_number_of_a_reading_is_checked(
    capsys: pytest.CaptureFixture[str], field: str, number: str
) -> None:
    reading = READING_FIELDS[field].format(number)
    others = ["--reading", "num_envs=256:6.3GB", "--reading", "num_envs=64:5.9GB"]
    code, _, err = run(
        capsys, "simulator", "--gpu", "4090", "--reading", reading, *others, "--no-store"
    )
    user_error(code, err, "--reading")
    assert "pydantic" not in err and "validation error" not in err, err
    assert len(err) < 600, err


@pytest.mark.parametrize(
    ("reading", "where"),
    [
        ("num_envs=16,camera=0x80:5GB", "--reading camera height"),
        ("num_envs=16,standard=0x0:5GB", "--reading standard height"),
        ("num_envs=\u00b2:5GB", "--reading num_envs"),
        ("num_envs=99999999999999999999999:5GB", "--reading num_envs"),
        ("num_envs=4294967296:5GB", "--reading num_envs"),
        ("num_envs=16,camera=2000x80x80:5GB", "--reading camera count"),
        ("num_envs=16,camera=80x100000:5GB", "--reading camera width"),
    ],
)
def test_the_issue_readings_name_the_number(reading: str, where: str) -> None:
    from memfit.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        parse_reading(reading)
    assert info.value.key_path == where, str(info.value)
