"""`memfit watch --imbalance`: a local GPU whose peak is well above the others' is flagged,
with the frame where it started (issue 24)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from memfit.backends.base import DeviceSnapshot, SystemSnapshot
from memfit.cli.main import main
from memfit.errors import ConfigError
from memfit.monitor.report import parse_run
from memfit.monitor.watch import Watcher, append_log

GiB = 2**30


class SequenceProbe:
    """Snapshots of three GPUs, one per frame, from a list of used-memory rows."""

    name = "sequence"

    def __init__(self, rows: list[tuple[int, ...]]) -> None:
        self._rows: Iterator[tuple[int, ...]] = iter(rows)

    def snapshot(self) -> SystemSnapshot:
        used = next(self._rows)
        devices = tuple(
            DeviceSnapshot(
                index=i, name=f"GPU{i}", total_bytes=24 * GiB, device_used_bytes=u, backend="nvml"
            )
            for i, u in enumerate(used)
        )
        return SystemSnapshot(source="nvml", devices=devices)


ROWS = [
    (4 * GiB, 4 * GiB, 4 * GiB),
    (5 * GiB, 5 * GiB, 5 * GiB),
    (5 * GiB, 8 * GiB, 5 * GiB),  # GPU 1 climbs at frame 3
    (5 * GiB, 9 * GiB, 5 * GiB),
    (5 * GiB, 4 * GiB, 5 * GiB),  # it frees memory, but its peak stays
]


def test_a_gpu_above_the_others_is_flagged_from_the_frame_it_started(tmp_path: Path) -> None:
    watcher = Watcher(SequenceProbe(ROWS), imbalance=0.2)
    frames = [watcher.frame() for _ in ROWS]
    assert [f.imbalance for f in frames[:2]] == [(), ()]
    flagged = [f.imbalance for f in frames[2:]]
    assert all(len(f) == 1 and f[0]["device"] == 1 for f in flagged)
    assert {f[0]["since_frame"] for f in flagged} == {3}
    assert flagged[1][0]["peak_bytes"] == 9 * GiB
    assert flagged[1][0]["others_bytes"] == 5 * GiB
    assert flagged[1][0]["excess"] == pytest.approx(0.8)
    # the log line carries it, and `memfit report` still reads the log
    log = tmp_path / "watch.jsonl"
    for frame in frames:
        append_log(log, frame)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert "imbalance" not in lines[0] and lines[3]["imbalance"][0]["device"] == 1
    run = parse_run(log.read_bytes())
    assert len(run.background) == 3 * len(ROWS)


def test_off_by_default_and_a_bad_threshold_is_refused() -> None:
    watcher = Watcher(SequenceProbe(ROWS))
    assert all(watcher.frame().imbalance == () for _ in ROWS)
    with pytest.raises(ConfigError, match="imbalance"):
        Watcher(SequenceProbe(ROWS), imbalance=0.0)


def test_cli_refuses_a_bad_imbalance_before_looking_for_a_gpu(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["watch", "--once", "--imbalance", "-1"]) == 1
    err = capsys.readouterr().err
    assert "--imbalance" in err and "Hint:" in err
