"""What CUDA's autocast rules change in a CPU trace: a BERT fp16 training step, three ways.

The step (transformers' ``BertForMaskedLM`` built from its config, AdamW, the forward and
loss under ``torch.autocast(..., dtype=float16)``, ``GradScaler("cuda")``) is traced on this
CPU-only machine, at one batch size, and replayed through the CUDA allocator model:

* ``cuda_rules``: as ``memfit.estimate_torch`` traces it now, CUDA's autocast rules read from
  the installed torch (:mod:`memfit.estimate.torch._autocast`).
* ``autocast_off``: as it was traced before: on a torch without CUDA, ``autocast("cuda")`` and
  ``GradScaler("cuda")`` switch themselves off, so the step runs in float32.
* ``cpu_rules``: the same step written with ``torch.autocast("cpu", dtype=float16)``, i.e.
  the CPU's autocast lists.

Writes ``bench/out/autocast_rules_ATTN.json`` and ``.md`` and prints the table.

    python bench/autocast_rules.py --seq 512 --batch 8              # bert-large, eager attention
    python bench/autocast_rules.py --seq 512 --batch 8 --attn sdpa  # through SDPA
    python bench/autocast_rules.py --layers 2 --batch 4             # quicker
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import sys
import time
import warnings
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"

MIB = 2**20


def _step_fns(args: argparse.Namespace, device_type: str) -> tuple[Any, Any, Any]:
    import torch
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 64,
        intermediate_size=4 * args.hidden,
        max_position_embeddings=512,
        attn_implementation=args.attn,
    )

    def build() -> tuple[Any, Any]:
        model = BertForMaskedLM(config)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(model: Any, opt: Any, batch: Any) -> None:
        ids, labels = batch
        scaler = torch.amp.GradScaler("cuda")
        with torch.autocast(device_type, dtype=torch.float16):
            loss = model(input_ids=ids, labels=labels).loss
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)

    def make_batch(n: int) -> Any:
        ids = torch.randint(0, config.vocab_size, (n, args.seq))
        return ids, ids.clone()

    return build, step, make_batch


def _case(args: argparse.Namespace, name: str) -> dict[str, Any]:
    from memfit.allocator.model import AllocatorModel
    from memfit.estimate.torch._cuda_target import CudaTarget
    from memfit.estimate.torch._summary import summarise
    from memfit.estimate.torch._tracer import run_trace
    from memfit.hardware.cuda import cublas_workspace_bytes

    device_type = "cpu" if name == "cpu_rules" else "cuda"
    build, step, make_batch = _step_fns(args, device_type)
    cpu_seconds = []
    for _ in range(args.repeat):
        start = time.process_time()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "CUDA is not available ... Disabling"
            trace = run_trace(
                build,
                step,
                make_batch,
                args.batch,
                "cpu",
                2,
                cuda=CudaTarget(None, None, None, cublas_workspace_bytes(None)),
                cuda_target=name != "autocast_off",
            )
        cpu_seconds.append(time.process_time() - start)
    point = summarise(trace, args.batch, AllocatorModel, None)
    cache = trace.autocast.cache_peak if trace.autocast is not None else 0
    return {
        "case": name,
        "allocated_peak": point.allocated_peak,
        "reserved_peak": point.reserved_peak,
        "activations": point.breakdown["activations"],
        "temporaries": point.breakdown["temporaries"],
        "weight_cast_cache_peak": cache if name == "cuda_rules" else None,
        "trace_cpu_seconds": round(min(cpu_seconds), 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument(
        "--repeat", type=int, default=1, help="trace each case N times; report the least CPU time"
    )
    parser.add_argument(
        "--attn",
        choices=("eager", "sdpa"),
        default="eager",
        help="transformers' attention: eager (matmul, softmax, dropout, matmul: BERT as "
        "published) or sdpa (scaled_dot_product_attention, whose kernel the CPU picks)",
    )
    args = parser.parse_args(argv)
    import torch

    rows = [_case(args, name) for name in ("cuda_rules", "autocast_off", "cpu_rules")]
    result = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {platform.python_version()}, torch {torch.__version__}",
        "model": (
            f"BertForMaskedLM {args.layers} layers, hidden {args.hidden}, seq {args.seq}, "
            f"{args.attn} attention"
        ),
        "batch": args.batch,
        "rows": rows,
    }
    lines = [
        "| trace | allocated peak MiB | reserved peak MiB | activations MiB at peak "
        "| weight-cast cache MiB | trace CPU s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        cache = r["weight_cast_cache_peak"]
        lines.append(
            f"| {r['case']} | {r['allocated_peak'] / MIB:.1f} | {r['reserved_peak'] / MIB:.1f} "
            f"| {r['activations'] / MIB:.1f} | "
            f"{'' if cache is None else f'{cache / MIB:.1f}'} | {r['trace_cpu_seconds']} |"
        )
    table = "\n".join(lines)
    OUT.mkdir(exist_ok=True)
    stem = f"autocast_rules_{args.attn}"
    (OUT / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    (OUT / f"{stem}.md").write_text(table + "\n")
    print(f"{result['model']}, batch {args.batch}, {result['date']}")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
