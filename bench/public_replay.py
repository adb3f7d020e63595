"""Replay real CUDA allocator traces and compare with what they recorded, to the byte.

For each snapshot (the reduced public corpus, see :func:`corpus_dir`, and any raw
``_dump_snapshot()`` files given on the command line), on each device with a trace: rebuild
the allocator's state at the first event (``memfit.allocator.replay.start_state``), replay the
trace's requests through ``memfit.allocator.model.AllocatorModel`` with the recorded settings
and the limit the trace implies, and compare the reserved bytes after every allocation and
free, the reserved peak and the number of segments with the trace's own segment events.

    python bench/public_replay.py [RAW.pickle ...]

Writes ``bench/out/public_replay.json`` and ``.md`` and prints the markdown table.
"""

from __future__ import annotations

import platform
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
# the corpus's location lives with the tests' shared support code
sys.path.insert(0, str(HERE.parent / "tests" / "shared"))

from _common import utc_minute, write_results  # noqa: E402
from public_snapshots import corpus_dir  # noqa: E402

from memfit.allocator.replay import implied_limit, recorded_curve, replay, start_state  # noqa: E402
from memfit.allocator.snapshot import load_snapshot  # noqa: E402
from memfit.errors import ConfigError  # noqa: E402

CORPUS = corpus_dir()
MiB = 2**20


def replay_one(path: Path) -> list[dict[str, Any]]:
    snap = load_snapshot(path)
    source = str(snap.meta.get("source", "")).replace("https://github.com/", "") or "(raw file)"
    rows = []
    for dev in snap.devices:
        if not dev.trace:
            continue
        row: dict[str, Any] = {
            "trace": path.name.split(".")[0],
            "device": dev.device,
            "source": source,
            "licence": snap.meta.get("licence"),
            "events": len(dev.trace),
            "frees": sum(e.action == "free_completed" for e in dev.trace),
            "streams": len({e.stream for e in dev.trace}),
        }
        start = start_state(dev)
        recorded = recorded_curve(dev, start)
        row["recorded_peak"] = max([start.reserved_bytes, *recorded])
        if not start.exact:
            row["excluded"] = "expandable segments, recorded mid-run: pages not rebuilt"
            rows.append(row)
            continue
        limit = implied_limit(dev, start)
        got = replay(
            dev,
            start=start,
            limit_bytes=limit.bytes,
            max_split_size=snap.max_split_size,
            expandable_segments=snap.expandable_segments,
        )
        checked = [i for i, e in enumerate(dev.trace) if e.action in ("alloc", "free_completed")]
        row["replayed_peak"] = got.peak_reserved
        row["bytes_off"] = max((abs(recorded[i] - got.reserved[i]) for i in checked), default=0)
        row["points_compared"] = len(checked)
        if snap.expandable_segments:  # maps and unmaps of pages, not segments
            row["segments_recorded"] = row["segments_replayed"] = None
        else:
            row["segments_recorded"] = sum(e.action == "segment_alloc" for e in dev.trace)
            row["segments_replayed"] = got.segments
        row["limit_met"] = limit.high is not None
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    stored = sorted(CORPUS.glob("*.json.gz")) if CORPUS is not None else []
    paths = stored + [Path(a) for a in (argv or sys.argv[1:])]
    rows: list[dict[str, Any]] = []
    for path in paths:
        try:
            rows.extend(replay_one(path))
        except ConfigError as exc:
            rows.append({"trace": path.name, "error": exc.message})
    meta = {
        "date": utc_minute(),
        "machine": f"2-core development VM, shared ({platform.machine()}, "
        f"Python {platform.python_version()})",
        "command": "python bench/public_replay.py "
        + " ".join(str(a) for a in (argv or sys.argv[1:])),
    }
    lines = [
        f"{meta['date']}, {meta['machine']}",
        "",
        "| trace | source | events | frees | reserved peak recorded | replayed | bytes off "
        "| segments recorded / replayed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['trace']} | error: {r['error']} | | | | | | |")
            continue
        name = r["trace"] + (f" (device {r['device']})" if r["device"] else "")
        peak = f"{r['recorded_peak'] / MiB:,.0f} MiB"
        if "excluded" in r:
            lines.append(
                f"| {name} | {r['source']} | {r['events']} | {r['frees']} | {peak} | "
                f"excluded: {r['excluded']} | | |"
            )
            continue
        segments = (
            "(expandable)"
            if r["segments_recorded"] is None
            else f"{r['segments_recorded']} / {r['segments_replayed']}"
        )
        lines.append(
            f"| {name} | {r['source']} | {r['events']} | {r['frees']} | {peak} | "
            f"{r['replayed_peak'] / MiB:,.0f} MiB | {r['bytes_off']:,} | {segments} |"
        )
    md = "\n".join(lines) + "\n"
    write_results("public_replay", {"meta": meta, "rows": rows}, md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
