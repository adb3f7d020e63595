"""A run log with many events draws in bounded work (issue 21): events are binned into at
most ``MAX_EVENT_MARKS`` markers per kind, the OOM lines are one collection."""

from __future__ import annotations

import json

import pytest

from memfit.monitor import report, report_plot

pytest.importorskip("matplotlib", reason="the picture needs matplotlib")


def _log(steps: int, events: int) -> bytes:
    lines = [json.dumps({"type": "start", "source": "simulated", "every": 1, "pid": 1})]
    for i in range(steps):
        lines.append(
            json.dumps(
                {
                    "type": "sample",
                    "mode": "step",
                    "step": i,
                    "time": 1000.0 + i,
                    "allocated_bytes": 2**20 * (i % 50),
                    "reserved_bytes": 2**22,
                    "total_bytes": 2**30,
                    "budget_bytes": 2**30,
                    "source": "simulated",
                }
            )
        )
    for k in range(events):
        step = k % steps
        kind = ("oom", "retry", "split")[k % 3]
        lines.append(
            json.dumps(
                {
                    "type": "event",
                    "kind": kind,
                    "step": step,
                    "source": "TrainGuard",
                    "message": "m",
                    "data": {},
                    "time": 1000.0 + step + 0.5,
                }
            )
        )
    return ("\n".join(lines) + "\n").encode()


def test_many_events_are_binned_in_the_picture() -> None:
    run = report.parse_run(_log(3000, 9000), source="<test>")
    fig = report_plot.plot(run)
    ax, strip = fig.axes[0], fig.axes[1]
    markers = sum(len(c.get_offsets()) for c in strip.collections)
    assert 0 < markers <= 3 * report_plot.MAX_EVENT_MARKS
    assert len(strip.texts) <= 3 * report_plot.MAX_EVENT_LABELS
    assert len(ax.lines) < 20  # no line per event: the OOM marks are one collection
    # every event is still counted in the summary
    assert report.summarize(run)["events"] == {"oom": 3000, "retry": 3000, "split": 3000}


def test_few_events_keep_one_marker_per_step() -> None:
    run = report.parse_run(_log(50, 30), source="<test>")
    fig = report_plot.plot(run)
    strip = fig.axes[1]
    assert sum(len(c.get_offsets()) for c in strip.collections) == 30
