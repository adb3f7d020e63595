"""A real out-of-memory error under ``memfit.simulate_gpu``: the Recorder dumps a snapshot,
names the command, and ``memfit explain`` reads the dump as it is (issue 20)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the simulated GPU runs torch code")

import memfit  # noqa: E402
from memfit.cli.main import main  # noqa: E402

MiB = 2**20


def _train(keep: list[object]) -> None:
    for _step in range(40):
        keep.append(torch.zeros(256 * 1024))  # 1 MiB kept per step: a leak


def test_recorder_oom_dump_goes_straight_into_explain(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "run.jsonl"
    keep: list[object] = []
    caplog.set_level(logging.WARNING, logger="memfit")
    with (
        pytest.raises(torch.OutOfMemoryError),
        memfit.simulate_gpu("24MiB"),
        memfit.Recorder(log, log=True) as rec,
    ):
        for step in range(40):
            keep.append(torch.zeros(256 * 1024))
            x = torch.ones(512 * 1024) * 2  # 2 MiB temporaries, freed each step
            del x
            rec.step(step=step)
    snapshot = next(p for p in rec.oom_files if p.suffix == ".pickle")
    assert any(f"memfit explain {snapshot}" in r.getMessage() for r in caplog.records)
    e = memfit.explain(snapshot)
    assert e.oom is not None
    assert e.oom.requested_bytes == 2 * MiB  # the ones() of the step that did not fit
    site = e.group("site")
    assert site is not None and site.rows[0].name.startswith("monitor/test_explain_oom_dump.py:")
    assert "test_recorder_oom_dump_goes_straight_into_explain" in site.rows[0].name
    assert e.oom.allocated_bytes >= 20 * MiB
    assert e.leaks and e.leaks[0].growth_per_step_bytes == MiB
    code = main(["explain", str(snapshot), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["oom"]["requested_bytes"] == 2 * MiB
    del keep


def test_an_oom_outside_the_recorder_context_is_still_dumped(tmp_path: Path) -> None:
    keep: list[object] = []
    with memfit.Recorder(tmp_path / "r.jsonl", log=False) as rec:
        with pytest.raises(torch.OutOfMemoryError) as err, memfit.simulate_gpu("4MiB"):
            _train(keep)
        rec.on_oom(err.value)
    names = sorted(p.name for p in rec.oom_files)
    assert names == ["r.oom1.samples.jsonl", "r.oom1.snapshot.pickle"]
    e = memfit.explain(tmp_path / "r.oom1.snapshot.pickle")
    assert e.oom is not None and e.oom.requested_bytes == MiB


def test_history_off_writes_no_snapshot(tmp_path: Path) -> None:
    keep: list[object] = []
    with (
        pytest.raises(torch.OutOfMemoryError),
        memfit.simulate_gpu("4MiB", history=0),
        memfit.Recorder(tmp_path / "r.jsonl", log=False) as rec,
    ):
        _train(keep)
    assert [p.name for p in rec.oom_files] == ["r.oom1.samples.jsonl"]
    with (
        pytest.raises(memfit.ConfigError, match="history"),
        memfit.simulate_gpu("4MiB", history=-1),
    ):
        pass
