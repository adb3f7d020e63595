"""Capture GPU truth once, for CPU tests to replay forever (issue 12, section 2).

On a CUDA machine, for every accuracy workload (the 12 PyTorch workloads of
``estimate_workloads.py`` and the third-party ones of ``estimate_third_party.py`` at their 3
batch sizes, the JAX PPO update at 3, and the three seed systems of ``examples/`` at real
scale), each in fresh processes, this records:

* the machine: GPU name, compute capability, total memory, driver, torch / CUDA / cuDNN /
  cuBLAS versions, the cuBLAS and cuBLASLt workspace sizes in force, JAX / jaxlib;
* a clean run (build + two steps, nothing else in the process): ``max_memory_allocated``,
  ``max_memory_reserved``, the process's device memory from NVML and ``mem_get_info``;
* a traced run of the same: the caching allocator's own trace
  (``torch.cuda.memory._record_memory_history(max_entries=...)`` then ``_snapshot()``:
  alloc, free_requested, free_completed, segment_alloc/free/map/unmap, sizes, addresses,
  streams), each allocation tagged with the ATen op running when it happened (the ops run
  through a dispatch mode whose Python frame is named after the op, so the snapshot's Python
  stack names it; no C++ frames, no stack is stored);
* for JAX: ``memory_stats()`` before and after, the compiled ``memory_analysis()`` on the
  GPU, with ``XLA_PYTHON_CLIENT_PREALLOCATE=false``, once more with
  ``XLA_FLAGS=--xla_gpu_autotune_level=0`` (what the 141 MiB beyond the analysis is).

Each becomes ``tests/data/gpu_truth/<gpu-slug>/<workload>@<batch>.json.gz`` in the format of
:mod:`truth_corpus` (stack frames dropped, the trace as columns).

``--cpu`` captures the same kind of entries on the CPU, whose truth is the CPU allocator's
own reports (``torch.profiler`` memory events, each tagged with the outermost ATen op) for
small versions of the workloads: the corpus CI can check the tracer against today.

``--report`` replays a corpus: (a) the allocator model against each CUDA trace's reserved
peak, (b) the traced request sequence diffed against the real one, every difference named,
(c) the estimator's predictions against the real peaks, with the issue's goals and each
figure's band (relative to the real peak); it writes
``bench/out/gpu_truth.json`` / ``.md`` and prints the table.

    python bench/gpu_truth.py                 # on a CUDA GPU (bench/gpu_session.sh runs it)
    python bench/gpu_truth.py --cpu           # the CPU corpus, anywhere
    python bench/gpu_truth.py --report        # replay tests/data/gpu_truth
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CORPUS = ROOT / "tests" / "data" / "gpu_truth"
sys.path.insert(0, str(HERE))
# the corpus format (truth_corpus) lives with the tests' shared support code
sys.path.insert(0, str(ROOT / "tests" / "shared"))

from _common import rel_err, write_results  # noqa: E402
from gpu_truth_replay import (  # noqa: E402
    _compress_trace,
    _op_mode,
    cpu_workloads,
    factory_for,
    jax_workloads,
    predict,
    real_requests,
    torch_workloads,
    traced_requests,
    workspaces,
)

MiB = 2**20
#: Entries the allocator's history keeps; a capture that fills it is refused (entries lost).
MAX_ENTRIES = 2_000_000


#: Seed systems at real scale (whole example programs, short runs): name -> (script, argv,
#: framework). Their peaks are reached in the first updates; the step counts keep them short.
PROGRAMS: dict[str, tuple[str, list[str], str]] = {
    "seed_dqn_fire": (
        "examples/dqn_fire/run.py",
        [
            "--size",
            "64",
            "--device",
            "cuda",
            "--steps",
            "300",
            "--buffer-cap",
            "0",
            "--batch-cap",
            "0",
            "--inject-oom",
            "0",
        ],
        "torch",
    ),
    "seed_act_dual_camera": (
        "examples/act_dual_camera/run.py",
        ["--device", "cuda", "--num-envs", "16", "--steps", "40", "--autocast"],
        "torch",
    ),
    "seed_brax_ppo": (
        "examples/brax_ppo/run.py",
        [
            "--num-envs",
            "2048",
            "--batch-size",
            "512",
            "--num-minibatches",
            "8",
            "--unroll-length",
            "20",
            "--num-timesteps",
            "2000000",
            "--backend",
            "mjx",
            "--env",
            "humanoid",
        ],
        "jax",
    ),
}


def slug(text: str) -> str:
    """A directory name for a device: ``NVIDIA H100 80GB HBM3`` -> ``nvidia-h100-80gb-hbm3``."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


# --- the machine ---------------------------------------------------------------------------------


def _cublas_version() -> str | None:
    """cuBLAS's version from the library torch loaded (``cublasGetProperty``)."""
    import ctypes

    for name in ("libcublas.so.13", "libcublas.so.12", "libcublas.so.11", "libcublas.so"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        parts = []
        for prop in (0, 1, 2):  # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
            value = ctypes.c_int()
            if lib.cublasGetProperty(prop, ctypes.byref(value)) != 0:
                return None
            parts.append(str(value.value))
        return ".".join(parts)
    return None


def _driver_version() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # NVML missing: say so by None
        return None


def _nvml_used_by_me() -> int | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        import torch

        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == os.getpid() and proc.usedGpuMemory is not None:
                return int(proc.usedGpuMemory)
    except Exception:  # per-process memory unavailable (containers, WSL)
        return None
    return None


def torch_environment() -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    if torch.cuda.is_available():
        index = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        env.update(
            gpu_name=torch.cuda.get_device_name(index),
            compute_capability=list(torch.cuda.get_device_capability(index)),
            total_bytes=int(props.total_memory),
            driver=_driver_version(),
            cuda=torch.version.cuda,
            cudnn=torch.backends.cudnn.version(),
            cublas=_cublas_version(),
        )
        for key, func in (
            ("cublas_workspace_bytes", "cublas_workspace_size"),
            ("cublaslt_workspace_bytes", "cublaslt_workspace_size"),
        ):
            getter = getattr(torch.backends.cuda, func, None)
            env[key] = int(getter()) if getter is not None else None
    else:
        env.update(
            cpu_capability=torch.backends.cpu.get_cpu_capability(),
            threads=torch.get_num_threads(),
            machine=platform.machine(),
        )
    for var in (
        "CUBLAS_WORKSPACE_CONFIG",
        "CUBLASLT_WORKSPACE_SIZE",
        "TORCH_CUBLASLT_UNIFIED_WORKSPACE",
        "PYTORCH_CUDA_ALLOC_CONF",
        "PYTORCH_ALLOC_CONF",
    ):
        env[var] = os.environ.get(var)
    return env


def _allocator_settings() -> dict[str, Any]:
    text = os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    out: dict[str, Any] = {"conf": text, "expandable_segments": False, "max_split_size": None}
    for item in (text or "").split(","):
        key, _, value = item.partition(":")
        if key.strip() == "expandable_segments":
            out["expandable_segments"] = value.strip().lower() == "true"
        elif key.strip() == "max_split_size_mb":
            out["max_split_size"] = int(float(value)) * MiB
    return out


# --- children: one real run each ---------------------------------------------------------------


def _torch_child(name: str, batch: int, traced: bool) -> dict[str, Any]:
    import torch

    from memfit.testing import run_steps

    factory, _ = torch_workloads()[name]
    torch.cuda.init()
    limit = int(os.environ.get(LIMIT_ENV) or 0)
    if limit:
        # A small card's budget on a large one: the caching allocator refuses to hold more
        # than this fraction (an OOM past it, after freeing its cache), so the elastic
        # workspaces (cuDNN skips an engine whose workspace it cannot allocate) are what
        # a card of this size gives them.
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total))
    if traced:
        torch.cuda.memory._record_memory_history(
            enabled="all", context="alloc", stacks="python", max_entries=MAX_ENTRIES
        )
    step = factory()
    torch.manual_seed(0)
    torch.set_default_device("cuda")
    torch.cuda.reset_peak_memory_stats()
    mode = _op_mode() if traced else None
    if mode is not None:
        mode.__enter__()
    try:
        _held = run_steps(step, batch)  # the model and optimiser, alive until return
        torch.cuda.synchronize()
    finally:
        if mode is not None:
            mode.__exit__(None, None, None)
    free, total = torch.cuda.mem_get_info()
    out: dict[str, Any] = {
        "max_allocated": int(torch.cuda.max_memory_allocated()),
        "max_reserved": int(torch.cuda.max_memory_reserved()),
        "device_used": int(total - free),
        "nvml_used": _nvml_used_by_me(),
        "num_alloc_retries": int(torch.cuda.memory_stats().get("num_alloc_retries", 0)),
        "environment": {**torch_environment(), "memory_limit_bytes": limit or None},
        "allocator": _allocator_settings(),
    }
    if traced:
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        device = torch.cuda.current_device()
        out["dropped"] = len(snap["device_traces"][device]) >= MAX_ENTRIES
        out["trace"], out["notes"] = _compress_trace(snap, device)
    return out


def _memory_analysis(compiled: Any) -> dict[str, int]:
    analysis = compiled.memory_analysis()
    if analysis is None:
        return {}
    return {
        k: int(getattr(analysis, k))
        for k in dir(analysis)
        if k.endswith("_in_bytes") and isinstance(getattr(analysis, k, None), int)
    }


def _jax_child(name: str, batch: int) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    factory, _ = jax_workloads()[name]
    step = factory()
    device = jax.devices()[0]
    before = device.memory_stats() or {}
    shapes = step.make_args(batch)
    compiled = jax.jit(step.fn).lower(*shapes).compile()
    after_compile = device.memory_stats() or {}
    args = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    after_args = device.memory_stats() or {}
    out = compiled(*args)
    jax.block_until_ready(out)
    after_run = device.memory_stats() or {}
    out2 = compiled(*args)
    jax.block_until_ready(out2)
    after_second = device.memory_stats() or {}
    import jaxlib

    return {
        "peak_bytes_in_use": after_second.get("peak_bytes_in_use"),
        "environment": {
            "jax": jax.__version__,
            "jaxlib": getattr(jaxlib, "__version__", None),
            "gpu_name": getattr(device, "device_kind", str(device)),
            "platform": device.platform,
            "XLA_FLAGS": os.environ.get("XLA_FLAGS"),
            "XLA_PYTHON_CLIENT_PREALLOCATE": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE"),
        },
        "jax": {
            "memory_stats_before": before,
            "memory_stats_after_compile": after_compile,
            "memory_stats_after_args": after_args,
            "memory_stats_after_run": after_run,
            "memory_stats_after_second_run": after_second,
            "memory_analysis": _memory_analysis(compiled),
        },
    }


def _program_child(name: str) -> dict[str, Any]:
    import runpy

    script, argv, framework = PROGRAMS[name]
    out: dict[str, Any] = {}
    if framework == "torch":
        import torch

        torch.cuda.init()
        torch.cuda.memory._record_memory_history(
            enabled="all", context=None, stacks="python", max_entries=MAX_ENTRIES
        )
    sys.argv = [script, *argv]
    try:
        runpy.run_path(str(ROOT / script), run_name="__main__")
    except SystemExit as exc:
        out["exit"] = exc.code
    if framework == "torch":
        import torch

        snap = torch.cuda.memory._snapshot()
        device = torch.cuda.current_device()
        out["dropped"] = len(snap["device_traces"][device]) >= MAX_ENTRIES
        out["trace"], out["notes"] = _compress_trace(snap, device)
        out["max_allocated"] = int(torch.cuda.max_memory_allocated())
        out["max_reserved"] = int(torch.cuda.max_memory_reserved())
        free, total = torch.cuda.mem_get_info()
        out["device_used"] = int(total - free)
        out["nvml_used"] = _nvml_used_by_me()
        out["environment"] = torch_environment()
        out["allocator"] = _allocator_settings()
    else:
        import jax

        stats = jax.devices()[0].memory_stats() or {}
        out["peak_bytes_in_use"] = stats.get("peak_bytes_in_use")
        out["environment"] = {"jax": jax.__version__, "gpu_name": jax.devices()[0].device_kind}
        out["jax"] = {"memory_stats_end": stats}
    return out


def _cpu_child(name: str) -> dict[str, Any]:
    """A real CPU run under the profiler: the CPU allocator's events, each with its op."""
    import bisect

    import torch
    from torch.profiler import ProfilerActivity, profile
    from truth_corpus import Event, Trace

    from memfit.testing import run_steps

    factory, batch = cpu_workloads()[name]
    step = factory()
    torch.manual_seed(0)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        model, opt = run_steps(step, batch)
        del model, opt
    events = list(prof.profiler.kineto_results.events())
    ops = sorted(
        (e.start_ns(), e.start_ns() + e.duration_ns(), e.name())
        for e in events
        if e.name().startswith("aten::")
    )
    outer: list[tuple[int, int, str]] = []
    for start, end, op_name in ops:  # the outermost aten ops (what the dispatcher sees)
        if outer and start <= outer[-1][1]:
            continue
        outer.append((start, end, op_name))
    starts = [o[0] for o in outer]
    others = [  # autograd nodes, optimizer steps: for memory outside every aten op
        (e.start_ns(), e.start_ns() + e.duration_ns(), e.name())
        for e in events
        if e.name() != "[memory]" and not e.name().startswith("aten::")
    ]
    memory = sorted((e for e in events if e.name() == "[memory]"), key=lambda e: e.start_ns())
    trace_events = []
    live = peak = 0
    for e in memory:
        t = e.start_ns()
        i = bisect.bisect_right(starts, t) - 1
        op = outer[i][2] if i >= 0 and t <= outer[i][1] else None
        if op is None:
            around = [o for o in others if o[0] <= t <= o[1]]
            op = min(around, key=lambda o: o[1] - o[0])[2] if around else None
        size = int(e.nbytes())
        live += size
        peak = max(peak, live)
        action = "alloc" if size > 0 else "free_completed"
        trace_events.append(Event(action, 0, abs(size), 0, op))
    return {
        "cpu_peak": peak,
        "batch": batch,
        "environment": torch_environment(),
        "trace": Trace.from_events(trace_events).to_json(),
        "notes": ["CPU entry: the trace is the CPU allocator's profiler events (no addresses)"],
    }


def _run_child(args: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        proc = subprocess.run(
            [sys.executable, __file__, "--child", *args, str(out)],
            capture_output=True,
            text=True,
            env={**os.environ, **(env or {})},
            check=False,
        )
        if proc.returncode != 0 or not out.exists():
            tail = (proc.stderr or "").strip().splitlines()[-3:]
            return {"error": " | ".join(tail) or f"exit {proc.returncode}"}
        result: dict[str, Any] = json.loads(out.read_text())
        return result


# --- capture --------------------------------------------------------------------------------------


def _store(folder: Path, got: dict[str, Any], **kw: Any) -> Any:
    """Save the corpus entry of one captured case (``kw``: the entry's fields; the environment
    is the one the child ``got``) as ``folder/<name>.json.gz``; return it."""
    from truth_corpus import Trace, TruthEntry, save_entry

    trace = kw.pop("trace", None)
    entry = TruthEntry(
        trace=Trace.from_json(trace) if trace else None, environment=got["environment"], **kw
    )
    save_entry(entry, folder / f"{entry.name}.json.gz")
    return entry


#: The environment variable that tells a torch child to cap its allocator (bytes): the
#: small-card lane (``--limit-gib``).
LIMIT_ENV = "MEMFIT_TRUTH_LIMIT_BYTES"


def _torch_case(folder: Path, name: str, batch: int, limit: int | None = None) -> str:
    env = {LIMIT_ENV: str(limit)} if limit else None
    clean = _run_child(["torch", name, str(batch), "0"], env)
    traced = _run_child(["torch", name, str(batch), "1"], env)
    if "error" in clean or "error" in traced:
        return f"{name}@{batch}: failed {clean.get('error') or traced['error']}"
    notes = list(traced.get("notes", []))
    if traced.get("dropped"):
        notes.append("the allocator history filled max_entries: trace incomplete")
    if clean["max_reserved"] != traced["max_reserved"]:
        notes.append(
            f"the traced run's reserved peak {traced['max_reserved']} differs from "
            f"the clean run's {clean['max_reserved']}"
        )
    entry = _store(
        folder,
        clean,
        name=f"{name}@{batch}",
        kind="torch",
        device="cuda",
        workload=name,
        batch=batch,
        peaks={
            "max_allocated": clean["max_allocated"],
            "max_reserved": clean["max_reserved"],
            "device_used": clean["device_used"],
            "nvml_used": clean["nvml_used"],
            "traced_max_allocated": traced["max_allocated"],
            "traced_max_reserved": traced["max_reserved"],
        },
        allocator=clean["allocator"],
        trace=traced.get("trace") or None,
        notes=tuple(notes),
    )
    return f"{entry.name}: reserved {clean['max_reserved'] / MiB:.1f} MiB"


def _jax_case(folder: Path, name: str, variant: str, batch: int) -> str:
    env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    if variant:
        env["XLA_FLAGS"] = "--xla_gpu_autotune_level=0"
    got = _run_child(["jax", name, str(batch), "0"], env)
    if "error" in got:
        return f"{name}{variant}@{batch}: failed {got['error']}"
    entry = _store(
        folder,
        got,
        name=f"{name}{variant}@{batch}",
        kind="jax",
        device="cuda",
        workload=name,
        batch=batch,
        peaks={"peak_bytes_in_use": got["peak_bytes_in_use"]},
        jax=got["jax"],
    )
    return f"{entry.name}: peak {got['peak_bytes_in_use']}"


def _program_case(folder: Path, name: str) -> str:
    framework = PROGRAMS[name][2]
    env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"} if framework == "jax" else {}
    got = _run_child(["program", name, "0", "0"], env)
    if "error" in got:
        return f"{name}: failed {got['error']}"
    keys = ("max_allocated", "max_reserved", "device_used", "nvml_used", "peak_bytes_in_use")
    peaks = {k: got.get(k) for k in keys if got.get(k) is not None}
    _store(
        folder,
        got,
        name=name,
        kind="program",
        device="cuda",
        workload=name,
        batch=None,
        peaks=peaks,
        allocator=got.get("allocator", {}),
        trace=got.get("trace") or None,
        jax=got.get("jax"),
        notes=(*got.get("notes", []), f"exit {got.get('exit')}"),
    )
    return f"{name}: {peaks}"


def capture_cuda(
    root: Path,
    only: set[str] | None,
    jobs: int = 1,
    redo: bool = False,
    limit_gib: float | None = None,
) -> list[str]:
    """Capture every CUDA case into ``root/<gpu-slug>/``; return one line per case.

    Cases already stored are skipped unless ``redo`` (a capture cut short by a session's
    time limit goes on where it stopped). ``jobs`` cases run side by side: each child
    process measures its own allocator, so they do not disturb each other's figures.
    ``limit_gib``: the PyTorch workloads only, each capped at that many GiB with
    ``torch.cuda.set_per_process_memory_fraction`` (a small card's budget), into
    ``root/<gpu-slug>-limit-<N>gib/``.
    """
    import concurrent.futures

    import torch

    if not torch.cuda.is_available():
        raise SystemExit("bench/gpu_truth.py needs a CUDA GPU (or run --cpu / --report)")
    folder = root / slug(torch.cuda.get_device_name(0))
    limit = int(limit_gib * 2**30) if limit_gib else None
    if limit:
        folder = root / slug(f"{torch.cuda.get_device_name(0)} limit {limit_gib:g}gib")
    cases: list[tuple[str, Callable[[], str]]] = []
    for name, (_, sizes) in torch_workloads().items():
        for batch in sizes:
            cases.append(
                (f"{name}@{batch}", lambda n=name, b=batch: _torch_case(folder, n, b, limit))
            )
    for name, (_, sizes) in ({} if limit else jax_workloads()).items():
        for variant in ("", "_autotune0"):
            for batch in sizes:
                cases.append(
                    (
                        f"{name}{variant}@{batch}",
                        lambda n=name, v=variant, b=batch: _jax_case(folder, n, v, b),
                    )
                )
    for name in () if limit else PROGRAMS:
        cases.append((name, lambda n=name: _program_case(folder, n)))
    todo = [
        (key, run)
        for key, run in cases
        if (not only or key.split("@")[0] in only)
        and (redo or not (folder / f"{key}.json.gz").exists())
    ]
    lines = []
    with concurrent.futures.ThreadPoolExecutor(max(1, jobs)) as pool:
        for line in pool.map(lambda case: case[1](), todo):
            lines.append(line)
            print(line, flush=True)
    return lines


def capture_cpu(root: Path, only: set[str] | None) -> list[str]:
    """The CPU corpus: small workloads, truth from the CPU allocator's reports."""
    import torch

    capability = torch.backends.cpu.get_cpu_capability().lower()
    folder = root / slug(f"cpu {platform.machine()} {capability}")
    lines = []
    for name in cpu_workloads():
        if only and name not in only:
            continue
        got = _run_child(["cpu", name, "0", "0"])
        if "error" in got:
            lines.append(f"{name}: failed {got['error']}")
            continue
        entry = _store(
            folder,
            got,
            name=f"{name}@{got['batch']}",
            kind="torch",
            device="cpu",
            workload=name,
            batch=got["batch"],
            peaks={"cpu_peak": got["cpu_peak"]},
            trace=got["trace"],
            notes=tuple(got["notes"]),
        )
        lines.append(f"{entry.name}: CPU peak {got['cpu_peak'] / MiB:.2f} MiB")
        print(lines[-1], flush=True)
    return lines


# --- report: replay the corpus ----------------------------------------------------------------


def report(root: Path) -> tuple[list[dict[str, Any]], str]:
    """Replay the corpus: (a), (b), (c) per entry, and a markdown table."""
    from truth_corpus import diff_requests, load_corpus, replay

    rows: list[dict[str, Any]] = []
    for entry in load_corpus(root):
        row: dict[str, Any] = {"entry": entry.name, "device": entry.device, "kind": entry.kind}
        if entry.device == "cuda" and entry.trace is not None:
            result = replay(
                entry.trace,
                expandable_segments=bool(entry.allocator.get("expandable_segments")),
                max_split_size=entry.allocator.get("max_split_size"),
            )
            row["replay_real_reserved"] = result.real_reserved_peak
            row["replay_model_reserved"] = result.model_reserved_peak
            row["replay_error"] = result.reserved_error
        if entry.trace is not None and factory_for(entry) is not None:
            diffs = diff_requests(
                real_requests(entry),
                traced_requests(entry),
                device=entry.device,
                workspaces=workspaces(entry),
            )
            row["diff"] = [d.__dict__ for d in diffs]
            row["unexplained_bytes"] = sum(d.nbytes for d in diffs if d.cause == "unexplained")
        if factory_for(entry) is not None:
            pred = predict(entry)
            row.update({f"pred_{k}": v for k, v in pred.items()})
            if entry.device == "cpu":
                row["err_cpu"] = rel_err(pred["exact_peak"], entry.peaks.get("cpu_peak"))
            else:
                row["err_allocated"] = rel_err(
                    pred["allocated_peak"], entry.peaks.get("max_allocated")
                )
                row["err_reserved"] = rel_err(
                    pred["reserved_peak"], entry.peaks.get("max_reserved")
                )
                for field, peak in (("allocated", "max_allocated"), ("reserved", "max_reserved")):
                    if pred.get(f"{field}_band"):
                        low, high = pred[f"{field}_band"]
                        real = entry.peaks.get(peak)
                        row[f"band_{field}"] = (rel_err(low, real), rel_err(high, real))
        rows.append(row)
        print({k: v for k, v in row.items() if k != "diff"}, flush=True)
    return rows, _markdown(rows)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:+.2f}%"


def _markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| entry | (a) replay reserved err | (b) unexplained bytes | largest named differences | "
        "(c) CPU peak err | (c) allocated err | (c) reserved err | (c) bands (allocated; "
        "reserved) |",
        "|---|---:|---:|---|---:|---:|---:|---|",
    ]

    def band(r: dict[str, Any], field: str) -> str:
        found = r.get(f"band_{field}")
        return "n/a" if not found else f"{_pct(found[0])} to {_pct(found[1])}"

    for r in rows:
        named = ", ".join(
            f"{d['cause']} ({d['side']}, {d['nbytes'] / MiB:.2f} MiB)"
            for d in r.get("diff", [])[:2]
        )
        unexplained = r.get("unexplained_bytes", "n/a")
        lines.append(
            f"| {r['entry']} | {_pct(r.get('replay_error'))} | {unexplained} | "
            f"{named or '-'} | {_pct(r.get('err_cpu'))} | {_pct(r.get('err_allocated'))} | "
            f"{_pct(r.get('err_reserved'))} | {band(r, 'allocated')}; {band(r, 'reserved')} |"
        )
    for key, label in (
        ("err_cpu", "CPU peak"),
        ("err_allocated", "allocated"),
        ("err_reserved", "reserved"),
    ):
        errs = [abs(r[key]) for r in rows if r.get(key) is not None]
        if errs:
            lines.append(
                f"\n{label}: {len(errs)} entries, mean |err| {100 * sum(errs) / len(errs):.2f}%, "
                f"worst {100 * max(errs):.2f}%"
            )
    if not any(r.get("replay_error") is not None for r in rows):
        lines.append("\n(a): no CUDA corpus yet: nothing to replay against a real allocator")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--cpu", action="store_true", help="capture the CPU corpus")
    parser.add_argument("--report", action="store_true", help="replay a corpus")
    parser.add_argument("--root", default=str(CORPUS), help="corpus root (default %(default)s)")
    parser.add_argument("--only", help="comma-separated workload names")
    parser.add_argument("--jobs", type=int, default=1, help="CUDA cases side by side")
    parser.add_argument("--redo", action="store_true", help="recapture stored CUDA entries")
    parser.add_argument(
        "--limit-gib",
        type=float,
        help="capture the PyTorch workloads capped at this many GiB (a small card's budget)",
    )
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        kind, name, batch, flag, out_path = args.child
        if kind == "torch":
            result = _torch_child(name, int(batch), flag == "1")
        elif kind == "jax":
            result = _jax_child(name, int(batch))
        elif kind == "program":
            result = _program_child(name)
        else:
            result = _cpu_child(name)
        Path(out_path).write_text(json.dumps(result))
        return 0
    root = Path(args.root)
    only = set(args.only.split(",")) if args.only else None
    if args.report:
        rows, markdown = report(root)
        meta = {
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} CPUs",
            "command": "python bench/gpu_truth.py " + " ".join(argv or sys.argv[1:]),
        }
        write_results("gpu_truth", {"meta": meta, "rows": rows}, markdown)
        print(markdown)
        return 0
    if args.cpu:
        lines = capture_cpu(root, only)
    else:
        lines = capture_cuda(root, only, jobs=args.jobs, redo=args.redo, limit_gib=args.limit_gib)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
