"""``memfit plan`` on the issue-25 workloads and mistakes in the new workload fields."""

from __future__ import annotations

from pathlib import Path

import pytest
from _cli_run import run, run_json, user_error


def test_mujoco_1431_through_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "plan", "brax_mjx_sac@as_reported", "--gpu", "RTX 4090")
    user_error(code, err)
    assert "replay_buffer (49.62 GiB)" in err and "max_replay_size=30000000" in err
    plan = run_json(capsys, "plan", "brax_mjx_sac", "--gpu", "RTX 4090", "--json")
    assert plan["knobs"]["max_replay_size"] == 13_000_000
    assert plan["breakdown"]["replay_buffer"] == 13_000_000 * 1776


def test_sac_mistakes_are_user_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "sac.yaml"
    path.write_text(
        "family: sac\nobservations: {vector: 8}\naction_dim: 2\n"
        "networks:\n  actor: {layers: [64, 4]}\n"
        "  critic: {trunk: nowhere, action_input: true, layers: [64, 1], copies: 2}\n"
        "knobs:\n  buffer_size: {min: 1000, max: 10000, step: 1000}\n"
        "settings: {batch_size: 256}\n",
        encoding="utf-8",
    )
    code, _, err = run(capsys, "plan", str(path), "--gpu", "RTX 4060 Ti 8GB")
    user_error(code, err)
    assert "trunk names 'nowhere'" in err
    path.write_text(path.read_text().replace("trunk: nowhere, ", ""), encoding="utf-8")
    plan = run_json(capsys, "plan", str(path), "--gpu", "RTX 4060 Ti 8GB", "--json")
    assert plan["knobs"]["buffer_size"] == 10000
