"""``memfit gpus``, ``memfit devices``, ``memfit env``: exit codes and ``--json`` purity."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from memfit.allocator.settings_check import JAX_VARIABLES, TORCH_VARIABLES
from memfit.backends.base import DeviceSnapshot, ProcessSnapshot, SystemSnapshot
from memfit.cli import devices as devices_cli
from memfit.cli.main import main

MiB = 2**20


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _json(out: str) -> Any:
    return json.loads(out)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for var in (*TORCH_VARIABLES, *JAX_VARIABLES):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_gpus_lists_catalog_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "gpus", "--json")
    assert code == 0
    data = _json(out)
    assert len(data["gpus"]) >= 30
    assert {"name", "total_bytes", "arch", "source"} <= set(data["gpus"][0])


def test_gpus_human_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "gpus")
    assert code == 0
    assert "RTX 4090" in out and "24564" in out


@pytest.mark.parametrize(("name", "total"), [("4090", 24564 * MiB), ("12GiB", 12 * 2**30)])
def test_gpus_one(capsys: pytest.CaptureFixture[str], name: str, total: int) -> None:
    code, out, _ = _run(capsys, "gpus", name, "--json")
    assert code == 0
    assert _json(out)["total_bytes"] == total
    code, out, _ = _run(capsys, "gpus", name)
    assert code == 0 and "MiB" in out


def test_gpus_unknown_exits_1_with_three_nearest(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "gpus", "rtx 9090")
    assert code == 1
    assert out == ""
    assert "Error:" in err and "Hint:" in err
    assert err.count("RTX") >= 3
    assert "Traceback" not in err


def test_gpus_unknown_json_is_an_error_document(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "gpus", "rtx 9090", "--json")
    assert code == 1
    data = _json(out)
    assert data["error"] == "ConfigError" and "nearest" in data["hint"]
    assert "Error:" in err


def test_devices_without_gpu_is_one_line_exit_0(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = SystemSnapshot(source="none", notes=("no NVIDIA GPU or driver found", "no driver"))
    monkeypatch.setattr(devices_cli, "probe_all", lambda: empty)
    code, out, _ = _run(capsys, "devices")
    assert code == 0
    assert out.strip().startswith("no NVIDIA GPU or driver found")
    assert len(out.strip().splitlines()) <= 3  # one line, wrapped by the terminal width at most
    code, out, _ = _run(capsys, "devices", "--json")
    assert code == 0
    data = _json(out)
    assert data["devices"] == [] and data["notes"][0] == "no NVIDIA GPU or driver found"


def test_devices_on_this_machine_never_fails(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "devices", "--json")
    assert code == 0
    data = _json(out)
    assert data["source"] in ("none", "nvml", "torch")
    assert isinstance(data["devices"], list)


def _snapshot() -> SystemSnapshot:
    procs = (
        ProcessSnapshot(pid=321, name="python", user="ada", used_bytes=900 * MiB, kind="compute"),
        ProcessSnapshot(pid=7, used_bytes=None, kind="graphics", note="PID not visible here"),
    )
    dev = DeviceSnapshot(
        index=0,
        name="NVIDIA H100 80GB HBM3",
        total_bytes=81559 * MiB,
        device_used_bytes=1500 * MiB,
        free_bytes=80059 * MiB,
        driver_reserved_bytes=527 * MiB,
        utilization_percent=12,
        processes=procs,
        notes=("a device note",),
        backend="nvml",
    )
    return SystemSnapshot(
        source="nvml", driver_version="550.54.15", cuda_version="12.4", devices=(dev,)
    )


def test_devices_save_then_from_json(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(devices_cli, "probe_all", _snapshot)
    target = tmp_path / "snap.json"
    code, out, err = _run(capsys, "devices", "--save", str(target))
    assert code == 0
    assert "H100" in out and "81559MiB" in out and "python" in out
    assert "a device note" in err and "saved" in err
    code, out, _ = _run(capsys, "devices", "--from-json", str(target), "--json")
    assert code == 0
    assert SystemSnapshot.from_dict(_json(out)) == SystemSnapshot.load(target)


def test_devices_from_missing_file_exits_1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = _run(capsys, "devices", "--from-json", str(tmp_path / "nope.json"))
    assert code == 1
    assert "Error:" in err and "cannot read snapshot" in err


def test_env_json(capsys: pytest.CaptureFixture[str], clean_env: pytest.MonkeyPatch) -> None:
    code, out, _ = _run(capsys, "env", "--json")
    assert code == 0
    data = _json(out)
    assert data["profile"] == "training"
    assert data["problems"] == [] and data["current"] == {}
    assert "export " in data["script"]
    assert all(s["reason"] for s in data["settings"])


@pytest.mark.parametrize("profile", ["training", "inference", "shared-gpu"])
@pytest.mark.parametrize("shell", ["bash", "fish", "powershell"])
def test_env_profiles_and_shells(
    capsys: pytest.CaptureFixture[str], clean_env: pytest.MonkeyPatch, profile: str, shell: str
) -> None:
    code, out, _ = _run(capsys, "env", "--for", profile, "--shell", shell)
    assert code == 0
    marker = {"bash": "export ", "fish": "set -gx ", "powershell": "$env:"}[shell]
    assert marker in out


def test_env_reports_problems_by_name(
    capsys: pytest.CaptureFixture[str], clean_env: pytest.MonkeyPatch
) -> None:
    clean_env.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:16")
    clean_env.setenv("PYTORCH_ALLOC_CONF", "expandable_segments:True")
    code, out, _ = _run(capsys, "env", "--json")
    assert code == 1  # error-level problems: the JSON is printed, then the exit status says so
    problems = _json(out)["problems"]
    assert {(p["code"], p["variable"], p["option"]) for p in problems} == {
        ("bad-value", "PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb"),
        ("both-names-differ", "PYTORCH_CUDA_ALLOC_CONF", None),
    }
    code, out, err = _run(capsys, "env")
    assert code == 1 and "max_split_size_mb" in out and "both-names-differ" in out
    assert "Error:" in err and "Hint:" in err
    code, _, _ = _run(capsys, "env", "--strict")
    assert code == 1


def test_env_check_file(
    capsys: pytest.CaptureFixture[str], clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    script = tmp_path / "job.sh"
    script.write_text(
        "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n"
        "export PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128\n"
    )
    code, out, _ = _run(capsys, "env", "--check", str(script), "--json")
    assert code == 1  # the first export is silently lost: an error
    (problem,) = _json(out)["problems"]
    assert problem["code"] == "exported-twice" and problem["severity"] == "error"
    code, _, _ = _run(capsys, "env", "--check", str(script), "--strict")
    assert code == 1
    code, _, err = _run(capsys, "env", "--check", str(tmp_path / "missing.sh"))
    assert code == 1 and "Error:" in err


@pytest.mark.parametrize(
    "args", [("env", "--for", "gaming"), ("env", "--shell", "tcsh"), ("gpus", "zz9000")]
)
def test_user_mistakes_exit_1_without_traceback(
    capsys: pytest.CaptureFixture[str], clean_env: pytest.MonkeyPatch, args: tuple[str, ...]
) -> None:
    code, _, err = _run(capsys, *args)
    assert code == 1
    assert "Error:" in err and "Hint:" in err and "Traceback" not in err


@pytest.mark.parametrize("args", [("gpus", "--bogus"), ("devices", "extra-arg"), ("env", "--for")])
def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], args: tuple[str, ...]) -> None:
    code, _, _ = _run(capsys, *args)
    assert code == 2


def test_bare_memfit_prints_help_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    code = main([])
    out = capsys.readouterr().out
    assert code == 0
    assert "plan" in out and "Usage" in out
