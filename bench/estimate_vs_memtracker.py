"""The estimator's cost against PyTorch's own MemTracker under FakeTensorMode, and against
running the real step (issue 23: "keep it so").

Models are built from their ``transformers`` config classes (no weights downloaded), trained
with AdamW on their own loss (``bench/estimate_third_party.py``): GPT-2 small, medium and
large and BERT-large, at sequence length ``--seq``. For each model, in a fresh process each:

* **memfit**: ``estimate_torch(build, step, make_batch, [batch], device="cpu",
  kernel_scratch=False)`` (two steps traced with fake tensors, the allocator replayed); its
  ``exact_peak`` (exact storage sizes, as MemTracker counts them) is compared, and its
  ``allocated_peak`` (blocks as the caching allocator rounds them) recorded beside it;
* **MemTracker**: ``torch.distributed._tools.mem_tracker.MemTracker`` with the model and
  optimizer built under ``FakeTensorMode``, ``track_external(model, opt)``, the same two steps
  inside ``with tracker:``, its ``"peak"`` snapshot;
* **real step** (``--real``, models whose real step fits ``--real-max-gib``): the same two
  steps on real CPU tensors.

Each row gives CPU seconds (``time.process_time`` of the call) and the process's peak RSS.
Figures derived: memfit's CPU time as a fraction of MemTracker's and of the real step's;
both peaks and their difference; the growth of CPU time with the parameter count (the
exponent of a least-squares line through ``log cpu`` against ``log parameters``); memfit's
CPU time over batch sizes (``--batches``) for GPT-2 small.

What issue 23 asks to keep (measured before): memfit 0.11-0.26x of MemTracker's CPU time, the
same peaks to 0.1 MiB, growth N^0.56 against MemTracker's N^1.03, flat in batch size,
0.06-0.11x of the real step, 400-455 MiB of RSS whatever the model.

Writes ``bench/out/estimate_vs_memtracker.json`` and ``.md`` and prints the table.
Run: ``python bench/estimate_vs_memtracker.py`` (several minutes: MemTracker on GPT-2 large
is the slow part); ``--models gpt2_small,gpt2_medium`` for fewer.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import utc_minute, write_results  # noqa: E402

#: name -> (builder, layers, width, vocab)
MODELS: dict[str, tuple[str, int, int, int]] = {
    "gpt2_small": ("gpt2", 12, 768, 50257),
    "gpt2_medium": ("gpt2", 24, 1024, 50257),
    "gpt2_large": ("gpt2", 36, 1280, 50257),
    "bert_large": ("bert", 24, 1024, 30522),
}

#: The figures issue 23 recorded, which a change should not lose.
KEEP = {
    "memtracker_fraction": (0.11, 0.26),
    "real_fraction": (0.06, 0.11),
    "memfit_exponent": 0.56,
    "memtracker_exponent": 1.03,
    "rss_mib": (400, 455),
}


def _step(model: str, seq: int) -> Any:
    import estimate_third_party as third

    kind, layers, width, vocab = MODELS[model]
    make = third.make_gpt2 if kind == "gpt2" else third.make_bert
    return make(layers=layers, dim=width, seq=seq, vocab=vocab)


def _params(model: str) -> int:
    _kind, layers, width, vocab = MODELS[model]
    # embeddings + blocks (attention 4 w^2, MLP 8 w^2, biases and norms ~13 w): a close
    # count for the exponent's x axis, which only needs ratios
    return vocab * width + layers * (12 * width * width + 13 * width)


def child(tool: str, model: str, batch: int, seq: int) -> dict[str, Any]:
    """One measurement in this (fresh) process."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from memfit.estimate.torch.trace import estimate_torch

    torch.manual_seed(0)
    step = _step(model, seq)
    peak: int | None = None
    extra: dict[str, int] = {}
    start = time.process_time()  # the imports above are not timed, for every tool alike
    if tool == "memfit":
        est = estimate_torch(
            step.build, step.step, step.make_batch, [batch], device="cpu", kernel_scratch=False
        )
        point = est.points[0]
        peak = int(point.exact_peak)  # exact storage sizes: what MemTracker counts on a CPU
        extra = {"allocated_peak_bytes": int(point.allocated_peak)}
    elif tool == "memtracker":
        with FakeTensorMode():
            net, opt = step.build()
            tracker = MemTracker()
            tracker.track_external(net, opt)
            with tracker:
                for _ in range(2):
                    step.step(net, opt, step.make_batch(batch))
                    tracker.reset_mod_stats()  # its module stats hold one iteration only
            snapshot = tracker.get_tracker_snapshot("peak")
            peak = max(int(per["Total"]) for per in snapshot.values())
    else:
        net, opt = step.build()
        for _ in range(2):
            step.step(net, opt, step.make_batch(batch))
    cpu = time.process_time() - start
    return {
        "tool": tool,
        "model": model,
        "batch": batch,
        "seq": seq,
        "cpu_s": cpu,
        "peak_bytes": peak,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        **extra,
    }


def _run(tool: str, model: str, batch: int, seq: int) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, __file__, "--child", tool, model, str(batch), "--seq", str(seq)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        return {"tool": tool, "model": model, "batch": batch, "error": proc.stderr[-2000:]}
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def _exponent(xs: list[float], ys: list[float]) -> float | None:
    """Slope of the least-squares line through (log x, log y)."""
    if len(xs) < 2:
        return None
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    den = sum((x - mx) ** 2 for x in lx)
    return sum((x - mx) * (y - my) for x, y in zip(lx, ly, strict=True)) / den if den else None


def run(models: list[str], batch: int, seq: int, batches: list[int], real: bool,
        real_max_gib: float) -> dict[str, Any]:  # fmt: skip
    rows = []
    for model in models:
        for tool in ("memfit", "memtracker"):
            rows.append(_run(tool, model, batch, seq))
        # params + grads + two AdamW states, fp32: what the real step needs at least
        if real and _params(model) * 16 / 2**30 <= real_max_gib:
            rows.append(_run("real", model, batch, seq))
    sweep = [_run("memfit", models[0], b, seq) for b in batches if b != batch]
    ok = [r for r in rows if "error" not in r]
    by = {(r["tool"], r["model"]): r for r in ok}
    derived = []
    for model in models:
        m, t, r = by.get(("memfit", model)), by.get(("memtracker", model)), by.get(("real", model))
        if m is None:
            continue
        derived.append(
            {
                "model": model,
                "parameters": _params(model),
                "memfit_cpu_s": m["cpu_s"],
                "memtracker_cpu_s": t["cpu_s"] if t else None,
                "real_cpu_s": r["cpu_s"] if r else None,
                "memtracker_fraction": m["cpu_s"] / t["cpu_s"] if t else None,
                "real_fraction": m["cpu_s"] / r["cpu_s"] if r else None,
                "memfit_peak_mib": m["peak_bytes"] / 2**20,
                "memfit_allocated_peak_mib": m.get("allocated_peak_bytes", 0) / 2**20,
                "memtracker_peak_mib": t["peak_bytes"] / 2**20 if t else None,
                "memfit_rss_mib": m["peak_rss_mib"],
            }
        )
    with_t = [d for d in derived if d["memtracker_cpu_s"]]
    flat = [by_b for by_b in [by.get(("memfit", models[0])), *sweep] if by_b and "cpu_s" in by_b]
    return {
        "benchmark": "estimate_vs_memtracker",
        "date": utc_minute(),
        "machine": f"{platform.platform()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}",
        "command": "python bench/estimate_vs_memtracker.py " + " ".join(sys.argv[1:]),
        "batch": batch,
        "seq": seq,
        "rows": rows + sweep,
        "derived": derived,
        "memfit_exponent": _exponent(
            [d["parameters"] for d in derived], [d["memfit_cpu_s"] for d in derived]
        ),
        "memtracker_exponent": _exponent(
            [d["parameters"] for d in with_t], [d["memtracker_cpu_s"] for d in with_t]
        ),
        "batch_sweep": sorted((r["batch"], r["cpu_s"]) for r in flat),
        "keep": KEEP,
    }


def markdown(res: dict[str, Any]) -> str:
    def f(x: float | None, fmt: str) -> str:
        return "n/a" if x is None else format(x, fmt)

    lines = [
        f"Estimator against MemTracker, {res['date']}, {res['machine']}; `{res['command']}` "
        f"(batch {res['batch']}, sequence {res['seq']}, AdamW, 2 steps).",
        "",
        "| model | parameters | memfit CPU | MemTracker CPU | memfit / MemTracker | real step "
        "CPU | memfit / real | memfit exact peak MiB | MemTracker peak MiB | memfit allocated "
        "peak MiB | memfit RSS MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for d in res["derived"]:
        lines.append(
            f"| {d['model']} | {d['parameters'] / 1e6:.0f}M | {d['memfit_cpu_s']:.1f} s | "
            f"{f(d['memtracker_cpu_s'], '.1f')} s | {f(d['memtracker_fraction'], '.2f')}x | "
            f"{f(d['real_cpu_s'], '.1f')} s | {f(d['real_fraction'], '.2f')}x | "
            f"{d['memfit_peak_mib']:.1f} | {f(d['memtracker_peak_mib'], '.1f')} | "
            f"{d['memfit_allocated_peak_mib']:.1f} | {d['memfit_rss_mib']:.0f} |"
        )
    errors = [r for r in res["rows"] if "error" in r]
    sweep = ", ".join(f"batch {b}: {c:.1f} s" for b, c in res["batch_sweep"])
    lines += [
        "",
        f"CPU time grows with parameters as N^{f(res['memfit_exponent'], '.2f')} (memfit) and "
        f"N^{f(res['memtracker_exponent'], '.2f')} (MemTracker); memfit over batch sizes "
        f"({res['derived'][0]['model'] if res['derived'] else '-'}): {sweep}.",
        f"Issue 23's figures to keep: {json.dumps(res['keep'])}.",
    ]
    lines += [f"- {r['tool']} {r['model']} failed: {r['error'][-300:]!r}" for r in errors]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batches", default="1,2,4,8", help="memfit's batch sweep")
    parser.add_argument("--real", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--real-max-gib", type=float, default=3.0,
                        help="run the real step only for models whose state fits this")  # fmt: skip
    parser.add_argument("--child", nargs=3, metavar=("TOOL", "MODEL", "BATCH"),
                        help=argparse.SUPPRESS)  # fmt: skip
    args = parser.parse_args(argv)
    if args.child:
        tool, model, batch = args.child
        sys.stdout.write(json.dumps(child(tool, model, int(batch), args.seq)) + "\n")
        return 0
    res = run(
        args.models.split(","), args.batch, args.seq,
        [int(b) for b in args.batches.split(",") if b], args.real, args.real_max_gib,
    )  # fmt: skip
    text = markdown(res)
    write_results("estimate_vs_memtracker", res, text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
