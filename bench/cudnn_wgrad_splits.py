"""cuDNN's backward-filter workspaces in the H100 corpus as split-K reductions, and what a
shape-class rule for them would do to the estimates.

Part 1 (always): for each backward-filter kernel of the DQN entries (every convolution
backward of a trace, aligned with the same workload traced on this CPU as
``bench/cudnn_workspace_fit.py`` does), its workspace in float32 copies of the filter's
gradient: ``copies = (workspace - t) / (4 * numel(w))`` with ``t`` none or the NHWC input
and output (``x + y``); a whole number is a split-K engine (each split writes its own
partial gradient). A kernel whose call took a single workspace has it attributed by that
test (``bench/cudnn_workspace_fit.py`` attributes it to backward-data).

Part 2 (``--rule FACTOR``): the estimates of every convolution entry with one rule added
for the shape class the brief of issue 48 asks about, a large ``N*P*Q`` against a small
filter (filter bytes under ``--small`` of ``x + y``, ``N*P*Q`` at least ``--min-npq``): the
backward-filter workspace of that class taken at ``FACTOR x (x + y + w)`` (9.16 is what
dqn_cnn_84@512 takes), every other kernel as fitted.

    python bench/cudnn_wgrad_splits.py                 # part 1
    python bench/cudnn_wgrad_splits.py --rule 9.16     # part 1 and part 2
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import math
import platform
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "shared"))
from _common import write_results  # noqa: E402

CORPUS = HERE.parent / "tests" / "data" / "gpu_truth"
MiB = 2**20


def _nbytes(t: Any) -> int:
    return int(math.prod(t.shape)) * int(t.element_size())


def _backward_calls(entry: Any) -> list[dict[str, Any]]:
    """The shapes of each ``convolution_backward`` that computes the filter's gradient."""
    import gpu_truth_replay

    import memfit.estimate.torch._cuda_kernels as kernels

    calls: list[dict[str, Any]] = []
    original = kernels.conv_workspace

    def record(name: str, args: tuple[Any, ...], out: Any, **kw: Any) -> Any:
        if name == "aten.convolution.default":
            calls.append({"forward": True})
        else:
            grad, x, w = args[0], args[1], args[2]
            calls.append(
                {
                    "forward": False,
                    "x": tuple(x.shape),
                    "w": tuple(w.shape),
                    "y": tuple(grad.shape),
                    "x_bytes": _nbytes(x),
                    "y_bytes": _nbytes(grad),
                    "w_elems": int(math.prod(w.shape)),
                    "mask": [bool(m) for m in args[10]],
                }
            )
        return original(name, args, out, **kw)

    kernels.conv_workspace = record  # type: ignore[assignment]
    try:
        gpu_truth_replay.traced_requests(entry)
    finally:
        kernels.conv_workspace = original
    return calls


def copies(workspace: int, call: dict[str, Any]) -> str | None:
    """The workspace as ``"S"`` or ``"x + y + S"`` float32 filter-gradient copies, when it is
    a whole number of them; else ``None``."""
    grad = 4 * call["w_elems"]
    for label, base in (("", 0), ("x + y + ", call["x_bytes"] + call["y_bytes"])):
        rest = workspace - base
        if rest > 0 and rest % grad == 0:
            return f"{label}{rest // grad}"
    return None


def split_rows() -> list[dict[str, Any]]:
    import cudnn_workspace_fit as fit
    from truth_corpus import load_corpus

    entries = [
        e
        for e in load_corpus(CORPUS)
        if e.device == "cuda" and e.kind == "torch" and e.workload.startswith("dqn_cnn")
    ]
    calibration, _ = fit.split([e.name for e in entries])
    rows: list[dict[str, Any]] = []
    for entry in sorted(entries, key=lambda e: (e.workload, e.batch or 0)):
        real = fit.real_conv_calls(entry)
        traced = _backward_calls(entry)
        if len(real) != len(traced):
            print(f"{entry.name}: the calls do not align, left out", flush=True)
            continue
        seen = set()
        for call, (_kept, freed) in zip(traced, real, strict=True):
            if call["forward"] or not call["mask"][1]:
                continue
            key = (call["x"], call["w"])
            if key in seen:  # the second step repeats the first
                continue
            seen.add(key)
            spaces = [n for n in freed if n >= fit.SMALL]
            if call["mask"][0] and len(spaces) >= 2:
                spaces = spaces[1:]  # backward-data's, then backward-filter's
            elif call["mask"][0] and len(spaces) == 1 and copies(spaces[0], call) is None:
                spaces = []  # the one workspace is backward-data's
            ws = spaces[-1] if spaces else 0
            base = call["x_bytes"] + call["y_bytes"] + 4 * call["w_elems"]
            rows.append(
                {
                    "entry": entry.name,
                    "half": "calibration" if entry.name in calibration else "validation",
                    "x": "x".join(map(str, call["x"])),
                    "w": "x".join(map(str, call["w"])),
                    "npq": call["y"][0] * math.prod(call["y"][2:]),
                    "workspace": ws,
                    "ratio": ws / base,
                    "copies": copies(ws, call) if ws else "none",
                }
            )
            print(rows[-1], flush=True)
    return rows


def rule_rows(factor: float, small: float, min_npq: int) -> list[dict[str, Any]]:
    import gpu_truth_replay
    from truth_corpus import load_corpus

    import memfit.estimate.torch._cuda_kernels as kernels

    original = kernels.conv_workspace
    hits: set[tuple[Any, ...]] = set()

    def ruled(name: str, args: tuple[Any, ...], out: Any, **kw: Any) -> Any:
        found = original(name, args, out, **kw)
        if (
            found is None
            or found.basis != "fitted"
            or name != "aten.convolution_backward.default"
            or not args[10][1]
        ):
            return found
        grad, x, w = args[0], args[1], args[2]
        xb, yb, wb = _nbytes(x), _nbytes(grad), _nbytes(w)
        npq = int(grad.shape[0]) * int(math.prod(grad.shape[2:]))
        if wb / (xb + yb) >= small or npq < min_npq:
            return found
        hits.add((tuple(x.shape), tuple(w.shape)))
        kernels_ = tuple(
            (k, int((xb + yb + wb) * factor) if k == "backward_filter" else n)
            for k, n in found.kernels
        )
        return dataclasses.replace(found, kernels=kernels_, nbytes=max(n for _, n in kernels_))

    rows = []
    kernels.conv_workspace = ruled  # type: ignore[assignment]
    try:
        for entry in load_corpus(CORPUS):
            if entry.device != "cuda" or entry.kind != "torch":
                continue
            if entry.trace is None or not any(
                op and "convolution" in op for op in entry.trace.op_names
            ):
                continue
            hits.clear()
            pred = gpu_truth_replay.predict(entry)
            row = {"entry": entry.name, "kernels": len(hits)}
            for field, peak in (("allocated", "max_allocated"), ("reserved", "max_reserved")):
                real = entry.peaks[peak]
                row[field] = (pred[f"{field}_peak"] - real) / real
            rows.append(row)
            print(row, flush=True)
    finally:
        kernels.conv_workspace = original
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rule", type=float, help="part 2: the class's factor of x + y + w")
    parser.add_argument("--small", type=float, default=0.01, help="filter bytes / (x + y) below")
    parser.add_argument("--min-npq", type=int, default=16384, help="N*P*Q at least")
    args = parser.parse_args(argv)
    splits = split_rows()
    lines = [
        "| entry | half | input | filter | N*P*Q | workspace MiB | / (x + y + w) | "
        "filter-gradient copies |",
        "|---|---|---|---|---:|---:|---:|---|",
    ]
    for r in splits:
        lines.append(
            f"| {r['entry']} | {r['half']} | {r['x']} | {r['w']} | {r['npq']} | "
            f"{r['workspace'] / MiB:.2f} | {r['ratio']:.3f} | {r['copies'] or 'not whole'} |"
        )
    rules: list[dict[str, Any]] = []
    if args.rule is not None:
        rules = rule_rows(args.rule, args.small, args.min_npq)
        lines += [
            "",
            f"rule: backward-filter workspace {args.rule} x (x + y + w) where the filter is "
            f"under {args.small:.0%} of x + y and N*P*Q >= {args.min_npq}",
            "",
            "| entry | kernels in the class | allocated err | reserved err |",
            "|---|---:|---:|---:|",
        ]
        for r in rules:
            lines.append(
                f"| {r['entry']} | {r['kernels']} | {100 * r['allocated']:+.2f}% | "
                f"{100 * r['reserved']:+.2f}% |"
            )
    markdown = "\n".join(lines) + "\n"
    given = sys.argv[1:] if argv is None else argv
    command = " ".join(["python bench/cudnn_wgrad_splits.py", *given])
    meta = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {platform.machine()}",
        "command": command,
    }
    write_results("cudnn_wgrad_splits", {"meta": meta, "splits": splits, "rule": rules}, markdown)
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
