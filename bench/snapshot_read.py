"""How fast, and in how much memory, memfit reads a large CUDA snapshot (issue 34).

Builds a valid trace of about 7.7 million events (about 200 MB pickled, as
``torch.cuda.memory._dump_snapshot`` writes it: ``pickle.dump``, protocol 4) with
``memfit.allocator.snapshot_build.TraceBuilder``: a warm-up step, then the same step again
and again (each allocates 128 blocks of 16 sizes and frees them, so every step after the
first replays the same addresses from the allocator's cache and the trace stays valid), then
reads it with ``memfit.allocator.snapshot.load_snapshot`` in a fresh process at 1/8, 1/4,
1/2 and the whole size, each timed (CPU time as well as wall time, which other work on a
shared machine stretches) and its peak resident memory measured (``VmHWM``), so the time
and memory per event show whether they stay linear.
For comparison, the smallest file is also read the way memfit read pickles before
(``pickle.load`` with globals refused, then the conversion of the dicts).

    python bench/snapshot_read.py                    # about 15 minutes on 2 cores
    python bench/snapshot_read.py --events 1000000   # a smaller run

Writes ``bench/out/snapshot_read.json`` and ``.md`` and prints the markdown table.
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


def child(path: str, how: str) -> None:
    """Read ``path`` and print what it cost as one JSON line (run in a fresh process)."""
    import gc

    from memfit.allocator.snapshot import load_snapshot, snapshot_from_data

    gc.collect()
    before = _rss_now()
    start_usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu_before = start_usage.ru_utime + start_usage.ru_stime
    started = time.perf_counter()
    if how == "memfit":
        ticks: list[float] = []
        snap = load_snapshot(path, progress=lambda done, total: ticks.append(done / total))
    else:  # the reader before issue 34: pickle.load with globals refused, then the dicts
        with open(path, "rb") as handle:
            data = pickle.load(handle)
        snap = snapshot_from_data(data, kind="pickle")
        ticks = []
    seconds = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_SELF)
    peak = _peak_rss()
    events = sum(len(d.trace) for d in snap.devices)
    print(
        json.dumps(
            {
                "seconds": seconds,
                "cpu_seconds": usage.ru_utime + usage.ru_stime - cpu_before,
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


def measure(path: Path, how: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(path), "--how", how],
        check=True,
        capture_output=True,
        text=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=EVENTS)
    parser.add_argument("--child")
    parser.add_argument("--how", default="memfit")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.how)
        return
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for fraction in (8, 4, 2, 1):
            count = args.events // fraction
            data = build(count)
            path = Path(tmp) / f"trace_{count}.pickle"
            with open(path, "wb") as handle:
                pickle.dump(data, handle, protocol=4)
            del data
            size = path.stat().st_size
            for how in ("memfit", "pickle.load") if fraction == 8 else ("memfit",):
                got = measure(path, how)
                got.update(reader=how, file_bytes=size)
                rows.append(got)
                print(json.dumps(got), flush=True)
            path.unlink()
    lines = [
        "| reader | events | file | wall s | CPU s | CPU us / event | peak RSS | RSS added "
        "| bytes / event |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        added = r["peak_rss_bytes"] - r["rss_before_bytes"]
        lines.append(
            f"| {r['reader']} | {r['events']:,} | {r['file_bytes'] / MiB:,.0f} MiB "
            f"| {r['seconds']:.1f} | {r['cpu_seconds']:.1f} "
            f"| {1e6 * r['cpu_seconds'] / r['events']:.2f} "
            f"| {r['peak_rss_bytes'] / MiB:,.0f} MiB | {added / MiB:,.0f} MiB "
            f"| {added / r['events']:.0f} |"
        )
    markdown = (
        f"{utc_minute()}, {platform.machine()}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs; command: `python bench/snapshot_read.py"
        + (f" --events {args.events}" if args.events != EVENTS else "")
        + "`\n\n"
        + "\n".join(lines)
        + "\n"
    )
    write_results("snapshot_read", {"rows": rows}, markdown)
    print(markdown)


if __name__ == "__main__":
    main()
