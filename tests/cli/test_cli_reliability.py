"""The CLI's crash classes of issue 21: output with stdout closed, stdin closed, user code
that raises a BaseException or closes sys.stdout, lone surrogates, numbers past Python's
integer-string limit, inputs over their size cap. Each ends in Error/Hint, never a traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from _cli_run import run, user_error

ROOT = Path(__file__).resolve().parents[2]
ACT = ROOT / "src" / "memfit" / "workloads" / "act_dual_camera.yaml"


def _child(args: list[str], close: int) -> subprocess.CompletedProcess[str]:
    """``memfit ARGS`` in a new process whose descriptor ``close`` (0 or 1) is closed."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    redirect = ">&-" if close == 1 else "<&-"
    return subprocess.run(
        ["sh", "-c", f'exec "$0" -m memfit.cli.main "$@" {redirect}', sys.executable, *args],
        stdin=subprocess.DEVNULL if close == 1 else None,
        stdout=subprocess.PIPE if close == 0 else None,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_json_output_with_stdout_closed_is_an_error_not_a_traceback() -> None:
    done = _child(["examples", "--json"], close=1)
    assert done.returncode == 1
    assert "standard output is closed" in done.stderr and "Traceback" not in done.stderr


def test_reading_stdin_when_it_is_closed_is_a_user_error() -> None:
    done = _child(["env", "--check", "-"], close=0)
    assert done.returncode == 1
    assert "standard input" in done.stderr and "Traceback" not in done.stderr


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield f"usermod_{uuid.uuid4().hex[:8]}"


def test_a_factory_raising_a_base_exception_is_a_user_error(
    user_module: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / f"{user_module}.py").write_text(
        "class Stop(BaseException):\n    pass\n\ndef factory():\n    raise Stop('no')\n"
    )
    code, _, err = run(capsys, "estimate", f"{user_module}:factory")
    user_error(code, err, "Stop")


def test_a_factory_that_closes_stdout_leaves_memfit_its_error_message(
    user_module: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / f"{user_module}.py").write_text(
        "import sys\n\ndef factory():\n    sys.stdout.close()\n    raise ValueError('broken')\n"
    )
    code, _, err = run(capsys, "estimate", f"{user_module}:factory")
    assert code == 1 and "Error:" in err and "broken" in err, err
    assert not sys.stderr.closed


def test_a_lone_surrogate_in_a_name_is_a_user_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "w.yaml"
    text = ACT.read_text(encoding="utf-8").replace("name: act_dual_camera", 'name: "a\\ud800b"')
    path.write_text(text, encoding="utf-8")
    code, _, err = run(capsys, "plan", str(path), "--gpu", "RTX 4060 Ti 8GB")
    user_error(code, err, "surrogate")


def test_an_integer_past_the_string_limit_is_a_user_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "w.yaml"
    huge = "9" * 5000
    text = ACT.read_text(encoding="utf-8").replace("{params: 52000000}", f"{{params: {huge}}}")
    path.write_text(text, encoding="utf-8")
    code, _, err = run(capsys, "plan", str(path), "--gpu", "RTX 4060 Ti 8GB")
    user_error(code, err, "5000 digits")


def test_inputs_over_their_cap_are_refused_before_they_are_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    big = tmp_path / "big.yaml"
    with big.open("w") as f:
        f.write("family: ppo\n")
        f.write("# " + "x" * 2**20 + "\n")
    code, _, err = run(capsys, "plan", str(big), "--gpu", "A100-80GB")
    user_error(code, err, "more than the 256.00 KiB")
    shell = tmp_path / "env.sh"
    shell.write_text("#" * (2**20 + 1))
    code, _, err = run(capsys, "env", "--check", str(shell))
    user_error(code, err, "more than the 1.00 MiB")


def test_a_closed_stdout_in_json_mode_with_a_user_error_still_reports_on_stderr(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    class Closed:
        closed = True

    monkeypatch.setattr(sys, "stdout", Closed())
    code, _, err = run(capsys, "plan", "no_such_workload", "--gpu", "A100-80GB", "--json")
    assert code == 1 and "Error:" in err and "Traceback" not in err
