"""What ``memfit.simulate_gpu``'s allocator history costs (issue 20).

Under ``simulate_gpu`` on the CPU every new storage is counted; with ``history`` on (the
default) each one also records its Python frames for the snapshot a Recorder's OOM dump
writes. This runs forward and backward of a small MLP (8 layers of 64, batch 32; many small
operations, the worst case) 200 times, with ``history=0`` and with the default, alternating,
and reports the best CPU time of each over several rounds.

    python bench/simulate_history_cost.py

Writes ``bench/out/simulate_history_cost.json`` and ``.md`` and prints the markdown table.
"""

from __future__ import annotations

import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import utc_minute, write_results  # noqa: E402

ROUNDS = 7
STEPS = 200


def main() -> int:
    import torch

    import memfit
    from memfit.runtime.simulate import HISTORY_ENTRIES

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)])
    x = torch.randn(32, 64)

    def run(history: int) -> float:
        start = time.process_time()
        with memfit.simulate_gpu("1GiB", history=history):
            for _ in range(STEPS):
                model(x).sum().backward()
        return time.process_time() - start

    run(0)  # warm up (imports, dispatch caches)
    best = {0: float("inf"), HISTORY_ENTRIES: float("inf")}
    for _ in range(ROUNDS):
        for history in best:
            best[history] = min(best[history], run(history))
    off, on = best[0], best[HISTORY_ENTRIES]
    result = {
        "steps": STEPS,
        "rounds": ROUNDS,
        "cpu_s_history_off": round(off, 3),
        "cpu_s_history_on": round(on, 3),
        "overhead_percent": round(100 * (on - off) / off, 1),
    }
    meta = {
        "date": utc_minute(),
        "machine": f"2-core development VM, shared ({platform.machine()}, "
        f"Python {platform.python_version()}, torch {torch.__version__})",
        "command": "python bench/simulate_history_cost.py",
    }
    md = (
        f"{meta['date']}, {meta['machine']}, `{meta['command']}`\n\n"
        "| workload | history=0 | history on (default) | cost |\n|---|---|---|---|\n"
        f"| MLP 8x64, batch 32, forward+backward x {STEPS} (best CPU time of {ROUNDS}) | "
        f"{off:.3f} s | {on:.3f} s | +{result['overhead_percent']}% |\n"
    )
    write_results("simulate_history_cost", {"meta": meta, "result": result}, md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
