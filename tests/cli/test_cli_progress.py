"""Issue 22: long work shows a status line on stderr; silent with --json or off a terminal."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from _cli_run import run
from _monitor_runs import record_run
from rich.console import Console

from memfit.cli import _common, _progress
from memfit.core.workload import load_workload
from memfit.estimate import brax_measure as bm


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    """stderr as a terminal a person watches (what the status line needs to show)."""
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=120, highlight=False)
    monkeypatch.setattr(_common, "err_console", console)
    return screen


def test_status_shows_only_on_a_terminal(terminal: io.StringIO) -> None:
    with _progress.status("planning x") as say:
        say("measuring y: setting 2 of 4")
    shown = terminal.getvalue()
    assert "planning x" in shown
    terminal.truncate(0)
    terminal.seek(0)
    with _progress.status("planning x", quiet=True) as say:
        say("measuring y")
    assert terminal.getvalue() == ""


def test_status_is_silent_off_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    with _progress.status("planning x") as say:  # capsys: stderr is not a terminal
        say("measuring y")
    assert capsys.readouterr().err == ""


def test_measuring_a_brax_env_reports_its_stages(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    terminal: io.StringIO,
) -> None:
    recorded = load_workload("brax_humanoid_ppo").measurements
    heard: list[str] = []

    def measure_ppo(env: str, **kwargs: object) -> object:  # the 6-minute part, stood in for
        say = kwargs["progress"]
        assert callable(say)
        for stage in (
            "measuring brax:humanoid: compiling the env step",
            "measuring brax:humanoid: compiling Brax's training step, setting 1 of 4",
        ):
            say(stage)
            heard.append(stage)
        return recorded

    monkeypatch.setattr(bm, "missing_packages", lambda: [])
    monkeypatch.setattr(bm, "installed_versions", lambda: {"brax": "x", "jax": "y", "jaxlib": "z"})
    monkeypatch.setattr(bm, "measure_ppo", measure_ppo)
    code, _, _ = run(capsys, "plan", "brax_humanoid_ppo", "--gpu", "T4", "--measure", "fresh")
    assert code == 0 and len(heard) == 2
    assert "setting 1 of 4" in terminal.getvalue()
    terminal.truncate(0)
    terminal.seek(0)
    code, _, _ = run(
        capsys, "plan", "brax_humanoid_ppo", "--gpu", "T4", "--measure", "fresh", "--json"
    )
    assert code == 0 and terminal.getvalue() == ""  # --json: nothing on stderr's screen


def test_jax_sweep_reports_each_batch_size() -> None:
    jnp = pytest.importorskip("jax.numpy", reason="jax is an optional extra (jax)")
    from memfit.estimate.xla.step import estimate_jax_sweep

    heard: list[str] = []
    estimate_jax_sweep(
        lambda x: (x * 2).sum(), lambda b: (jnp.ones((b, 8)),), [4, 8], progress=heard.append
    )
    assert heard == ["compiling batch_size=4 (1 of 2)", "compiling batch_size=8 (2 of 2)"]


def test_report_reads_with_a_status_and_takes_a_title(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, terminal: io.StringIO
) -> None:
    log = record_run(tmp_path / "run.jsonl", 5)
    page = tmp_path / "report.html"
    code, out, _ = run(capsys, "report", str(log), "-o", str(page), "--title", "ant, 4096 envs")
    assert code == 0 and "ant, 4096 envs" in out
    assert "<title>memfit report: ant, 4096 envs</title>" in page.read_text()
    assert "reading" in terminal.getvalue()
