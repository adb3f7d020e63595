"""What each memory query costs on this machine: the figures behind memfit's sampling choices.

For every way memfit reads memory (torch.cuda's counters, the CUDA driver's free memory, each
NVML call of a snapshot, a whole NVML snapshot, JAX's ``memory_stats()``), the median time of
one call over many, in microseconds. Reads that are too slow to make every step are read less
often (TrainGuard's free-memory check) or once (NVML's static device facts).

    python bench/query_cost.py

Writes ``bench/out/query_cost.json`` and ``.md`` and prints the markdown table. Needs a CUDA
GPU for most rows; rows that cannot run here say why.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import utc_minute, write_results  # noqa: E402


def _time(fn: Callable[[], Any], calls: int = 200) -> float:
    """Median microseconds of one call (after a few warm-up calls)."""
    for _ in range(5):
        fn()
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return 1e6 * statistics.median(samples)


def torch_rows() -> list[tuple[str, float | str]]:
    try:
        import torch
    except ImportError:
        return [("torch.cuda", "torch is not installed")]
    if not torch.cuda.is_available():
        return [("torch.cuda", "no CUDA device")]
    keep = torch.zeros(1 << 20, device="cuda")
    cuda = torch.cuda
    rows: list[tuple[str, float | str]] = [
        ("torch.cuda.memory_allocated()", _time(lambda: cuda.memory_allocated(0))),
        ("torch.cuda.memory_reserved()", _time(lambda: cuda.memory_reserved(0))),
        ("torch.cuda.max_memory_allocated()", _time(lambda: cuda.max_memory_allocated(0))),
        ("torch.cuda.memory_stats() (flat dict)", _time(lambda: cuda.memory_stats(0))),
        ("torch.cuda.mem_get_info() (driver)", _time(lambda: cuda.mem_get_info(0))),
        ("torch.cuda.is_initialized()", _time(cuda.is_initialized)),
    ]
    raw = getattr(torch._C, "_cuda_memoryStats", None)
    if raw is not None:
        rows.append(("torch._C._cuda_memoryStats() (nested dict)", _time(lambda: raw(0))))
    from memfit.monitor.recorder import Recorder

    with Recorder(log=False, source="torch") as rec:
        rows.append(("Recorder.step() on torch.cuda", _time(rec.step)))
    del keep
    return rows


def nvml_rows() -> list[tuple[str, float | str]]:
    try:
        import pynvml
    except ImportError:
        return [("NVML", "nvidia-ml-py is not installed")]
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # no driver here
        return [("NVML", f"nvmlInit failed: {exc}")]
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    calls: list[tuple[str, Callable[[], Any]]] = [
        ("nvmlDeviceGetCount", pynvml.nvmlDeviceGetCount),
        ("nvmlSystemGetDriverVersion", pynvml.nvmlSystemGetDriverVersion),
        ("nvmlDeviceGetHandleByIndex", lambda: pynvml.nvmlDeviceGetHandleByIndex(0)),
        ("nvmlDeviceGetName", lambda: pynvml.nvmlDeviceGetName(handle)),
        ("nvmlDeviceGetUUID", lambda: pynvml.nvmlDeviceGetUUID(handle)),
        ("nvmlDeviceGetMemoryInfo (v1)", lambda: pynvml.nvmlDeviceGetMemoryInfo(handle)),
        ("nvmlDeviceGetUtilizationRates", lambda: pynvml.nvmlDeviceGetUtilizationRates(handle)),
        (
            "nvmlDeviceGetCudaComputeCapability",
            lambda: pynvml.nvmlDeviceGetCudaComputeCapability(handle),
        ),
        ("nvmlDeviceGetMigMode", lambda: pynvml.nvmlDeviceGetMigMode(handle)),
        (
            "nvmlDeviceGetComputeRunningProcesses",
            lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(handle),
        ),
        (
            "nvmlDeviceGetGraphicsRunningProcesses",
            lambda: pynvml.nvmlDeviceGetGraphicsRunningProcesses(handle),
        ),
    ]
    version = getattr(pynvml, "nvmlMemory_v2", None)
    if version is not None:
        calls.append(
            (
                "nvmlDeviceGetMemoryInfo (v2)",
                lambda: pynvml.nvmlDeviceGetMemoryInfo(handle, version=version),
            )
        )
    rows: list[tuple[str, float | str]] = []
    for name, fn in calls:
        try:
            rows.append((name, _time(fn, calls=50)))
        except Exception as exc:  # NotSupported and the like: say so
            rows.append((name, f"{type(exc).__name__}: {exc}"))
    from memfit.backends.nvml import NvmlProbe

    probe = NvmlProbe()
    rows.append(("NvmlProbe().snapshot() (whole)", _time(probe.snapshot, calls=50)))
    return rows


def jax_rows() -> list[tuple[str, float | str]]:
    try:
        import jax
    except ImportError:
        return [("jax", "jax is not installed")]
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if not gpus:
        return [("jax memory_stats()", "no JAX GPU device")]
    return [("jax Device.memory_stats()", _time(gpus[0].memory_stats))]


def main() -> int:
    rows = torch_rows() + nvml_rows() + jax_rows()
    result = {
        "date": utc_minute(),
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs",
        "command": "python bench/query_cost.py",
        "rows": [
            {
                "query": q,
                "us": v if isinstance(v, float) else None,
                "note": v if isinstance(v, str) else None,
            }
            for q, v in rows
        ],
    }
    lines = [
        f"# Memory query cost ({result['date']}, {result['machine']})",
        "",
        "| query | median µs per call |",
        "|---|---:|",
    ]
    for q, v in rows:
        lines.append(f"| {q} | {v:.1f} |" if isinstance(v, float) else f"| {q} | {v} |")
    text = "\n".join(lines) + "\n"
    write_results("query_cost", result, text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
