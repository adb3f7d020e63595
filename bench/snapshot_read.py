"""How fast, and in how much memory, memfit reads a large CUDA snapshot (issues 34, 45).

Builds a valid trace of about 7.7 million events (about 200 MB pickled, as
``torch.cuda.memory._dump_snapshot`` writes it: ``pickle.dump``, protocol 4) with
``memfit.allocator.snapshot_build.TraceBuilder``: a warm-up step, then the same step again
and again (each allocates 128 blocks of 16 sizes and frees them, so every step after the
first replays the same addresses from the allocator's cache and the trace stays valid), then
reads it with ``memfit.allocator.snapshot.load_snapshot`` in a fresh process at 1/8, 1/4,
1/2 and the whole size, each timed (CPU time, ``time.process_time``, as well as wall time,
which other work on a shared machine stretches) and its peak resident memory measured
(``VmHWM``), so the time and memory per event show whether they stay linear.

Two layouts: ``plain`` (the events of issue 34's benchmark and of the issue 45 report:
action, address, size, stream; 31 bytes an event) and ``torch`` (what a recording with
stacks writes: a ``time_us`` and a new ``frames`` list of 3 to 8 shared frame dicts on every
event, ``free_completed`` sharing its ``free_requested``'s list; about 70 bytes an event, so
about 3 million events make 200 MB). For comparison, the smallest plain file is also read
the way memfit read pickles before issue 34 (``pickle.load`` with globals refused, then the
conversion of the dicts), and ``--src DIR --label NAME`` reads with another checkout's
``src`` (the reader before a change).

    python bench/snapshot_read.py                    # about 10 minutes on 2 busy cores
    python bench/snapshot_read.py --events 1000000   # a smaller run
    python bench/snapshot_read.py --only 7700000 --src /tmp/old/src --label before

Writes ``bench/out/snapshot_read.json`` and ``.md`` (``snapshot_read_<label>`` with
``--label``) and prints the markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import utc_minute, write_results  # noqa: E402

MiB = 2**20
EVENTS = 7_700_000
TORCH_EVENTS = 3_000_000
SIZES = [(1 + (i * 7) % 16) * 64 * 1024 for i in range(128)]  # 64 KiB .. 1 MiB


def build(events: int) -> dict[str, Any]:
    """A valid snapshot of about ``events`` events: a warm-up step, then one steady step
    repeated (its event dicts copied, as a real trace holds a dict per event)."""
    from memfit.allocator.snapshot_build import TraceBuilder

    builder = TraceBuilder()
    for _ in range(2):  # the first step takes its segments; the second is the steady one
        start = len(builder.events)
        handles = [builder.malloc(size) for size in SIZES]
        for handle in handles:
            builder.free(handle)
    steady = builder.events[start:]
    data = builder.snapshot()
    trace = data["device_traces"][0]
    while len(trace) < events:
        trace.extend(dict(e) for e in steady)
    return data


def add_stacks(data: dict[str, Any]) -> None:
    """Give every event a ``time_us`` and a ``frames`` list as ``_snapshot()`` does with
    stacks recorded: frame dicts shared by the whole snapshot, a new list per event (one
    per captured context), a ``free_completed`` sharing its ``free_requested``'s."""
    pool = [
        {"filename": f"/work/model/layer{i % 24}.py", "line": 10 + i, "name": f"forward_{i}"}
        for i in range(96)
    ]
    stacks = [[(7 * s + j) % 96 for j in range(3 + s % 6)] for s in range(512)]
    time_us = 1_764_000_000_000_000
    last: list[dict[str, Any]] = []
    for i, event in enumerate(data["device_traces"][0]):
        time_us += 1 + i % 7
        event["time_us"] = time_us
        if event["action"] != "free_completed":
            last = [pool[j] for j in stacks[(i * 31) % 512]]
        event["frames"] = last


def child(path: str, how: str) -> None:
    """Read ``path`` and print what it cost as one JSON line (run in a fresh process)."""
    import gc

    from memfit.allocator.snapshot import load_snapshot, snapshot_from_data

    gc.collect()
    before = _rss_now()
    start_usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu_before = start_usage.ru_utime + start_usage.ru_stime
    started = time.perf_counter()
    cpu_started = time.process_time()
    if how == "memfit":
        ticks: list[float] = []
        snap = load_snapshot(path, progress=lambda done, total: ticks.append(done / total))
    else:  # the reader before issue 34: pickle.load with globals refused, then the dicts
        with open(path, "rb") as handle:
            data = pickle.load(handle)
        snap = snapshot_from_data(data, kind="pickle")
        ticks = []
    seconds = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    usage = resource.getrusage(resource.RUSAGE_SELF)
    peak = _peak_rss()
    events = sum(len(d.trace) for d in snap.devices)
    print(
        json.dumps(
            {
                "seconds": seconds,
                "cpu_seconds": cpu,
                "rusage_cpu_seconds": usage.ru_utime + usage.ru_stime - cpu_before,
                "peak_rss_bytes": peak,
                "rss_before_bytes": before,
                "events": events,
                "progress_calls": len(ticks),
            }
        )
    )


def _peak_rss() -> int:
    """This process's peak resident memory (``VmHWM``: its own, where ``ru_maxrss`` keeps
    the parent's peak at the fork across ``exec``)."""
    with open("/proc/self/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _rss_now() -> int:
    with open("/proc/self/statm", encoding="ascii") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure(path: Path, how: str, src: str | None) -> dict[str, Any]:
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(path), "--how", how],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=EVENTS)
    parser.add_argument("--torch-events", type=int, default=TORCH_EVENTS)
    parser.add_argument("--only", type=int, help="one plain trace of this many events")
    parser.add_argument("--src", help="read with this src directory (PYTHONPATH)")
    parser.add_argument("--label", default="", help="names the output files and rows")
    parser.add_argument("--child")
    parser.add_argument("--how", default="memfit")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.how)
        return
    runs: list[tuple[str, int, tuple[str, ...]]] = []
    if args.only:
        runs.append(("plain", args.only, ("memfit",)))
    else:
        for fraction in (8, 4, 2, 1):
            extra = ("pickle.load",) if fraction == 8 else ()
            runs.append(("plain", args.events // fraction, ("memfit", *extra)))
        for fraction in (4, 1):
            runs.append(("torch", args.torch_events // fraction, ("memfit",)))
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for layout, count, hows in runs:
            data = build(count)
            if layout == "torch":
                add_stacks(data)
            path = Path(tmp) / f"trace_{layout}_{count}.pickle"
            with open(path, "wb") as handle:
                pickle.dump(data, handle, protocol=4)
            del data
            size = path.stat().st_size
            for how in hows:
                got = measure(path, how, args.src)
                reader = how if how != "memfit" else ("memfit " + args.label).strip()
                got.update(reader=reader, layout=layout, file_bytes=size)
                rows.append(got)
                print(json.dumps(got), flush=True)
            path.unlink()
    lines = [
        "| reader | layout | events | file | wall s | CPU s | CPU us / event | peak RSS "
        "| RSS added | bytes / event |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        added = r["peak_rss_bytes"] - r["rss_before_bytes"]
        lines.append(
            f"| {r['reader']} | {r['layout']} | {r['events']:,} | {r['file_bytes'] / MiB:,.0f} MiB "
            f"| {r['seconds']:.1f} | {r['cpu_seconds']:.1f} "
            f"| {1e6 * r['cpu_seconds'] / r['events']:.2f} "
            f"| {r['peak_rss_bytes'] / MiB:,.0f} MiB | {added / MiB:,.0f} MiB "
            f"| {added / r['events']:.0f} |"
        )
    command = "python bench/snapshot_read.py" + "".join(
        f" {flag} {value}"
        for flag, value, default in (
            ("--events", args.events, EVENTS),
            ("--torch-events", args.torch_events, TORCH_EVENTS),
            ("--only", args.only, None),
            ("--src", args.src, None),
            ("--label", args.label or None, None),
        )
        if value != default
    )
    markdown = (
        f"{utc_minute()}, {platform.machine()}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs; command: `{command}`\n\n" + "\n".join(lines) + "\n"
    )
    stem = "snapshot_read" + (f"_{args.label}" if args.label else "")
    write_results(stem, {"rows": rows, "command": command}, markdown)
    print(markdown)


if __name__ == "__main__":
    main()
