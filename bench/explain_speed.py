"""How long ``memfit explain`` takes on a large snapshot, and how small its picture stays.

Builds a synthetic snapshot of about 100,000 trace events whose stacks draw on 5,000
distinct frames (``memfit.allocator.snapshot_build.TraceBuilder``: steps that allocate and free
activations, keep a few blocks, and end in an out-of-memory), pickles it as
``_dump_snapshot`` would, then times reading it (the restricted unpickler), the explanation
(every replay included: the recorded settings, expandable segments, two ``max_split_size_mb``,
two ``garbage_collection_threshold``, ``empty_cache`` per step) and the PNG and HTML.

    python bench/explain_speed.py            # about a minute on 2 cores

Writes ``bench/out/explain_speed.json`` and ``.md`` and prints the markdown table.
"""

from __future__ import annotations

import pickle
import platform
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import utc_minute, write_results  # noqa: E402

from memfit.allocator.snapshot import load_snapshot  # noqa: E402
from memfit.allocator.snapshot_build import TraceBuilder  # noqa: E402
from memfit.errors import OutOfMemory  # noqa: E402
from memfit.monitor.explain import explain  # noqa: E402
from memfit.monitor.explain_render import png_bytes, render_html  # noqa: E402

MiB = 2**20
EVENTS = 100_000
FRAMES = 5_000


def build(events: int = EVENTS, frames: int = FRAMES, seed: int = 0) -> dict[str, Any]:
    """A snapshot of about ``events`` events: steps of a model whose activations are freed
    at the end of the step and a few blocks kept, until the 60 GiB limit is met."""
    rng = random.Random(seed)
    pool = [(f"/home/me/project/layer_{i // 50}.py", 10 + i % 50, f"fn_{i}") for i in range(frames)]
    stacks = [tuple(pool[(i * 12 + j) % frames] for j in range(12)) for i in range(frames // 2)]
    builder = TraceBuilder(limit_bytes=60 * 1024 * MiB)
    params = [builder.malloc(rng.choice((4, 16, 64)) * MiB, frames=stacks[0]) for _ in range(200)]
    kept = []
    step = 0
    try:
        while len(builder.events) < events:
            live = []
            for layer in range(120):
                size = rng.choice((MiB // 4, 2 * MiB, 8 * MiB, 24 * MiB + step * 64 * 1024))
                live.append(builder.malloc(size, frames=stacks[(layer * 7 + step) % len(stacks)]))
                if layer % 3 == 2:
                    builder.free(live.pop(rng.randrange(len(live))))
            kept.append(builder.malloc(6 * MiB, frames=stacks[1]))
            for handle in live:
                builder.free(handle)
            step += 1
        while True:  # then run out
            kept.append(builder.malloc(512 * MiB, frames=stacks[2]))
    except OutOfMemory:
        pass
    del params
    return builder.snapshot()


def main() -> int:
    started = time.perf_counter()
    data = build()
    build_s = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "big.pickle"
        path.write_bytes(pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL))
        size = path.stat().st_size
        t0, c0 = time.perf_counter(), time.process_time()
        snap = load_snapshot(path)
        t1, c1 = time.perf_counter(), time.process_time()
        result = explain(snap)
        t2, c2 = time.perf_counter(), time.process_time()
        png = png_bytes(result)
        page = render_html(result)
        t3, c3 = time.perf_counter(), time.process_time()
    dev = snap.device()
    row = {
        "events": len(dev.trace),
        "distinct_frames": len(dev.frames),
        "pickle_bytes": size,
        "read_s": round(t1 - t0, 2),
        "explain_s": round(t2 - t1, 2),
        "picture_s": round(t3 - t2, 2),
        "read_cpu_s": round(c1 - c0, 2),
        "explain_cpu_s": round(c2 - c1, 2),
        "picture_cpu_s": round(c3 - c2, 2),
        "png_bytes": len(png),
        "html_bytes": len(page),
        "timeline_points": len(result.timeline),
        "what_if_replays": len(result.what_if),
        "build_s": round(build_s, 1),
    }
    meta = {
        "date": utc_minute(),
        "machine": f"2-core development VM, shared ({platform.machine()}, "
        f"Python {platform.python_version()})",
        "command": "python bench/explain_speed.py",
    }
    md = (
        f"{meta['date']}, {meta['machine']}, `{meta['command']}`\n\n"
        "| events | distinct frames | pickle | read | explain (all replays) | PNG + HTML "
        "| PNG | HTML | timeline points |\n|---|---|---|---|---|---|---|---|---|\n"
        f"| {row['events']} | {row['distinct_frames']} | {size / MiB:.1f} MiB | "
        f"{row['read_s']} s ({row['read_cpu_s']} s CPU) | {row['explain_s']} s "
        f"({row['explain_cpu_s']} s CPU; {row['what_if_replays']} what-ifs) | "
        f"{row['picture_s']} s ({row['picture_cpu_s']} s CPU) | {len(png) // 1024} KiB | "
        f"{len(page) // 1024} KiB | {row['timeline_points']} |\n\n"
        "Wall-clock times on a machine shared with other jobs; CPU times are the process's.\n"
    )
    write_results("explain_speed", {"meta": meta, "result": row}, md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
