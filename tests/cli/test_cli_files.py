"""The CLI never harms a user's file and never hangs on one (issue 15, "Files and hangs").

* an existing file is replaced only with ``--force``, an input file never, not even with
  ``--force`` (also under another name: a symbolic link, ``./x``);
* a file is written whole or not at all (temporary file in the same folder, then a rename);
* a folder, a named pipe or a device is refused before it is opened, for reading and for
  writing; ``-`` reads standard input where a command takes a file to read.
"""

from __future__ import annotations

import io
import json
import os
import signal
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest
from _cli_run import run, user_error
from _monitor_runs import record_run

from memfit.backends.simulated import SimulatedDevice
from memfit.cli import _files
from memfit.cli.main import main
from memfit.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
DQN = ROOT / "src" / "memfit" / "workloads" / "dqn_fire_raster.yaml"

needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes need POSIX")


@pytest.fixture
def no_hang() -> Iterator[None]:
    """Fail the test after 20 s instead of hanging the suite (a pipe with no writer)."""
    if not hasattr(signal, "SIGALRM"):
        pytest.skip("needs SIGALRM")

    def stop(_signum: int, _frame: FrameType | None) -> None:
        raise TimeoutError("memfit hung on the file")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(20)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the bundled DQN workload, in the current (temporary) directory."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "job.yaml"
    path.write_bytes(DQN.read_bytes())
    return path


def run_log(path: Path) -> Path:
    retry = ("retry", "TrainGuard", "retrying")
    return record_run(path, 12, budget="64MiB", events={5: [retry]})


def simulated_snapshot(path: Path, size: str) -> Path:
    path.write_text(json.dumps(SimulatedDevice(size).snapshot().to_dict()))
    return path


def stdin_with(monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


def temp_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


# --- never overwrite without --force; never an input ------------------------------------------


def test_plan_write_refuses_an_existing_file_without_force(
    job: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = job.parent / "fitted.yaml"
    out.write_text("mine\n")
    code, _, err = run(capsys, "plan", str(job), "--gpu", "3.7GB", "--write", str(out))
    user_error(code, err, "the file exists", "--force")
    assert out.read_text() == "mine\n"
    code, _, err = run(capsys, "plan", str(job), "--gpu", "3.7GB", "--write", str(out), "--force")
    assert code == 0, err
    assert "buffer_size" in out.read_text() and temp_files(job.parent) == []


@pytest.mark.parametrize("spelling", ["same", "dot", "link"])
def test_plan_never_writes_over_its_own_workload(
    job: Path, capsys: pytest.CaptureFixture[str], spelling: str
) -> None:
    before = job.read_bytes()
    target = {"same": str(job), "dot": f"./{job.name}", "link": str(job.parent / "link.yaml")}
    if spelling == "link":
        os.symlink(job, job.parent / "link.yaml")
    argv = ["plan", str(job), "--gpu", "3.7GB", "--write", target[spelling], "--force"]
    code, out, err = run(capsys, *argv)
    user_error(code, err, "the file this command reads", "even with --force")
    assert job.read_bytes() == before
    assert out == ""  # refused before planning


def test_plan_never_writes_over_a_bundled_workload(capsys: pytest.CaptureFixture[str]) -> None:
    before = DQN.read_bytes()
    code, _, err = run(
        capsys, "plan", "dqn_fire_raster", "--gpu", "3.7GB", "--write", str(DQN), "--force"
    )
    user_error(code, err, "the file this command reads")
    assert DQN.read_bytes() == before


def test_devices_save_needs_force_and_never_replaces_its_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = simulated_snapshot(tmp_path / "in.json", "8GiB")
    snap = tmp_path / "snap.json"
    assert main(["devices", "--from-json", str(source), "--save", str(snap)]) == 0
    capsys.readouterr()
    assert json.loads(snap.read_text())["devices"][0]["total_bytes"] == 8 * 2**30
    other = simulated_snapshot(tmp_path / "other.json", "4GiB")
    code, _, err = run(capsys, "devices", "--from-json", str(other), "--save", str(snap))
    user_error(code, err, "the file exists")
    assert json.loads(snap.read_text())["devices"][0]["total_bytes"] == 8 * 2**30
    argv = ["devices", "--from-json", str(other), "--save", str(snap), "--force"]
    code, _, err = run(capsys, *argv)
    assert code == 0, err
    assert json.loads(snap.read_text())["devices"][0]["total_bytes"] == 4 * 2**30
    code, _, err = run(capsys, "devices", "--from-json", str(snap), "--save", str(snap), "--force")
    user_error(code, err, "the file this command reads")
    assert json.loads(snap.read_text())["devices"][0]["total_bytes"] == 4 * 2**30


def test_report_output_needs_force_and_never_replaces_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = run_log(tmp_path / "run.jsonl")
    png = tmp_path / "run.png"
    png.write_bytes(b"my picture")
    code, _, err = run(capsys, "report", str(log), "-o", str(png))
    user_error(code, err, "the file exists")
    assert png.read_bytes() == b"my picture"
    code, _, err = run(capsys, "report", str(log), "-o", str(png), "--force")
    assert code == 0, err
    assert png.read_bytes().startswith(b"\x89PNG")
    # a run log named .html, given as its own output: refused even with --force
    page = tmp_path / "run.html"
    page.write_bytes(log.read_bytes())
    code, _, err = run(capsys, "report", str(page), "-o", str(page), "--force")
    user_error(code, err, "the file this command reads")
    assert page.read_bytes() == log.read_bytes()


# --- atomic writes ----------------------------------------------------------------------------


def test_a_failed_write_leaves_the_old_file_whole_and_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "report.html"
    target.write_text("the old report\n")

    def disk_full(_fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_files.os, "fsync", disk_full)
    with pytest.raises(ConfigError, match="No space left on device") as info:
        _files.Output(target, "the report", "--output", force=True).write("x" * 100_000)
    assert info.value.key_path == str(target)
    assert target.read_text() == "the old report\n"
    assert temp_files(tmp_path) == []


def test_writes_go_through_a_temporary_file_and_keep_the_mode(tmp_path: Path) -> None:
    target = tmp_path / "fitted.yaml"
    target.write_text("old\n")
    target.chmod(0o640)
    seen: list[str] = []
    real_replace = os.replace

    def watching_replace(src: str | Path, dst: str | Path) -> None:
        seen.append(Path(src).name)
        assert Path(src).parent == tmp_path  # same folder: the rename is atomic
        assert Path(src).read_text() == "new\n"  # complete before it takes the name
        real_replace(src, dst)

    _files.os.replace = watching_replace  # type: ignore[assignment]
    try:
        _files.Output(target, "x", "--write", force=True).write("new\n")
    finally:
        _files.os.replace = real_replace
    assert target.read_text() == "new\n"
    assert seen and seen[0].startswith(".fitted.yaml.") and seen[0].endswith(".tmp")
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert temp_files(tmp_path) == []


def test_a_file_that_appears_meanwhile_is_not_replaced_without_force(tmp_path: Path) -> None:
    tmp = tmp_path / ".new.tmp"
    tmp.write_text("new\n")
    target = tmp_path / "out.yaml"
    target.write_text("someone else's\n")  # created after the command's first check
    with pytest.raises(ConfigError, match="the file exists"):
        _files._link_new(tmp, target, action="write x (--write)", option="--write")
    assert target.read_text() == "someone else's\n"


def test_write_into_a_missing_folder_says_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        _files.Output(tmp_path / "no" / "x.png", "the report", "-o").write(b"x")


# --- never hang: pipes, devices, folders ------------------------------------------------------


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    if not hasattr(os, "mkfifo"):
        pytest.skip("named pipes need POSIX")
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


@needs_fifo
@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "{f}", "--gpu", "4GB"],
        ["check", "{f}"],
        ["devices", "--from-json", "{f}"],
        ["env", "--check", "{f}"],
        ["report", "{f}"],
        ["fit", "{f}", "--device", "cpu", "--budget", "1GiB"],
    ],
)
def test_reading_a_named_pipe_is_refused_not_waited_on(
    fifo: Path, no_hang: None, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    code, _, err = run(capsys, *(a.replace("{f}", str(fifo)) for a in argv))
    user_error(code, err, "named pipe (FIFO)", "not a file")


@needs_fifo
@pytest.mark.parametrize(
    "argv",
    [
        ["plan", str(DQN), "--gpu", "3.7GB", "--write", "{f}", "--force"],
        ["report", "{log}", "-o", "{f}.png"],
        ["devices", "--from-json", "{snap}", "--save", "{f}", "--force"],
        ["watch", "--log", "{f}", "--once"],
    ],
)
def test_writing_to_a_named_pipe_is_refused_not_waited_on(
    fifo: Path, no_hang: None, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    if "{f}.png" in argv:
        os.rename(fifo, f"{fifo}.png")
    log = run_log(fifo.parent / "run.jsonl")
    snap = simulated_snapshot(fifo.parent / "snap.json", "8GiB")
    args = [
        a.replace("{f}", str(fifo)).replace("{log}", str(log)).replace("{snap}", str(snap))
        for a in argv
    ]
    code, _, err = run(capsys, *args)
    user_error(code, err, "named pipe (FIFO)")


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_a_device_that_never_ends_is_refused(
    no_hang: None, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in (["plan", "/dev/zero", "--gpu", "4GB"], ["report", "/dev/zero"]):
        code, _, err = run(capsys, *argv)
        user_error(code, err, "character device")


def test_a_folder_is_refused_for_reading_and_writing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "d.png"
    folder.mkdir()
    code, _, err = run(capsys, "report", str(tmp_path))
    user_error(code, err, "it is a folder")
    log = run_log(tmp_path / "run.jsonl")
    code, _, err = run(capsys, "report", str(log), "-o", str(folder), "--force")
    user_error(code, err, "it is a folder")
    code, _, err = run(capsys, "env", "--check", str(tmp_path))
    user_error(code, err, "it is a folder")


# --- "-" is standard input --------------------------------------------------------------------


def test_plan_and_check_read_the_workload_from_stdin(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stdin_with(monkeypatch, DQN.read_bytes())
    code, out, err = run(capsys, "plan", "-", "--gpu", "3.7GB", "--json")
    assert code == 0, err
    assert json.loads(out)["knobs"]["buffer_size"] > 0
    stdin_with(monkeypatch, DQN.read_bytes())
    code, out, err = run(capsys, "check", "-", "--json")
    assert code == 0, err
    assert json.loads(out)["ok"] is True


def test_report_env_and_devices_read_stdin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stdin_with(monkeypatch, run_log(tmp_path / "run.jsonl").read_bytes())
    code, out, err = run(capsys, "report", "-", "--json")
    assert code == 0, err
    assert json.loads(out)["last_step"] == 11
    stdin_with(monkeypatch, b"export PYTORCH_ALLOC_CONF=expandable_segments:True\n")
    code, out, err = run(capsys, "env", "--check", "-", "--json")
    assert code == 0, err
    assert json.loads(out)["checked"] == "file <stdin>"
    snapshot = simulated_snapshot(tmp_path / "snap.json", "8GiB").read_bytes()
    stdin_with(monkeypatch, snapshot)
    code, out, err = run(capsys, "devices", "--from-json", "-", "--json")
    assert code == 0, err
    assert json.loads(out) == json.loads(snapshot)


def test_a_bad_workload_on_stdin_names_stdin(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stdin_with(monkeypatch, b"name: x\nfamily: custom\nknobs: [\n")
    code, _, err = run(capsys, "plan", "-", "--gpu", "4GB")
    user_error(code, err, "<stdin>:")
