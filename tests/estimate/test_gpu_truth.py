"""The GPU truth corpus (tests/data/gpu_truth/), replayed on the CPU (``pytest -k gpu_truth``).

Each stored entry is one real run of an accuracy workload (bench/gpu_truth.py captured it):
its peaks and the allocator's own trace. Three checks, as issue 12 asks:

(a) the allocator model replays a real CUDA trace's requests, each new segment at the address
    the real cudaMalloc returned, and reproduces the real reserved peak and segment count
    exactly (this isolates the allocator model from the tracer);
(b) the traced run's request sequence is diffed against the real one and every difference is
    named (workspaces, scratch, reordering; see ``truth_corpus.diff_requests``);
(c) the estimator's predictions against the real peaks, as a table, with the goals: mean
    |err| <= 3% and worst <= 8% (CPU peak, CUDA allocated), reserved mean <= 5% / worst <=
    10%, JAX within 10%.

The corpus holds CPU entries (truth: the CPU allocator's reports of a real run on the
development VM) and, since 2026-11-26, CUDA entries from an H100 (torch 2.11.0+cu130, jaxlib
0.11.2; 25 of the workloads). A unit test also replays a hand-written CUDA trace whose
reserved peak is worked out by hand from the allocator's rules.

The CUDA entries' estimates, (c) on CUDA and the JAX entries, are in test_gpu_truth_cuda.py
(its own file, so that pytest-xdist runs it beside this one). Since issue 48 the H100 entries
meet the goals but for the misses that file names, each with why (docs/benchmarks.md has
the table): cuDNN's convolution workspaces are fitted on the corpus's calibration half, the
reductions' staging buffers and cuBLASLt's own workspace are read from torch's source.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from _gpu_truth_common import (
    CORPUS,
    ENTRIES,
    NO_CUDA_CORPUS,
    MiB,
    cpu_kernels_differ,
    goals,
    params,
    prediction,
)
from _gpu_truth_common import bench as _bench
from truth_corpus import (
    FORMAT_VERSION,
    Event,
    Trace,
    TruthEntry,
    corpus_bytes,
    diff_requests,
    load_entry,
    replay,
    save_entry,
)

from memfit.errors import ConfigError

# --- the corpus itself -------------------------------------------------------------------------


def test_gpu_truth_corpus_is_not_empty_every_entry_loads_and_it_stays_small() -> None:
    assert ENTRIES, "tests/data/gpu_truth holds no entry: the replay tests would test nothing"
    for entry in ENTRIES:
        assert entry.trace is not None or entry.jax is not None, entry.name
        assert any(v for v in entry.peaks.values()), entry.name
    assert corpus_bytes(CORPUS) < 25 * 10**6
    devices = {e.device for e in ENTRIES}
    assert "cpu" in devices  # the corpus CI can check the tracer against today


def test_gpu_truth_format_round_trips_and_refuses_what_it_cannot_read(tmp_path: Path) -> None:
    trace = Trace.from_events(
        [
            Event("segment_alloc", 0x7F0000000000, 20 * MiB, 7, None),
            Event("alloc", 0x7F0000000000, 3 * MiB, 7, "aten.mm.default"),
            Event("free_completed", 0x7F0000000000, 3 * MiB, 7, None),
        ]
    )
    entry = TruthEntry(
        name="w@8",
        kind="torch",
        device="cuda",
        workload="w",
        batch=8,
        environment={"gpu_name": "NVIDIA H100 80GB HBM3"},
        peaks={"max_allocated": 3 * MiB, "max_reserved": 20 * MiB},
        trace=trace,
    )
    path = save_entry(entry, tmp_path / "gpu" / "w@8.json.gz")
    assert load_entry(path) == entry
    assert save_entry(entry, tmp_path / "again.json.gz").read_bytes() == path.read_bytes()
    data = entry.to_json()
    with pytest.raises(ConfigError, match=f"this memfit reads {FORMAT_VERSION}"):
        TruthEntry.from_json({**data, "format": FORMAT_VERSION + 1})
    with pytest.raises(ConfigError, match="missing peaks"):
        TruthEntry.from_json({k: v for k, v in data.items() if k != "peaks"})
    broken = {**data, "trace": {**data["trace"], "sizes": [1]}}
    with pytest.raises(ConfigError, match="trace column sizes has 1 entries, not 3"):
        TruthEntry.from_json(broken)
    with pytest.raises(ConfigError, match="peak max_reserved"):
        TruthEntry.from_json({**data, "peaks": {"max_reserved": -1}})
    (tmp_path / "bad.json.gz").write_bytes(b"not gzip")
    with pytest.raises(ConfigError, match="not gzip JSON"):
        load_entry(tmp_path / "bad.json.gz")


def test_gpu_truth_capture_names_the_op_of_each_allocation_and_compresses_the_trace() -> None:
    """The capture's two CPU-testable parts: the dispatch mode that puts the op's name on
    the Python stack (where ``_record_memory_history(stacks="python")`` reads it), and the
    compression of a ``_snapshot()`` device trace into the stored columns."""
    import traceback

    bench = _bench()
    seen: list[str] = []

    @torch.library.custom_op("memfit_test::stack_probe", mutates_args=())
    def stack_probe(x: torch.Tensor) -> torch.Tensor:
        seen.extend(f.name for f in traceback.extract_stack())
        return x.clone()

    with bench._op_mode():
        stack_probe(torch.ones(2))
    assert f"{bench._TAG}memfit_test.stack_probe.default" in seen

    snapshot_trace = [
        {"action": "segment_alloc", "addr": 0x7F00, "size": 2 * MiB, "stream": 0, "frames": []},
        {
            "action": "alloc",
            "addr": 0x7F00,
            "size": 1000,
            "stream": 0,
            "frames": [
                {"filename": "x.py", "line": 1, "name": "step"},
                {"filename": "gpu_truth.py", "line": 2, "name": f"{bench._TAG}aten.mm.default"},
                {"filename": "y.py", "line": 3, "name": "inner"},
            ],
        },
        {"action": "free_requested", "addr": 0x7F00, "size": 1000, "stream": 0},
        {"action": "free_completed", "addr": 0x7F00, "size": 1000, "stream": 0},
        {"action": "oom", "size": 10, "stream": 0, "device_free": 5},
    ]
    snapshot = {"segments": [], "device_traces": [snapshot_trace]}
    columns, notes = bench._compress_trace(snapshot, 0)
    trace = Trace.from_json(columns)
    events = list(trace.events())
    # free_requested followed at once by its completion is not stored
    assert [e.action for e in events] == ["segment_alloc", "alloc", "free_completed", "oom"]
    assert events[1] == Event("alloc", 0x7F00, 1000, 0, "aten.mm.default")
    assert notes == []


# --- (a) the allocator model against real traces ----------------------------------------------


def _hand_trace() -> Trace:
    """A CUDA trace written by hand, with the real allocator's segment events.

    Worked out from the rules in memfit.allocator.model (sizes in MiB; s1/s2 streams):

    ====  =========================================  ==========================  ========
    step  request                                    what the allocator does     reserved
    ====  =========================================  ==========================  ========
    A     3 on s1                                    new 20 segment, split       20
    B     0.6 on s1 (small pool)                     new 2 segment               22
    A     free requested (record_stream on s2)       nothing yet
    C     3 on s1                                    the 17 left of A's segment  22
    D     15 on s2 (>= 10: rounded to 2)             new 16 segment              38
    A     free completed                             A's 3 cached on s1
    E     3 on s1                                    A's block (best fit)        38
    D     free completed                             16 cached on s2
    G     15 on s1                                   s2's 16 is not for s1: new  54
    H     30 on s1                                   new 30 segment              84
    H     free requested (in use on s2)              nothing yet
    I     30 on s1                                   H not free: new 30          114
    ====  =========================================  ==========================  ========

    A replay that freed at free_requested would reuse H's segment (peak 84); one that
    ignored streams would give G stream 2's cached 16 (peak 98).
    """
    s1, s2 = 1, 2
    e = Event
    return Trace.from_events(
        [
            e("segment_alloc", 0x1000_0000, 20 * MiB, s1, None),
            e("alloc", 0x1000_0000, 3 * MiB, s1, "aten.mm.default"),
            e("segment_alloc", 0x2000_0000, 2 * MiB, s1, None),
            e("alloc", 0x2000_0000, 600 * 1024, s1, "aten.add.Tensor"),
            e("free_requested", 0x1000_0000, 3 * MiB, s1, None),
            e("alloc", 0x1030_0000, 3 * MiB, s1, "aten.mul.Tensor"),
            e("segment_alloc", 0x3000_0000, 16 * MiB, s2, None),
            e("alloc", 0x3000_0000, 15 * MiB, s2, "aten.mm.default"),
            e("free_completed", 0x1000_0000, 3 * MiB, s1, None),
            e("alloc", 0x1000_0000, 3 * MiB, s1, "aten.mm.default"),
            e("free_completed", 0x3000_0000, 15 * MiB, s2, None),
            e("segment_alloc", 0x4000_0000, 16 * MiB, s1, None),
            e("alloc", 0x4000_0000, 15 * MiB, s1, "aten.mm.default"),
            e("segment_alloc", 0x5000_0000, 30 * MiB, s1, None),
            e("alloc", 0x5000_0000, 30 * MiB, s1, "aten.mm.default"),
            e("free_requested", 0x5000_0000, 30 * MiB, s1, None),
            e("segment_alloc", 0x6000_0000, 30 * MiB, s1, None),
            e("alloc", 0x6000_0000, 30 * MiB, s1, "aten.mm.default"),
            e("free_completed", 0x5000_0000, 30 * MiB, s1, None),
        ]
    )


def test_gpu_truth_hand_written_trace_replays_to_the_peak_worked_out_by_hand() -> None:
    result = replay(_hand_trace())
    assert result.real_reserved_peak == 114 * MiB
    assert result.model_reserved_peak == 114 * MiB
    assert result.reserved_error == 0.0
    assert result.model_segments == result.real_segments == 6
    assert result.requests == 8


def test_gpu_truth_replay_frees_at_free_completed_and_keeps_streams_apart() -> None:
    trace = _hand_trace()
    events = list(trace.events())
    # Treat every free as completed when requested: H's segment is reused for I.
    early = [
        Event("free_completed", ev.addr, ev.size, ev.stream, ev.op)
        if ev.action == "free_requested"
        else ev
        for ev in events
        if not (ev.action == "free_completed" and ev.addr in (0x1000_0000, 0x5000_0000))
    ]
    assert replay(Trace.from_events(early)).model_reserved_peak == 84 * MiB
    # All on one stream: G takes the cached 16 MiB block that D left.
    one = [Event(ev.action, ev.addr, ev.size, 1, ev.op) for ev in events]
    assert replay(Trace.from_events(one)).model_reserved_peak == 98 * MiB
    with pytest.raises(ConfigError, match="never allocated"):
        replay(Trace.from_events([Event("free_completed", 0x10, 512, 0, None)]))


CUDA_TRACES = [e for e in ENTRIES if e.device == "cuda" and e.trace is not None]
#: Entries whose replay misses, with why. None since the replay places each new segment at
#: the address the real cudaMalloc returned (act_2cam_384@4 was 3.3% under with the model's
#: own addresses: best fit breaks ties between free blocks of one size by address).
REPLAY_MISSES: dict[str, str] = {}


def _replay_params() -> list[Any]:
    cases = params(CUDA_TRACES, NO_CUDA_CORPUS)
    return [
        pytest.param(*p.values, id=p.id, marks=pytest.mark.xfail(strict=True, reason=why))
        if (why := REPLAY_MISSES.get(str(p.id)))
        else p
        for p in cases
    ]


@pytest.mark.parametrize("entry", _replay_params())
def test_gpu_truth_allocator_replay_reproduces_the_real_reserved_peak(entry: TruthEntry) -> None:
    assert entry.trace is not None
    result = replay(
        entry.trace,
        expandable_segments=bool(entry.allocator.get("expandable_segments")),
        max_split_size=entry.allocator.get("max_split_size"),
    )
    real = entry.peaks.get("traced_max_reserved") or entry.peaks.get("max_reserved")
    assert result.real_reserved_peak == real, "the trace's segment events miss some segment"
    assert result.model_reserved_peak == result.real_reserved_peak
    assert result.model_segments == result.real_segments


# --- (b) the traced request sequence against the real one ----------------------------------------


def _diffable() -> list[TruthEntry]:
    """Every CPU entry with a trace, and each CUDA workload at its smallest batch size (the
    larger ones trace the same ops at larger sizes; CI's time is kept for the estimates of
    all of them, in test_gpu_truth_cuda.py); of the ACT policies, the 256-pixel one (the
    384 and 512 ones run the same ops on larger images)."""
    traced = [
        e
        for e in ENTRIES
        if e.kind == "torch"
        and e.trace is not None
        and e.trace.op_names
        and e.workload not in ("act_2cam_384", "act_2cam_512")
    ]
    smallest: dict[tuple[str, str], TruthEntry] = {}
    for entry in traced:
        key = (entry.device, entry.workload)
        if entry.device == "cpu" or key not in smallest or entry.batch < smallest[key].batch:
            smallest[key if entry.device != "cpu" else (entry.device, entry.name)] = entry
    return sorted(smallest.values(), key=lambda e: e.name)


DIFFABLE = _diffable()


@pytest.mark.parametrize("entry", params(DIFFABLE, "the corpus holds no trace to diff"))
def test_gpu_truth_every_difference_from_the_real_requests_is_named(entry: TruthEntry) -> None:
    if entry.device == "cpu" and (why := cpu_kernels_differ(entry)):
        pytest.skip(why)
    bench = _bench()
    diffs = diff_requests(
        bench.real_requests(entry),
        bench.traced_requests(entry),
        device=entry.device,
        workspaces=bench.workspaces(entry),
    )
    peak = max(v for v in entry.peaks.values() if v)
    unexplained = [d for d in diffs if d.cause == "unexplained"]
    # Allocations outside every op that match nothing traced: a few small ones at most
    # (the autograd engine's own between ops), never a share of the peak.
    assert sum(d.nbytes for d in unexplained) <= max(64 * 1024, 0.005 * peak), unexplained
    assert all(d.cause and d.side in ("real", "traced", "both") for d in diffs)


# --- (c) the estimator against the real peaks --------------------------------------------------


def test_gpu_truth_estimates_meet_the_goals_on_the_cpu_corpus() -> None:
    entries = [e for e in ENTRIES if e.device == "cpu" and e.kind == "torch"]
    usable = [e for e in entries if not cpu_kernels_differ(e)]
    if not usable:
        pytest.skip("every CPU entry was captured on another instruction set")
    rows = []
    for entry in usable:
        real = entry.peaks.get("cpu_peak")
        assert real, entry.name
        rows.append((entry.name, real, prediction(entry.name)["exact_peak"]))
    goals(rows, mean_goal=0.03, worst_goal=0.08)
