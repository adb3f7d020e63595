"""Accuracy of ``memfit estimate`` against real runs.

GPU mode (default; needs CUDA): for each workload in ``bench/estimate_workloads.py`` (12 PyTorch
workloads and a JAX PPO update, 3 batch sizes each) and ``bench/estimate_third_party.py``
(transformers GPT-2/BERT/ViT/T5 and stable-baselines3 DQN-CNN/PPO-MLP/multi-input PPO, 3 batch
sizes each) compare the prediction with a real run in a fresh subprocess (so cuBLAS handles
and cached blocks of one run do not leak into the next):

* PyTorch: ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` after two steps,
  against memfit's ``allocated_peak`` / ``reserved_peak`` (traced on the fake ``cuda`` device);
  for comparison, PyTorch's own MemTracker (``torch.distributed._tools.mem_tracker``, under fake
  tensors) where it runs, and Accelerate's weights-only rule (4 x parameter bytes for training
  with Adam: weights, gradients, two moments).
* JAX: ``device.memory_stats()["peak_bytes_in_use"]`` with ``XLA_PYTHON_CLIENT_PREALLOCATE=false``
  against XLA's compiled memory analysis.

CPU mode (``--cpu``): the 12 PyTorch workloads at their smallest batch size and the
third-party ones at all three, fake trace on CPU against the CPU allocator's own reports
(``torch.profiler`` memory events) of a real run; the summary gives the third-party goal
(nothing refused, mean |err| <= 3%, worst <= 8%) separately. ``--only NAME[,NAME]`` runs a
subset.

Both write ``bench/out/accuracy[_cpu].json`` and ``.md`` and print the markdown table.

    python bench/accuracy.py          # on a CUDA machine (--jobs 6: cases side by side)
    python bench/accuracy.py --cpu    # anywhere
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import estimate_workloads as W  # noqa: E402
from _common import rel_err, write_results  # noqa: E402

MiB = 1024 * 1024


def third_party() -> dict[str, Any]:
    """The third-party workloads, or none when transformers / stable-baselines3 are missing."""
    try:
        import estimate_third_party as TP
    except ImportError:  # pragma: no cover - the dev extra installs both
        return {}
    return dict(TP.THIRD_PARTY_WORKLOADS)


def torch_workloads() -> dict[str, Any]:
    """Every PyTorch workload: name -> (factory, three batch sizes)."""
    return {**W.TORCH_WORKLOADS, **third_party()}


def _run_torch_real(name: str, batch: int) -> dict[str, Any]:
    """Child process: build and run two real steps on CUDA, report the allocator's peaks."""
    import torch

    from memfit.testing import run_steps

    factory, _ = torch_workloads()[name]
    step = factory()
    torch.manual_seed(0)
    torch.set_default_device("cuda")
    torch.cuda.reset_peak_memory_stats()
    _held = run_steps(step, batch)  # the model and optimiser, alive while memory is read
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return {
        "max_allocated": torch.cuda.max_memory_allocated(),
        "max_reserved": torch.cuda.max_memory_reserved(),
        "device_used_end": total - free,
    }


def _run_jax_real(name: str, batch: int) -> dict[str, Any]:
    """Child process: run the JAX step once with allocation on demand, report its peak."""
    import jax
    import jax.numpy as jnp

    factory, _ = W.JAX_WORKLOADS[name]
    step = factory()
    args = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), step.make_args(batch))
    out = jax.jit(step.fn)(*args)
    jax.block_until_ready(out)
    stats = jax.devices()[0].memory_stats() or {}
    return {"peak_bytes_in_use": stats.get("peak_bytes_in_use")}


def _child(kind: str, name: str, batch: int) -> dict[str, Any]:
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    proc = subprocess.run(
        [sys.executable, __file__, "--child", kind, name, str(batch)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed"}
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _memtracker_peak(name: str, batch: int) -> int | None:
    """PyTorch's MemTracker under fake tensors (None where it does not run)."""
    try:
        import torch
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.distributed._tools.mem_tracker import MemTracker
    except ImportError:
        return None
    factory, _ = torch_workloads()[name]
    step = factory()
    previous = torch.get_default_device()
    try:
        torch.set_default_device("cuda")
        with FakeTensorMode():
            model, opt = step.build()
            tracker = MemTracker()
            modules = [model] if isinstance(model, torch.nn.Module) else []
            tracker.track_external(*modules, opt)
            with tracker:
                for _ in range(2):
                    batch_data = step.make_batch(batch)
                    step.step(model, opt, batch_data)
                    del batch_data
            snapshot = tracker.get_tracker_snapshot("peak")
            return int(max(v.get("Total", 0) for v in snapshot.values()))
    except Exception:  # MemTracker is experimental; report that it did not run
        return None
    finally:
        torch.set_default_device(previous)


def _weights_rule(name: str) -> int:
    """Accelerate's rule: parameter bytes (on the meta device); x4 for training with Adam."""
    import torch

    factory, _ = torch_workloads()[name]
    step = factory()
    previous = torch.get_default_device()
    torch.set_default_device("meta")
    try:
        model, _opt = step.build()
        params = {id(p): p for p in model.parameters()}
        return 4 * sum(p.numel() * p.element_size() for p in params.values())
    finally:
        torch.set_default_device(previous)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f}%"


def _abs_pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _mib(x: int | None) -> str:
    return "n/a" if x is None else f"{x / MiB:.1f}"


def _gpu_row(kind: str, name: str, batch: int, gpu_arg: str | None) -> dict[str, Any]:
    """One case: memfit's prediction, the real peaks (fresh child) and the other tools' rules."""
    if kind == "jax":
        from memfit.estimate.xla.step import estimate_jax

        jstep = W.JAX_WORKLOADS[name][0]()
        est = estimate_jax(jstep.fn, *jstep.make_args(batch))
        real = _child("jax", name, batch)
        return {
            "workload": name,
            "batch": batch,
            "pred_allocated": est.executable_peak_bytes,
            "pred_reserved": None,
            "real_allocated": real.get("peak_bytes_in_use"),
            "real_reserved": None,
            "memtracker": None,
            "accelerate_rule": None,
            "error": real.get("error"),
        }
    from memfit.estimate.torch.trace import estimate_torch

    step = torch_workloads()[name][0]()
    point = estimate_torch(step.build, step.step, step.make_batch, [batch], gpu=gpu_arg).points[0]
    real = _child("torch", name, batch)
    return {
        "workload": name,
        "batch": batch,
        "pred_allocated": point.allocated_peak,
        "pred_reserved": point.reserved_peak,
        "real_allocated": real.get("max_allocated"),
        "real_reserved": real.get("max_reserved"),
        "memtracker": _memtracker_peak(name, batch),
        "accelerate_rule": _weights_rule(name),
        "error": real.get("error"),
    }


def run_gpu(jobs: int = 1) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    import torch

    from memfit.errors import ConfigError
    from memfit.hardware.catalog import gpu as lookup_gpu

    gpu_name = torch.cuda.get_device_name(0)
    try:
        gpu_arg: str | None = lookup_gpu(gpu_name).name
    except ConfigError:
        gpu_arg = None  # unknown to the catalog: default context and workspace figures
    cases = [("torch", n, b) for n, (_, sizes) in torch_workloads().items() for b in sizes]
    cases += [("jax", n, b) for n, (_, sizes) in W.JAX_WORKLOADS.items() for b in sizes]
    if jobs > 1:
        import concurrent.futures
        import multiprocessing

        # Each case traces in a worker and measures in a fresh child process of its own, so
        # cases do not share allocator state; several run side by side on one GPU.
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:
            futures = [pool.submit(_gpu_row, kind, n, b, gpu_arg) for kind, n, b in cases]
            rows = []
            for future in futures:
                rows.append(future.result())
                print(rows[-1], flush=True)
    else:
        rows = []
        for kind, n, b in cases:
            rows.append(_gpu_row(kind, n, b, gpu_arg))
            print(rows[-1], flush=True)
    for row in rows:
        row["err_allocated"] = rel_err(row["pred_allocated"], row["real_allocated"])
        row["err_reserved"] = rel_err(row["pred_reserved"], row["real_reserved"])
        row["err_memtracker"] = rel_err(row["memtracker"], row["real_allocated"])
        row["err_accelerate"] = rel_err(row["accelerate_rule"], row["real_allocated"])
    alloc = [abs(r["err_allocated"]) for r in rows if r["err_allocated"] is not None]
    res = [abs(r["err_reserved"]) for r in rows if r["err_reserved"] is not None]
    under = [-r["err_allocated"] for r in rows if r["err_allocated"] is not None]
    summary = {
        "gpu": gpu_name,
        "torch": torch.__version__,
        "allocated_mean_abs_error": sum(alloc) / len(alloc) if alloc else None,
        "allocated_worst_abs_error": max(alloc) if alloc else None,
        "reserved_mean_abs_error": sum(res) / len(res) if res else None,
        "reserved_worst_abs_error": max(res) if res else None,
        "largest_under_prediction": max(under) if under else None,
    }
    names = set(third_party())
    tp = [abs(r["err_allocated"]) for r in rows if r["workload"] in names and r["err_allocated"]]
    summary["third_party_allocated_mean_abs_error"] = sum(tp) / len(tp) if tp else None
    summary["third_party_allocated_worst_abs_error"] = max(tp) if tp else None
    return rows, summary


def _errors(rows: list[dict[str, Any]]) -> dict[str, Any]:
    errs = [abs(r["err"]) for r in rows if r["err"] is not None]
    return {
        "cases": len(rows),
        "refused": sum(1 for r in rows if r.get("refused")),
        "mean_abs_error": sum(errs) / len(errs) if errs else None,
        "worst_abs_error": max(errs) if errs else None,
    }


def run_cpu(only: set[str] | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    import torch

    from memfit.errors import EstimateError
    from memfit.estimate.torch.trace import estimate_torch
    from memfit.testing import real_cpu_peak  # the CPU oracle: the profiler's memory events

    tp = third_party()
    cases = [(n, f, sizes[:1], "ours") for n, (f, sizes) in W.TORCH_WORKLOADS.items()]
    cases += [(n, f, sizes, "third_party") for n, (f, sizes) in tp.items()]
    rows: list[dict[str, Any]] = []
    for name, factory, sizes, group in cases:
        if only and name not in only:
            continue
        for batch in sizes:
            step = factory()
            row: dict[str, Any] = {"workload": name, "group": group, "batch": batch}
            try:
                point = estimate_torch(step.build, step.step, step.make_batch, [batch]).points[0]
            except EstimateError as exc:
                row.update(refused=str(exc), traced_exact_peak=None, real_cpu_peak=None, err=None)
                rows.append(row)
                print(row, flush=True)
                continue
            peak = real_cpu_peak(factory(), batch)
            row.update(
                traced_exact_peak=point.exact_peak,
                real_cpu_peak=peak,
                err=rel_err(point.exact_peak, peak),
            )
            rows.append(row)
            print(row, flush=True)
    summary = {
        "torch": torch.__version__,
        "all": _errors(rows),
        "ours": _errors([r for r in rows if r["group"] == "ours"]),
        "third_party": _errors([r for r in rows if r["group"] == "third_party"]),
    }
    return rows, summary


def _markdown_gpu(rows: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    lines = [
        f"GPU: {summary['gpu']}, torch {summary['torch']}",
        "",
        "| workload | batch | real alloc MiB | memfit alloc | err | real reserved MiB | "
        "memfit reserved | err | MemTracker err | Accelerate rule err |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['workload']} | {r['batch']} | {_mib(r['real_allocated'])} | "
            f"{_mib(r['pred_allocated'])} | {_pct(r['err_allocated'])} | "
            f"{_mib(r['real_reserved'])} | {_mib(r['pred_reserved'])} | "
            f"{_pct(r['err_reserved'])} | {_pct(r['err_memtracker'])} | "
            f"{_pct(r['err_accelerate'])} |"
        )
    lines += [
        "",
        f"allocated: mean |err| {_abs_pct(summary['allocated_mean_abs_error'])}, worst "
        f"{_abs_pct(summary['allocated_worst_abs_error'])}; reserved: mean |err| "
        f"{_abs_pct(summary['reserved_mean_abs_error'])}, worst "
        f"{_abs_pct(summary['reserved_worst_abs_error'])}; largest under-prediction "
        f"{_abs_pct(summary['largest_under_prediction'])}",
    ]
    return "\n".join(lines) + "\n"


def _markdown_cpu(rows: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    lines = [
        f"CPU check (fake trace vs CPU allocator reports of a real run), torch {summary['torch']}",
        "",
        "| workload | batch | real CPU peak MiB | traced peak MiB | err |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        err = "refused" if r.get("refused") else _pct(r["err"])
        lines.append(
            f"| {r['workload']} | {r['batch']} | {_mib(r['real_cpu_peak'])} | "
            f"{_mib(r['traced_exact_peak'])} | {err} |"
        )
    lines.append("")
    for key, label in (("third_party", "third-party"), ("ours", "memfit's 12"), ("all", "all")):
        part = summary[key]
        if not part["cases"]:
            continue
        lines.append(
            f"{label}: {part['cases']} cases, {part['refused']} refused, mean |err| "
            f"{_abs_pct(part['mean_abs_error'])}, worst {_abs_pct(part['worst_abs_error'])}"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--cpu", action="store_true", help="CPU check: trace vs real CPU run")
    parser.add_argument("--only", help="comma-separated workload names (CPU mode)")
    parser.add_argument(
        "--jobs", type=int, default=1, help="GPU mode: cases measured side by side (default 1)"
    )
    parser.add_argument(
        "--child", nargs=3, metavar=("KIND", "NAME", "BATCH"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.child:
        kind, name, batch = args.child
        runner = _run_torch_real if kind == "torch" else _run_jax_real
        print(json.dumps(runner(name, int(batch))))
        return 0
    if not args.cpu:
        import torch

        if not torch.cuda.is_available():
            print(
                "bench/accuracy.py needs a CUDA GPU to compare predictions with real peaks; "
                "this machine has none. Run it on a GPU machine, or run "
                "`python bench/accuracy.py --cpu` for the CPU check.",
                file=sys.stderr,
            )
            return 2
        rows, summary = run_gpu(max(1, args.jobs))
        stem, markdown = "accuracy", _markdown_gpu(rows, summary)
    else:
        rows, summary = run_cpu(set(args.only.split(",")) if args.only else None)
        stem, markdown = "accuracy_cpu", _markdown_cpu(rows, summary)
    summary["date"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    summary["machine"] = f"{platform.node()} {platform.machine()} {os.cpu_count()} CPUs"
    summary["command"] = "python bench/accuracy.py " + " ".join(argv or sys.argv[1:])
    write_results(stem, {"summary": summary, "rows": rows}, markdown)
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
