"""Runs appended to one Recorder file are split at their start records (issue 46, item 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _cli_run import run, run_json, user_error

from memfit.backends.simulated import SimulatedDevice
from memfit.errors import ConfigError
from memfit.monitor.recorder import Recorder
from memfit.monitor.report import load_run, summarize, summary_rows

MiB = 2**20


def _two_runs(path: Path) -> Path:
    for budget, held, steps in (("200MiB", 150 * MiB, 20), ("12MiB", 5 * MiB, 8)):
        dev = SimulatedDevice("1GiB")
        with Recorder(path, device=dev, log=False, budget=budget) as rec:
            dev.allocate(held)
            for step in range(steps):
                rec.step(step=step)
    return path


def test_the_last_run_is_read_by_default_and_the_count_is_said(tmp_path: Path) -> None:
    path = _two_runs(tmp_path / "run.jsonl")
    last = load_run(path)
    assert (last.index, last.count) == (2, 2)
    summary = summarize(last)
    assert summary["budget_bytes"] == 12 * MiB
    assert summary["metrics"]["allocated_bytes"]["peak"] == 5 * MiB
    assert summary["last_step"] == 7
    rows = dict(summary_rows(summary))
    assert rows["run"].startswith("2 of 2") and "--run N" in rows["run"]
    first = load_run(path, run=1)
    assert summarize(first)["budget_bytes"] == 200 * MiB
    assert summarize(first)["metrics"]["allocated_bytes"]["peak"] == 150 * MiB
    with pytest.raises(ConfigError, match="holds 2 run"):
        load_run(path, run=3)


def test_memfit_report_run_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(_two_runs(tmp_path / "run.jsonl"))
    data = run_json(capsys, "report", path, "--json")
    assert (data["run"], data["runs"], data["budget_bytes"]) == (2, 2, 12 * MiB)
    data = run_json(capsys, "report", path, "--run", "1", "--json")
    assert (data["run"], data["budget_bytes"], data["last_step"]) == (1, 200 * MiB, 19)
    code, out, _err = run(capsys, "report", path)
    assert code == 0 and "2 of 2" in out
    code, _out, err = run(capsys, "report", path, "--run", "5")
    user_error(code, err, "--run", "2 run(s)")
