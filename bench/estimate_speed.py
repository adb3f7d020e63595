"""Speed and footprint of ``estimate_torch``: ResNet-18-like + Adam at batch 64 (with and
without measuring kernel scratch, which runs each distinct convolution once for real), and a
model whose predicted peak is far beyond this machine's memory.

Each case runs in a fresh subprocess so its peak RSS is its own. Writes
``bench/out/estimate_speed.json`` and ``.md`` and prints the table.

    python bench/estimate_speed.py
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"
sys.path.insert(0, str(HERE))

CASES = {
    "resnet18_224_adam_b64": 64,
    "resnet18_224_adam_b64_no_scratch": 64,  # kernel_scratch=False: the trace alone
    "linear_100k_adam_b8": 8,
}


def _case(name: str) -> dict[str, Any]:
    import estimate_workloads as W
    import torch

    from memfit.estimate.torch.trace import estimate_torch

    if name.startswith("resnet18_224_adam_b64"):
        step = W.make_resnet18(224)
        build, fn, make = step.build, step.step, step.make_batch
    else:

        def build() -> tuple[Any, Any]:
            model = torch.nn.Linear(100_000, 100_000)
            return model, torch.optim.Adam(model.parameters())

        def fn(model: Any, opt: Any, batch: Any) -> None:
            model(batch).sum().backward()
            opt.step()

        def make(b: int) -> Any:
            return torch.randn(b, 100_000)

    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = time.perf_counter()
    est = estimate_torch(build, fn, make, [CASES[name]], kernel_scratch="no_scratch" not in name)
    seconds = time.perf_counter() - start
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    point = est.points[0]
    return {
        "case": name,
        "seconds": seconds,
        "predicted_allocated_peak": point.allocated_peak,
        "peak_rss_bytes": rss_after,
        "rss_growth_bytes": rss_after - rss_before,
        "allocations": point.num_allocations,
    }


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(json.dumps(_case(sys.argv[2])))
        return 0
    rows = []
    for name in CASES:
        proc = subprocess.run(
            [sys.executable, __file__, "--child", name], capture_output=True, text=True, check=True
        )
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    lines = [
        "| case | trace time s | predicted allocated peak GiB | estimator peak RSS MiB | "
        "RSS growth during trace MiB |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['seconds']:.2f} | {r['predicted_allocated_peak'] / 2**30:.2f} | "
            f"{r['peak_rss_bytes'] / 2**20:.0f} | {r['rss_growth_bytes'] / 2**20:.0f} |"
        )
    markdown = "\n".join(lines) + "\n"
    meta = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} CPUs",
        "command": "python bench/estimate_speed.py",
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "estimate_speed.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    (OUT / "estimate_speed.md").write_text(markdown)
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
