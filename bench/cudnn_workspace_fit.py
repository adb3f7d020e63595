"""Fit cuDNN's convolution workspaces on the calibration half of the CUDA GPU truth corpus.

For every CUDA PyTorch entry of ``tests/data/gpu_truth/`` that runs convolutions, the real
allocator trace names the op of each allocation. Within each run of consecutive
allocations tagged ``aten.convolution`` or ``aten.convolution_backward``, the allocations
freed inside the run are cuDNN's workspaces (``run_conv_plan`` allocates the plan's
workspace and frees it after the kernel), the ones kept are the op's outputs. The same
workload traced on this machine's CPU gives the shapes of each call in the same order
(checked: the counts must agree, else the entry is left out and said so). Each kernel's
workspace is divided by ``x + y + w`` bytes (its input, output and filter), and the ratios
are summarised per kernel (forward, backward data, backward filter).

The split is deterministic: within each workload the entries sorted by batch size
alternate, calibration first (``act_2cam_256@4`` calibration, ``@8`` validation, ``@16``
calibration; a workload with one entry is calibration). The factor the estimator uses
(``memfit.estimate.torch._cuda_conv.FITTED``) is the calibration kernels' 75th percentile, its
band their 5th and 95th; the validation half is reported on its own.

    python bench/cudnn_workspace_fit.py     # writes bench/out/cudnn_workspace_fit.{json,md}
"""

from __future__ import annotations

import datetime as dt
import math
import platform
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "shared"))
from _common import write_results  # noqa: E402

CORPUS = HERE.parent / "tests" / "data" / "gpu_truth"
KINDS = ("forward", "backward_data", "backward_filter")
#: Workspaces below this are cuDNN's small scratch (semaphores, a bias reduction), not an
#: engine's workspace.
SMALL = 65_536


def split(names: list[str]) -> tuple[set[str], set[str]]:
    """``(calibration, validation)``: alternating within each workload by batch size."""

    def key(name: str) -> tuple[str, int]:
        workload, _, batch = name.partition("@")
        return workload, int(batch)

    by_workload: dict[str, list[str]] = defaultdict(list)
    for name in names:
        by_workload[key(name)[0]].append(name)
    calibration: set[str] = set()
    for entries in by_workload.values():
        for i, name in enumerate(sorted(entries, key=key)):
            if i % 2 == 0:
                calibration.add(name)
    return calibration, set(names) - calibration


def real_conv_calls(entry: Any) -> list[tuple[list[int], list[int]]]:
    """``(kept sizes, workspace sizes)`` per convolution call of a real trace, in order."""
    runs: list[tuple[str | None, list[Any]]] = []
    for ev in entry.trace.events():
        if ev.action not in ("alloc", "free_completed", "free_requested"):
            continue
        if not runs or ev.op != runs[-1][0]:
            runs.append((ev.op, []))
        runs[-1][1].append(ev)
    out = []
    for op, events in runs:
        if not op or "convolution" not in op:
            continue
        live: dict[int, int] = {}
        order: list[int] = []
        freed: list[int] = []
        for ev in events:
            if ev.action == "alloc":
                live[ev.addr] = ev.size
                order.append(ev.addr)
            elif ev.action == "free_completed" and ev.addr in live:
                freed.append(live.pop(ev.addr))
        kept = [live[a] for a in order if a in live]
        if kept:
            out.append((kept, freed))
    return out


def traced_conv_calls(entry: Any) -> list[dict[str, Any]]:
    """The shapes of each convolution call of the workload traced on this CPU."""
    import gpu_truth

    import memfit.estimate.torch._cuda_kernels as kernels

    calls: list[dict[str, Any]] = []
    original = kernels.conv_workspace

    def record(name: str, args: tuple[Any, ...], out: Any, **kw: Any) -> Any:
        def nbytes(t: Any) -> int:
            return int(math.prod(t.shape)) * int(t.element_size())

        if name == "aten.convolution.default":
            y = out[0] if isinstance(out, (tuple, list)) else out
            calls.append({"x": nbytes(args[0]), "w": nbytes(args[1]), "y": nbytes(y), "mask": None})
        else:
            calls.append(
                {
                    "x": nbytes(args[1]),
                    "w": nbytes(args[2]),
                    "y": nbytes(args[0]),
                    "mask": [bool(m) for m in args[10]],
                }
            )
        return original(name, args, out, **kw)

    kernels.conv_workspace = record  # type: ignore[assignment]
    try:
        gpu_truth.traced_requests(entry)
    finally:
        kernels.conv_workspace = original
    return calls


def ratios(entry: Any) -> dict[str, list[float]] | None:
    """Each kernel's workspace over its ``x + y + w``; ``None`` when the calls do not align."""
    real = real_conv_calls(entry)
    traced = traced_conv_calls(entry)
    if len(real) != len(traced):
        return None
    out: dict[str, list[float]] = {k: [] for k in KINDS}
    for call, (_kept, freed) in zip(traced, real, strict=True):
        base = call["x"] + call["y"] + call["w"]
        ws = [n for n in freed if n >= SMALL]
        if call["mask"] is None:
            out["forward"].append((ws[0] if ws else 0) / base)
            continue
        data, weight = call["mask"][0], call["mask"][1]
        if data and weight:
            if len(ws) >= 2:
                out["backward_data"].append(ws[0] / base)
                out["backward_filter"].append(ws[1] / base)
            elif len(ws) == 1:  # one kernel took none: which one cannot be told
                out["backward_data"].append(ws[0] / base)
        elif weight:
            out["backward_filter"].append((ws[0] if ws else 0) / base)
        elif data:
            out["backward_data"].append((ws[0] if ws else 0) / base)
    return out


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(values: list[float]) -> dict[str, float]:
    return {
        "kernels": len(values),
        "p05": quantile(values, 0.05),
        "p50": quantile(values, 0.5),
        "p75": quantile(values, 0.75),
        "p90": quantile(values, 0.9),
        "p95": quantile(values, 0.95),
        "max": max(values),
        "none": sum(1 for v in values if v == 0) / len(values),
    }


def main() -> int:
    from truth_corpus import load_corpus

    from memfit.estimate.torch._cuda_conv import FITTED

    entries = [
        e
        for e in load_corpus(CORPUS)
        if e.device == "cuda" and e.kind == "torch" and e.trace is not None
        and any(op and "convolution" in op for op in e.trace.op_names)
    ]  # fmt: skip
    calibration, validation = split([e.name for e in entries])
    halves: dict[str, dict[str, list[float]]] = {
        "calibration": {k: [] for k in KINDS},
        "validation": {k: [] for k in KINDS},
    }
    skipped = []
    for entry in entries:
        got = ratios(entry)
        if got is None:
            skipped.append(entry.name)
            continue
        half = "calibration" if entry.name in calibration else "validation"
        for kind in KINDS:
            halves[half][kind].extend(got[kind])
        print(entry.name, half, {k: len(v) for k, v in got.items()}, flush=True)
    table = {h: {k: summary(v) for k, v in kinds.items() if v} for h, kinds in halves.items()}
    lines = [
        "| half | kernel | kernels | none | p05 | p50 | p75 | p90 | p95 | max "
        "| FITTED (factor, low, high) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for half, kinds in table.items():
        for kind, s in kinds.items():
            lines.append(
                f"| {half} | {kind} | {s['kernels']} | {100 * s['none']:.0f}% | {s['p05']:.3f} | "
                f"{s['p50']:.3f} | {s['p75']:.3f} | {s['p90']:.3f} | {s['p95']:.3f} | "
                f"{s['max']:.3f} | "
                f"{FITTED[kind] if half == 'calibration' else '-'} |"
            )
    lines.append(
        f"\ncalibration: {', '.join(sorted(calibration))}\n\nvalidation: "
        f"{', '.join(sorted(validation))}\n\nleft out (calls did not align): "
        f"{', '.join(skipped) or 'none'}"
    )
    markdown = "\n".join(lines) + "\n"
    meta = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()}",
        "command": "python bench/cudnn_workspace_fit.py",
    }
    write_results("cudnn_workspace_fit", {"meta": meta, "table": table}, markdown)
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
