"""``memfit.explain`` / ``memfit explain`` on hand-built snapshots with known answers and on
the public corpus (issue 20)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest
from public_snapshots import corpus_dir

import memfit
from memfit.allocator.replay import recorded_curve, start_state
from memfit.allocator.snapshot import load_snapshot
from memfit.allocator.snapshot_build import TraceBuilder
from memfit.cli.main import main
from memfit.errors import ConfigError, OutOfMemory
from memfit.monitor.explain import _thin
from memfit.monitor.explain_render import png_bytes, render_html, render_text

MiB = 2**20
# The public corpus is data from public repositories, kept outside the repository
# (bench/public_replay.py's corpus_dir): without it these cases are not collected.
PUBLIC = corpus_dir()
PUBLIC_FILES = sorted(PUBLIC.glob("*.json.gz"))[:6] if PUBLIC is not None else []
BATCH = [("/home/me/train.py", 5, "load_batch")]


def _frames(line: int, name: str = "forward") -> list[tuple[str, int, str]]:
    return [
        ("/site-packages/torch/nn/modules/module.py", 1500, "_call_impl"),
        ("/home/me/model.py", line, name),
        ("/usr/lib/python3.11/runpy.py", 80, "_run_code"),
    ]


def _fragmented_oom() -> dict[str, Any]:
    """Two steps cache a 100 MiB segment; the third splits it for 30 MiB and then asks 90 MiB
    under a 150 MiB limit: out of memory with 70 MiB free but split. Expandable segments
    (30 + 90 in one growing segment) and empty_cache() before the step both fit."""
    b = TraceBuilder(limit_bytes=150 * MiB)
    for step in range(3):
        m = b.malloc(1024, frames=BATCH)
        if step < 2:
            b.free(b.malloc(100 * MiB, frames=_frames(7)))
            b.free(m)
            continue
        b.malloc(30 * MiB, frames=_frames(9))
        with pytest.raises(OutOfMemory):
            b.malloc(90 * MiB, frames=_frames(10))
    return b.snapshot()


def test_fragmentation_that_expandable_segments_cures() -> None:
    e = memfit.explain(_fragmented_oom())
    assert isinstance(e, memfit.Explanation)
    assert e.at == "oom" and e.oom is not None
    assert e.oom.requested_bytes == 90 * MiB
    assert e.oom.device_free_bytes == 48 * MiB  # 150 - 102 reserved
    assert e.oom.largest_free_block_bytes == 70 * MiB
    assert e.replay_exact and e.replay_bytes_off == 0
    assert e.capacity_bytes == 150 * MiB
    frag = e.fragmentation
    assert frag.split_bytes == 72 * MiB - 1024 and frag.whole_segment_bytes == 0
    assert frag.too_small_bytes == 70 * MiB and frag.request_bytes == 90 * MiB
    assert frag.split_by[0].name.startswith("me/model.py:9 (forward)")
    by = {w.name: w for w in e.what_if}
    assert by["as recorded"].fits is False and by["as recorded"].failed_requests == 1
    assert by["expandable_segments"].fits is True
    assert by["expandable_segments"].peak_reserved_bytes == 122 * MiB
    assert by["empty_cache each step"].fits is True  # the OOM's request fits after empty_cache
    assert by["max_split_size_mb=128"].fits is False
    assert e.recommendation == "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    assert "90.00 MiB fits" in e.evidence
    assert e.steps == 3
    site = e.group("site")
    assert site is not None and site.rows[0].name == "me/model.py:9 (forward)"
    assert site.rows[0].bytes == 30 * MiB


def test_an_oom_no_setting_cures_says_what_must_shrink() -> None:
    b = TraceBuilder(limit_bytes=200 * MiB)
    for i in range(9):
        b.malloc(20 * MiB, frames=_frames(20 + i % 2))
    with pytest.raises(OutOfMemory):
        b.malloc(40 * MiB, frames=_frames(30))
    e = memfit.explain(b.snapshot())
    assert e.oom is not None and e.oom.allocated_bytes == 180 * MiB
    assert all(w.fits is False for w in e.what_if)
    assert e.recommendation.startswith("no allocator setting helps")
    assert e.must_shrink_bytes == 20 * MiB  # 180 live + 40 asked - 200
    assert "model.py:20" in e.evidence
    assert e.fragmentation.cached_bytes == 0


def test_a_leak_of_n_blocks_per_step() -> None:
    b = TraceBuilder()
    kept = []
    for _step in range(6):
        batch = b.malloc(4 * MiB, frames=BATCH)
        temp = b.malloc(32 * MiB, frames=_frames(40))
        for _ in range(3):  # three blocks kept per step
            kept.append(b.malloc(2 * MiB, frames=_frames(41, "log_metrics")))
        b.free(temp)
        b.free(batch)
    e = memfit.explain(b.snapshot(), at="end")
    assert e.steps == 6
    assert len(e.leaks) == 1
    leak = e.leaks[0]
    assert leak.site == "me/model.py:41 (log_metrics)"
    assert leak.growth_per_step_bytes == 6 * MiB
    assert leak.live_bytes == tuple(6 * MiB * i for i in range(6))


def test_no_leak_when_each_step_frees_what_it_took() -> None:
    b = TraceBuilder()
    for _step in range(5):
        batch = b.malloc(4 * MiB, frames=BATCH)
        b.free(b.malloc(32 * MiB, frames=_frames(40)))
        b.free(batch)
    e = memfit.explain(b.snapshot())
    assert e.steps == 5 and e.leaks == ()


def test_a_peak_lowered_by_a_setting_is_recommended() -> None:
    # A cached 400 MiB segment is split for 120 MiB; 360 MiB then needs a segment of its own
    # (760 MiB reserved), where an expandable segment maps only the 80 MiB it lacks (480).
    b = TraceBuilder()
    b.free(b.malloc(400 * MiB, frames=_frames(50)))
    b.malloc(120 * MiB, frames=_frames(51))
    b.malloc(360 * MiB, frames=_frames(52))
    e = memfit.explain(b.snapshot())
    by = {w.name: w for w in e.what_if}
    assert by["as recorded"].peak_reserved_bytes == 760 * MiB
    assert by["expandable_segments"].peak_reserved_bytes == 480 * MiB
    assert by["max_split_size_mb=128"].peak_reserved_bytes == 880 * MiB
    assert e.recommendation == "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    assert "280.00 MiB less" in e.evidence
    assert by["as recorded"].fits is None  # no limit met, no capacity known


def test_without_frames_it_says_so_and_groups_by_size() -> None:
    b = TraceBuilder()
    for _ in range(3):
        b.malloc(8 * MiB)
    e = memfit.explain(b.snapshot())
    assert not e.has_frames and e.group("site") is None
    size = e.group("size")
    assert size is not None and size.rows[0] == memfit.monitor.explain.Site("8.00 MiB", 24 * MiB, 3)
    assert any("no stack frames" in n for n in e.notes)


@pytest.mark.skipif(not PUBLIC_FILES, reason="the public snapshot corpus is not here")
@pytest.mark.parametrize("path", PUBLIC_FILES or [Path("absent")], ids=lambda p: p.name[:30])
def test_public_snapshots_peaks_are_the_traces_own(path: Path) -> None:
    e = memfit.explain(path)
    dev = load_snapshot(path).device()
    start = start_state(dev)
    recorded = recorded_curve(dev, start)
    assert e.peak_reserved_bytes == max([start.reserved_bytes, *recorded])
    assert e.replay_exact and e.replay_bytes_off == 0
    assert e.what_if[0].peak_reserved_bytes == e.peak_reserved_bytes
    data = e.to_dict()
    json.dumps(data)
    assert data["peak_reserved_bytes"] == e.peak_reserved_bytes
    assert isinstance(data["peak_allocated_bytes"], int)
    lines = render_text(e)
    assert any("4. What if" in line for line in lines)


def test_at_points_and_bad_at() -> None:
    data = _fragmented_oom()
    assert memfit.explain(data, at="peak").at == "peak"
    end = memfit.explain(data, at="end")
    assert end.at_event == end.events - 1
    assert memfit.explain(data, at=3).at_event == 3
    with pytest.raises(ConfigError, match="outside the trace"):
        memfit.explain(data, at=10_000)
    b = TraceBuilder()
    b.malloc(MiB)
    with pytest.raises(ConfigError, match="no out-of-memory"):
        memfit.explain(b.snapshot(), at="oom")


def test_at_peak_is_where_the_most_memory_is_live() -> None:
    """Issue 32: ``--at peak`` broke memory down at the reserved peak's first event (one
    block live) while the allocated peak came later inside the same segment."""
    b = TraceBuilder()
    b.free(b.malloc(3 * MiB))  # the 20 MiB segment: the reserved peak from here on
    blocks = [b.malloc(3 * MiB) for _ in range(5)]  # 15 MiB live, the same segment
    for block in blocks:
        b.free(block)
    e = memfit.explain(b.snapshot(), at="peak")
    assert e.peak_reserved_event < e.peak_allocated_event
    assert e.at_event == e.peak_allocated_event
    assert e.allocated_bytes == e.peak_allocated_bytes == 15 * MiB
    assert sum(row.bytes for row in e.group("size").rows) == 15 * MiB


def test_no_trace_and_empty_trace_say_how_to_record() -> None:
    data = _fragmented_oom()
    no_trace = {"segments": data["segments"]}
    with pytest.raises(ConfigError, match="no allocator trace") as err:
        memfit.explain(no_trace)
    assert err.value.hint and "_record_memory_history" in err.value.hint
    empty = {"segments": data["segments"], "device_traces": [[]]}
    with pytest.raises(ConfigError, match="trace is empty") as err:
        memfit.explain(empty)
    assert err.value.hint and "_record_memory_history" in err.value.hint
    with pytest.raises(ConfigError, match="no segment and no trace"):
        memfit.explain({"segments": [], "device_traces": []})


def test_the_picture_is_thinned_and_self_contained() -> None:
    n = 100_000
    reserved = [i % 977 for i in range(n)]
    allocated = [i % 613 for i in range(n)]
    reserved[54_321] = 10_000
    thin = _thin(reserved, allocated)
    assert len(thin) <= 2_700
    assert (54_321, 10_000, allocated[54_321]) in thin
    e = memfit.explain(_fragmented_oom())
    png = png_bytes(e)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    page = render_html(e)
    assert page.startswith("<!DOCTYPE html>") and "data:image/png;base64," in page
    assert "http" not in page.split("base64,")[0]


# --- the command --------------------------------------------------------------------------------


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _user_error(code: int, err: str, *words: str) -> None:
    assert code == 1, err
    assert "Error:" in err and "Hint:" in err and "Traceback" not in err, err
    for word in words:
        assert word in err, err


def test_cli_text_json_and_outputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(_fragmented_oom()))
    code, out, err = _run(capsys, "explain", str(path))
    assert code == 0, err
    assert "OUT OF MEMORY at event" in out and "expandable_segments:True" in out
    code, out, err = _run(capsys, "explain", str(path), "--json", "--at", "peak")
    assert code == 0, err
    data = json.loads(out)
    assert data["at"] == "peak" and data["oom"]["requested_bytes"] == 90 * MiB
    for key in ("peak_reserved_bytes", "peak_allocated_bytes", "what_if", "groups"):
        assert key in data
    png = tmp_path / "e.png"
    code, _, err = _run(capsys, "explain", str(path), "-o", str(png))
    assert code == 0, err
    assert png.read_bytes()[:4] == b"\x89PNG"
    code, _, err = _run(capsys, "explain", str(path), "-o", str(png))
    _user_error(code, err, "--force")
    html_out = tmp_path / "e.html"
    code, _, err = _run(capsys, "explain", str(path), "-o", str(html_out), "--force")
    assert code == 0 and html_out.read_text().startswith("<!DOCTYPE html>")
    code, _, err = _run(capsys, "explain", str(path), "-o", str(path), "--force")
    _user_error(code, err)
    assert path.read_bytes()[:1] == b"\x80"  # the input is never overwritten


def test_cli_refuses_a_pickle_that_would_run_a_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import os

    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self) -> tuple[Any, ...]:
            return (os.system, (f"touch {marker}",))

    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[Evil()]]}))
    code, _, err = _run(capsys, "explain", str(path))
    _user_error(code, err, "names the Python object")
    assert not marker.exists()


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"\x80\x04\x95", "cut off"),
        (pickle.dumps([1, 2]), "not a CUDA memory snapshot"),
        (b'{"loss": 1.5}', "no 'segments' key"),
        (json.dumps({"segments": []}).encode(), "no segment and no trace"),
        (b"hello", "neither a pickle"),
    ],
)
def test_cli_bad_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, words: str
) -> None:
    path = tmp_path / "bad.pickle"
    path.write_bytes(content)
    code, _, err = _run(capsys, "explain", str(path))
    _user_error(code, err, words)


def test_cli_bad_at_and_output_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "snap.json"
    path.write_text(json.dumps(_fragmented_oom()))
    code, _, err = _run(capsys, "explain", str(path), "--at", "middle")
    _user_error(code, err, "--at")
    code, _, err = _run(capsys, "explain", str(path), "-o", str(tmp_path / "x.txt"))
    _user_error(code, err, "report.png")
    code, _, err = _run(capsys, "explain", str(tmp_path / "missing.pickle"))
    _user_error(code, err)


def test_cli_device_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    one = TraceBuilder(device=1)
    one.malloc(5 * MiB, frames=_frames(60))
    data = one.snapshot()
    data["segments"] += _fragmented_oom()["segments"]  # device 0: segments, no trace
    path = tmp_path / "two.pickle"
    path.write_bytes(pickle.dumps(data))
    code, out, err = _run(capsys, "explain", str(path), "--json")
    assert code == 0, err
    assert json.loads(out)["device"] == 1
    code, _, err = _run(capsys, "explain", str(path), "--device", "0")
    _user_error(code, err, "device 0 has no trace")
    code, _, err = _run(capsys, "explain", str(path), "--device", "7")
    _user_error(code, err, "no device 7")


def test_a_users_frame_in_a_checkout_named_memfit_is_the_users() -> None:
    """A clone of memfit (CI's folder) is not memfit's own package: its tests are user code."""
    from memfit.allocator.snapshot import Frame
    from memfit.monitor._trace_walk import user_frame as _user_frame

    inner = Frame("/x/site-packages/torch/nn/modules/linear.py", 125, "forward")
    guard = Frame("/x/site-packages/memfit/runtime/_train_guard.py", 300, "step")
    user = Frame("/tmp/ci/memfit/tests/monitor/test_x.py", 12, "_train")
    assert _user_frame([inner, guard, user]) == user
    assert _user_frame([inner, Frame("/work/src/memfit/runtime/guard.py", 1, "g")]) is None


def _small_snapshot_files(tmp_path: Path) -> list[Path]:
    import gzip

    builder = TraceBuilder()
    for _ in range(3):
        builder.malloc(8 * 2**20)
    data = pickle.dumps(builder.snapshot())
    plain = tmp_path / "s.pickle"
    plain.write_bytes(data)
    packed = tmp_path / "s.pickle.gz"
    packed.write_bytes(gzip.compress(data))
    return [plain, packed]


@pytest.mark.parametrize("value", [2**63, 10**30, 0, -1, 1.5, True])
@pytest.mark.parametrize("param", ["max_bytes", "capacity_bytes"])
def test_explain_refuses_a_size_that_cannot_be_real(tmp_path: Path, param: str, value: Any) -> None:
    """Issue 45: ``max_bytes=2**63`` was an ``OverflowError`` in the file reader."""
    for path in _small_snapshot_files(tmp_path):
        with pytest.raises(ConfigError) as info:
            memfit.explain(path, **{param: value})
        assert info.value.key_path == param, str(info.value)


@pytest.mark.parametrize("max_bytes", [2**40, 2**62, 2**63 - 1])
def test_explain_reads_a_small_file_under_any_large_max_bytes(
    tmp_path: Path, max_bytes: int
) -> None:
    """A large limit is a bound, not a buffer: 2**40 was a ``MemoryError`` (one read of
    that many bytes), plain or gzip."""
    for path in _small_snapshot_files(tmp_path):
        assert memfit.explain(path, max_bytes=max_bytes).peak_allocated_bytes > 0


@pytest.mark.parametrize("size", [0, 1, 6, 7, 8, 9, 20])
@pytest.mark.parametrize("limit", [1, 7, 8, 2**62])
def test_read_limited_reads_in_pieces_and_stops_past_the_limit(
    monkeypatch: pytest.MonkeyPatch, size: int, limit: int
) -> None:
    import io

    from memfit import _userfiles

    monkeypatch.setattr(_userfiles, "_READ_CHUNK", 4)
    data = bytes(range(size))
    if size > limit:
        with pytest.raises(ConfigError, match="more than"):
            _userfiles.read_limited(io.BytesIO(data), limit, source="x", what="the file")
    else:
        assert _userfiles.read_limited(io.BytesIO(data), limit, source="x", what="f") == data
