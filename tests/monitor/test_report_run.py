"""Loading a recorded run, summarising it, and drawing the PNG and HTML reports."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest

from memfit.backends.simulated import SimulatedDevice
from memfit.errors import ConfigError
from memfit.monitor.recorder import Recorder
from memfit.monitor.report import (
    load_run,
    plot,
    render_html,
    summarize,
    summary_rows,
    write_html,
    write_png,
)
from memfit.monitor.watch import Watcher, append_log
from memfit.runtime.events import MemoryEvent

MiB = 2**20
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _recorded_run(path: Path, *, leak: bool) -> Path:
    dev = SimulatedDevice("1GiB")
    with Recorder(path, device=dev, log=False, budget="512MiB") as rec:
        dev.allocate(100 * MiB)
        for step in range(80):
            if leak:
                dev.allocate(MiB)
            if step == 30:
                rec.on_event(MemoryEvent("split", step, "TrainGuard", "2 micro-batches"))
            if step == 50:
                rec.on_event(MemoryEvent("cleanup", None, "cleanup.every", "emptied the cache"))
            rec.step(step=step)
    return path


def test_summary_of_a_leaking_run(tmp_path: Path) -> None:
    run = load_run(_recorded_run(tmp_path / "run.jsonl", leak=True))
    assert len(run.samples) == 80 and len(run.events) == 2
    assert run.meta["source"] == "simulated"
    summary = summarize(run)
    assert summary["first_step"] == 0 and summary["last_step"] == 79
    allocated = summary["metrics"]["allocated_bytes"]
    assert allocated["peak"] == 180 * MiB
    assert allocated["first"] == 101 * MiB
    assert allocated["change"] == 79 * MiB
    assert summary["budget_bytes"] == 512 * MiB
    assert summary["growth"]["bytes_per_step"] == pytest.approx(MiB)
    # 180 MiB at step 79 + 1 MiB per step reaches 512 MiB at step 411
    assert summary["growth"]["projected_oom_step"] == 411
    assert summary["events"] == {"split": 1, "cleanup": 1}
    rows = dict(summary_rows(summary))
    assert rows["growth (leak?)"].startswith("1.00 MiB/step since step 0")
    assert rows["events"] == "cleanup x1, split x1"
    json.dumps(summary)  # plain data


def test_summary_of_a_flat_run_has_no_growth(tmp_path: Path) -> None:
    summary = summarize(load_run(_recorded_run(tmp_path / "run.jsonl", leak=False)))
    assert summary["growth"] is None
    assert dict(summary_rows(summary))["growth"] == "no steady growth found"


def test_png_report(tmp_path: Path) -> None:
    run = load_run(_recorded_run(tmp_path / "run.jsonl", leak=True))
    out = write_png(run, tmp_path / "out" / "report.png")
    data = out.read_bytes()
    assert data.startswith(PNG_MAGIC)
    assert 5_000 < len(data) < 200_000


def test_figure_marks_budget_and_events(tmp_path: Path) -> None:
    run = load_run(_recorded_run(tmp_path / "run.jsonl", leak=True))
    fig = plot(run)
    ax = fig.axes[0]
    labels = ax.get_legend_handles_labels()[1]
    assert {"allocated", "peak allocated", "budget", "split", "cleanup"} <= set(labels)
    vertical = [line for line in ax.lines if len(set(line.get_xdata())) == 1]
    xs = sorted(float(line.get_xdata()[0]) for line in vertical)
    # the split at step 30; the cleanup had no step and sits at the sample nearest in time
    assert xs[0] == 30.0 and 49.0 <= xs[1] <= 51.0


def test_html_report_is_self_contained(tmp_path: Path) -> None:
    run = load_run(_recorded_run(tmp_path / "run.jsonl", leak=True))
    out = write_html(run, tmp_path / "report.html")
    page = out.read_text()
    match = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert match is not None
    assert base64.b64decode(match.group(1)).startswith(PNG_MAGIC)
    assert not re.search(r'(src|href)="https?://', page)  # nothing fetched from outside
    assert "<td>split</td>" in page and "<td>TrainGuard</td>" in page
    assert "1.00 MiB/step since step 0" in page
    assert "<script" not in page


def test_html_escapes_event_text(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    dev = SimulatedDevice("1GiB")
    with Recorder(path, device=dev, log=False) as rec:
        rec.step()
        rec.on_event(MemoryEvent("retry", 0, "TrainGuard", "<b>x</b> & more"))
    page = render_html(load_run(path))
    assert "&lt;b&gt;x&lt;/b&gt; &amp; more" in page


def test_bad_json_line_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    _recorded_run(path, leak=False)
    lines = path.read_text().splitlines()
    lines[2] = lines[2][:20]  # cut off mid-line
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match="line 3 is not JSON") as info:
        load_run(path)
    assert info.value.key_path == f"{path}:3"
    assert info.value.hint is not None and "deleting that line" in info.value.hint


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "no memory samples"),
        ('{"type": "start", "source": "x"}\n', "no memory samples"),
        ("[1, 2]\n", "not a JSON object"),
        ('{"type": "mystery"}\n', "unknown record type"),
        ('{"type": "sample", "step": "one"}\n', "step must be a whole number"),
    ],
)
def test_files_that_are_not_runs(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_run(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file") as info:
        load_run(tmp_path / "nope.jsonl")
    assert info.value.hint is not None


def test_watch_logs_load_as_background_samples(tmp_path: Path) -> None:
    dev = SimulatedDevice("8GiB", used_by_others="1GiB")
    watcher = Watcher(dev)
    log = tmp_path / "watch.jsonl"
    for _ in range(3):
        dev.allocate(512 * MiB)
        append_log(log, watcher.frame())
    run = load_run(log)
    assert run.samples == [] and len(run.background) == 3
    assert [s["device_used_bytes"] for s in run.background] == [
        (1024 + 512 * k) * MiB for k in (1, 2, 3)
    ]
    summary = summarize(run)
    assert summary["first_step"] is None
    assert summary["metrics"]["device_used_bytes"]["peak"] == 2560 * MiB
    fig = plot(run)
    assert fig.axes[0].get_xlabel() == "seconds since the first sample"


def test_run_that_died_before_its_first_step_still_reports_its_events(tmp_path: Path) -> None:
    path = tmp_path / "died.jsonl"
    events = [
        MemoryEvent("oom", 0, "TrainGuard", "out of memory in micro-batch [0:64) of 64 items"),
        MemoryEvent("give_up", 0, "TrainGuard", "gave up after 64 micro-batches"),
    ]
    path.write_text(
        "".join(json.dumps({"type": "event", **e.to_dict()}) + "\n" for e in events),
        encoding="utf-8",
    )
    run = load_run(path)
    assert [e["kind"] for e in run.events] == ["oom", "give_up"]
    assert not run.samples
    html = tmp_path / "died.html"
    write_html(run, html)
    assert "give_up" in html.read_text(encoding="utf-8")
