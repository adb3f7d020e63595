"""Bad inputs that were accepted with exit 0 (issue 21): each is now refused with Error/Hint."""

from __future__ import annotations

from pathlib import Path

import pytest
from _cli_run import run, user_error

from memfit.core.workload import parse_workload
from memfit.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
ACT = (ROOT / "src" / "memfit" / "workloads" / "act_dual_camera.yaml").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("text", "where"),
    [
        (ACT + "devices: {count: 100000000000000000000, strategy: ddp}\n", "devices.count"),
        (ACT.replace("policy: {params: 52000000}", "policy: {layers: []}"), "layers"),
        (ACT.replace("objective: num_envs", 'objective: ""'), "objective"),
        (ACT.replace("objective: num_envs", 'objective: "  "'), "objective"),
        # issue 45: cameras of height or width 0 planned as free ("fits")
        (ACT.replace("height: 512, width: 512", "height: 0, width: 512"), "cameras.height"),
        (ACT.replace("height: 512, width: 512", "height: 512, width: -2"), "cameras.width"),
    ],
)
def test_workload_values_that_mean_nothing_are_refused(text: str, where: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_workload(text)
    assert where in (info.value.key_path or ""), info.value


def test_an_option_given_twice_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(
        capsys, "plan", "act_dual_camera", "--gpu", "RTX 4060 Ti 8GB", "--gpu", "A100"
    )
    user_error(code, err, "--gpu is given 2 times")
    code, _, err = run(capsys, "plan", "act_dual_camera", "--gpu=RTX 4060 Ti 8GB", "--gpu", "A100")
    user_error(code, err, "--gpu")


def test_an_unknown_measure_mode_is_refused_for_any_workload(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run(
        capsys, "plan", "act_dual_camera", "--gpu", "RTX 4060 Ti 8GB", "--measure", "x"
    )
    user_error(code, err, "measure must be one of")


def test_write_to_a_name_ending_with_a_slash_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = run(
        capsys, "plan", "act_dual_camera", "--gpu", "RTX 4060 Ti 8GB", "--write", "newdir/"
    )
    user_error(code, err, "names a folder")
    assert not (tmp_path / "newdir").exists()


@pytest.mark.parametrize("record", ['{"type": "event"}', '{"type": "event", "kind": "oom"}'])
def test_an_event_without_its_fields_is_refused_by_report(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, record: str
) -> None:
    log = tmp_path / "run.jsonl"
    log.write_text(
        '{"type": "start", "source": "simulated", "every": 1}\n'
        '{"type": "sample", "mode": "step", "step": 0, "time": 1.0, "allocated_bytes": 1}\n'
        + record
        + "\n"
    )
    code, _, err = run(capsys, "report", str(log))
    user_error(code, err)
