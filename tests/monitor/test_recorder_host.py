"""A Recorder on a CPU run reads the process's resident memory; "cannot tell" where nothing
is read (issue 46, item 1)."""

from __future__ import annotations

import json
import logging
import mmap
from pathlib import Path

import pytest

import memfit.backends.live as live
from memfit.monitor.recorder import Recorder
from memfit.monitor.report import parse_run, summarize, summary_rows

MiB = 2**20


def test_a_cpu_run_records_resident_memory_and_finds_the_leak(tmp_path: Path) -> None:
    if live.resident_bytes() is None:
        pytest.skip("this platform gives no resident memory (no /proc, no psutil)")
    keep: list[mmap.mmap] = []
    path = tmp_path / "run.jsonl"
    with Recorder(path, log=False) as rec:
        for _ in range(24):
            # a fresh anonymous mapping, every page written: resident at once, never memory
            # the process already held (a freed heap block would not raise the resident size)
            block = mmap.mmap(-1, 4 * MiB)
            block.write(b"\x01" * (4 * MiB))
            keep.append(block)
            rec.step()
    assert rec.source == "host"
    leaks = rec.leaks()
    assert [leak.metric for leak in leaks] == ["resident_bytes"]
    assert 3 * MiB < leaks[0].bytes_per_step < 5 * MiB
    assert rec.leak_verdict() == "leak"
    start = json.loads(path.read_text().splitlines()[0])
    assert start["source"] == "host"
    summary = summarize(parse_run(path.read_bytes()))
    assert "resident_bytes" in summary["metrics"]
    assert summary["growth"]["metric"] == "resident_bytes"
    del keep


def test_a_flat_cpu_run_is_no_leak(tmp_path: Path) -> None:
    if live.resident_bytes() is None:
        pytest.skip("this platform gives no resident memory")
    with Recorder(None, log=False) as rec:
        for _ in range(12):
            rec.step()
    assert rec.leak_verdict() == "no leak"


def test_nothing_read_is_cannot_tell_not_no_leak(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(live, "resident_bytes", lambda: None)
    with caplog.at_level(logging.INFO, logger="memfit"), Recorder(None) as rec:
        for _ in range(12):
            rec.step()
    assert rec.source == "none"
    assert rec.leaks() == []
    assert rec.leak_verdict() == "cannot tell"
    text = caplog.text
    assert "leaks cannot be told" in text
    assert "cannot tell whether memory leaks" in text


def test_a_report_of_a_run_with_no_figures_says_cannot_tell() -> None:
    lines = [json.dumps({"type": "start", "source": "none", "every": 1})]
    lines += [json.dumps({"type": "sample", "mode": "step", "step": i}) for i in range(10)]
    rows = dict(summary_rows(summarize(parse_run("\n".join(lines) + "\n"))))
    assert rows["growth"].startswith("cannot tell")
