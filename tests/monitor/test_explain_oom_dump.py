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


def test_the_card_of_a_simulated_snapshot_is_the_simulated_budget(tmp_path: Path) -> None:
    """Issue 32: a dump from simulate_gpu("120MiB") read as a larger card in explain. The
    simulated GPU counts allocated bytes against its budget while the snapshot's segments are
    the allocator model's: blocks of 9 MiB pair up in 20 MiB segments past the budget."""
    keep: list[object] = []
    with memfit.Recorder(tmp_path / "r.jsonl", log=False) as rec:
        with pytest.raises(torch.OutOfMemoryError) as err, memfit.simulate_gpu("120MiB"):
            for _ in range(20):
                keep.append(torch.empty(9 * MiB, dtype=torch.uint8))
        rec.on_oom(err.value)
    e = memfit.explain(tmp_path / "r.oom1.snapshot.pickle")
    assert e.peak_reserved_bytes > 120 * MiB  # the model's segments
    assert e.capacity_bytes == 120 * MiB
    assert e.oom is not None and e.oom.capacity_bytes == 120 * MiB
    [note] = [n for n in e.notes if "simulate_gpu: a card of 120.00 MiB" in n]
    assert "a real card of that size fails sooner" in note
    assert all(w.fits is False for w in e.what_if)  # against the card, 117 MiB live + 9 MiB


@pytest.mark.parametrize("history", [100_000, 0])
def test_memory_history_says_what_a_simulated_gpu_does(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, history: int
) -> None:
    """Issue 32: memory_history logged "needs torch with CUDA; left off" and then the OOM
    dump wrote a snapshot anyway (the simulated GPU's). The log now says where the snapshot
    comes from, and a simulated GPU without history writes none."""
    caplog.set_level(logging.INFO, logger="memfit")
    keep: list[object] = []
    with (
        pytest.raises(torch.OutOfMemoryError),
        memfit.simulate_gpu("4MiB", history=history),
        memfit.Recorder(tmp_path / "r.jsonl", memory_history=100_000) as rec,
    ):
        _train(keep)
    said = " ".join(r.getMessage() for r in caplog.records if "memory_history" in r.getMessage())
    assert "left off" not in said
    has_snapshot = any(p.suffix == ".pickle" for p in rec.oom_files)
    assert has_snapshot == (history > 0)
    if history:
        assert "the simulated GPU keeps its own allocation history" in said
    else:
        assert "keeps no history" in said and "no snapshot" in said


def test_memory_history_without_cuda_or_a_simulated_gpu_says_none_is_recorded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="memfit")
    with memfit.Recorder(tmp_path / "r.jsonl", memory_history=1000) as rec:
        rec.step(step=0)
        written = rec.on_oom(RuntimeError("CUDA out of memory. Tried to allocate 2.00 MiB"))
    said = " ".join(r.getMessage() for r in caplog.records if "memory_history" in r.getMessage())
    assert "none is recorded now" in said
    if not torch.cuda.is_available():
        assert [p.suffix for p in written] == [".jsonl"]
