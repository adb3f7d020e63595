"""Loading a recorded run, summarising it, and drawing the PNG and HTML reports."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest
from _monitor_runs import record_run

from memfit.backends.simulated import SimulatedDevice
from memfit.errors import ConfigError
from memfit.monitor.recorder import Recorder
from memfit.monitor.report import Run, event_steps, load_run, parse_run, summarize, summary_rows
from memfit.monitor.report_html import event_rows, render_html, step_text, write_html
from memfit.monitor.report_plot import plot, write_png
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
    assert rows["growth (leak?)"].startswith("1.0 MiB/step since step 0")
    assert rows["allocated"].startswith("peak 180.0 MiB, mean ")  # MiB, as nvidia-smi counts
    assert rows["budget"] == "512.0 MiB"
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
    ax, strip = fig.axes[0], fig.axes[1]
    labels = ax.get_legend_handles_labels()[1]
    assert {"allocated", "peak allocated"} <= set(labels)
    # the budget (512 MiB) is far above the data (101 to 180 MiB): a gauge, not a line that
    # would squash the curves; the axes span the data
    assert "budget" not in labels
    low, high = ax.get_ylim()
    assert 90 < low < 101 and 180 < high < 300
    (gauge,) = ax.child_axes
    assert "budget 512 MiB" in gauge.get_title(loc="left")
    assert "the peak (180.0 MiB) is 35.2%" in gauge.get_title(loc="left")
    # one row per kind in the strip below; the split at step 30, the cleanup (no step of its
    # own) during step 50, where it happened
    rows = {t.get_text(): t.get_position()[1] for t in strip.get_yticklabels()}
    assert set(rows) == {"split", "cleanup"}
    marks = {round(float(y)): float(x) for c in strip.collections for x, y in c.get_offsets()}
    assert marks[rows["split"]] == 30.0 and marks[rows["cleanup"]] == 50.0


def test_budget_near_the_data_is_a_line(tmp_path: Path) -> None:
    path = record_run(tmp_path / "run.jsonl", 20, per_step=5 * MiB, budget="150MiB")
    fig = plot(load_run(path))
    ax = fig.axes[0]
    assert "budget" in ax.get_legend_handles_labels()[1]
    assert not ax.child_axes and ax.get_ylim()[1] >= 150
    assert len(fig.axes) == 1  # no events, no strip


def test_coincident_events_stay_readable(tmp_path: Path) -> None:
    """An oom and its retry at one step sit in rows of their own; repeats show a count."""
    at_4 = [
        ("oom", "TrainGuard", "out of memory"),
        ("retry", "TrainGuard", "retrying"),
        *[("cleanup", "cleanup.every", "cleaned")] * 3,
    ]
    path = record_run(tmp_path / "run.jsonl", 10, events={4: at_4})
    fig = plot(load_run(path))
    strip = fig.axes[1]
    labels = [t.get_text() for t in strip.get_yticklabels()]
    assert labels == ["oom", "retry", "cleanup"]  # what went wrong first
    positions = sorted((float(x), float(y)) for c in strip.collections for x, y in c.get_offsets())
    assert positions == [(4.0, 0.0), (4.0, 1.0), (4.0, 2.0)]  # one row each, same step
    assert [t.get_text() for t in strip.texts] == ["x3"]


def test_html_report_is_self_contained(tmp_path: Path) -> None:
    run = load_run(_recorded_run(tmp_path / "run.jsonl", leak=True))
    out = write_html(run, tmp_path / "report.html")
    page = out.read_text()
    match = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert match is not None
    assert base64.b64decode(match.group(1)).startswith(PNG_MAGIC)
    assert not re.search(r'(src|href)="https?://', page)  # nothing fetched from outside
    assert "split</td>" in page and "<td>TrainGuard</td>" in page
    assert "1.0 MiB/step since step 0" in page
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


# --- a run log is untrusted input (issue 15) --------------------------------------------------

SAMPLE = '{"type": "sample", "mode": "step", "step": 0, "allocated_bytes": 1048576}'


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"type": "event", "data": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
        (
            '{"type": "sample", "step": 1, "allocated_bytes": 1' + "0" * 400 + "}",
            "allocated_bytes must be between 0 and 16 EiB",
        ),
        (
            '{"type": "sample", "step": 1, "peak_allocated_bytes": 1e400}',
            "peak_allocated_bytes must be a whole number or null, not inf",
        ),
        (
            '{"type": "sample", "step": 1, "peak_allocated_bytes": NaN}',
            "peak_allocated_bytes must be a whole number or null, not nan",
        ),
        (
            '{"type": "sample", "step": 1, "peak_allocated_bytes": "lots"}',
            "peak_allocated_bytes must be a whole number or null, not 'lots'",
        ),
        ('{"type": "sample", "step": 1, "time": "noon"}', "time must be a number or null"),
        ('{"type": "sample", "step": 1, "step_seconds": -1.0}', "not negative"),
        ('{"type": "event", "step": 1.5, "kind": "oom"}', "step must be a whole number"),
        ('{"type": "event", "step": 1, "kind": 7}', "kind must be a name"),
        ('{"type": "sample", "step": 1, "allocated_bytes": 1' + "0" * 5000 + "}", "not JSON"),
    ],
)
def test_values_no_recorder_writes_are_errors_that_name_the_line(
    tmp_path: Path, line: str, message: str
) -> None:
    path = tmp_path / "run.jsonl"
    path.write_text(SAMPLE + "\n" + line + "\n" + SAMPLE.replace('"step": 0', '"step": 2') + "\n")
    with pytest.raises(ConfigError, match=re.escape(message)) as info:
        load_run(path)
    assert info.value.key_path is not None and info.value.key_path.startswith(f"{path}:2")


def test_a_cut_off_last_line_is_skipped_with_a_warning(tmp_path: Path) -> None:
    path = _recorded_run(tmp_path / "run.jsonl", leak=False)
    whole = path.read_bytes()
    for cut in (b'{"type": "sample", "st', b'{"type": "sample", "message": "caf\xc3'):
        path.write_bytes(whole + cut)  # the writer was killed mid-line: no line break after it
        run = load_run(path)
        assert len(run.samples) == 80
        (warning,) = run.warnings
        assert "the last line is cut off" in warning and warning.startswith(f"{path}:")
        assert summarize(run)["warnings"] == [warning]
        assert ("warning", warning) in summary_rows(summarize(run))
        assert "Warning: " in render_html(run)


def test_a_bad_line_that_is_not_the_cut_off_end_is_still_an_error(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    path.write_text(SAMPLE + '\n{"type": "sam\n')  # ends with a line break: not cut off
    with pytest.raises(ConfigError, match="line 2 is not JSON"):
        load_run(path)
    path.write_text('{"type": "sam')  # a single bad line is no log at all
    with pytest.raises(ConfigError, match="line 1 is not JSON"):
        load_run(path)


def test_parse_run_reads_bytes_from_anywhere() -> None:
    run = parse_run((SAMPLE + "\n").encode(), source="<stdin>")
    assert run.path is None and run.samples[0]["allocated_bytes"] == MiB
    with pytest.raises(ConfigError, match="no memory samples") as info:
        parse_run(b"\n\n", source="<stdin>")
    assert info.value.key_path == "<stdin>"


# --- events are drawn at the step they happened -----------------------------------------------


def _timed_run(events: list[dict[str, object]], *, every: int = 1) -> Run:
    """Samples at steps 0, every, 2*every, ... taken at times 100 + step; the given events."""
    run = Run()
    run.meta["every"] = every
    for step in range(0, 20, every):
        run.samples.append({"step": step, "time": 100.0 + step, "allocated_bytes": MiB})
    run.events = [{"type": "event", "source": "x", "message": "m", **e} for e in events]
    return run


def test_an_events_own_step_is_kept_when_it_agrees_with_its_time() -> None:
    run = _timed_run([{"kind": "oom", "step": 7, "time": 106.5}])
    assert event_steps(run) == [7]


def test_a_counter_of_its_own_is_replaced_by_the_step_it_happened_in() -> None:
    # a guard that counts its updates (11) during training step 52; a policy that stamped
    # its call count (3) during step 12; a cleanup without a step during step 5
    run = _timed_run(
        [
            {"kind": "oom", "step": 11, "time": 111.5},
            {"kind": "cleanup", "step": 3, "time": 111.7},
            {"kind": "cleanup", "step": None, "time": 104.2},
        ]
    )
    assert event_steps(run) == [12, 12, 5]
    rows = event_rows(run)
    assert [step_text(r) for r in rows] == ["12 (own count 11)", "12 (own count 3)", "5"]


def test_events_after_the_last_sample_stay_next_to_it() -> None:
    run = _timed_run(
        [
            {"kind": "oom", "step": 20, "time": 200.0},  # the step that never finished
            {"kind": "cleanup", "step": 31, "time": 201.0},  # a call count after the end
            {"kind": "give_up", "step": None, "time": 202.0},
        ]
    )
    assert event_steps(run) == [20, 20, 20]


def test_with_sparse_samples_an_own_step_inside_the_interval_is_kept() -> None:
    run = _timed_run(
        [{"kind": "split", "step": 13, "time": 113.5}, {"kind": "split", "step": 3, "time": 113.6}],
        every=5,
    )
    assert event_steps(run) == [13, 15]


def test_events_without_time_keep_their_step() -> None:
    run = _timed_run([{"kind": "oom", "step": 4}, {"kind": "oom", "step": None}])
    assert event_steps(run) == [4, None]


def test_a_run_without_memory_figures_draws_its_step_times(tmp_path: Path) -> None:
    path = tmp_path / "jax_cpu.jsonl"
    path.write_text(
        "".join(
            json.dumps({"type": "sample", "step": s, "step_seconds": 0.01 * (s + 1)}) + "\n"
            for s in range(10)
        )
    )
    fig = plot(load_run(path))
    ax = fig.axes[0]
    assert ax.get_ylabel() == "step time (ms)"
    (line,) = ax.lines
    assert list(line.get_ydata())[:2] == pytest.approx([10.0, 20.0])


def test_step_ticks_are_whole_numbers(tmp_path: Path) -> None:
    """Issue 22: a short run's step axis has no tick at 2.5."""
    from memfit.monitor.report_plot import plot

    run = load_run(record_run(tmp_path / "run.jsonl", 5))
    fig = plot(run)
    try:
        fig.canvas.draw()
        for axes in fig.axes:
            if axes.get_xlabel() == "step" or axes.get_shared_x_axes().joined(axes, fig.axes[0]):
                low, high = axes.get_xlim()
                ticks = [t for t in axes.get_xticks() if low <= t <= high]
                assert ticks and all(float(t).is_integer() for t in ticks), ticks
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)
