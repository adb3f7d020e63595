"""What the GPU truth corpus tests share (tests/estimate/test_gpu_truth.py and
torch/test_gpu_truth_cuda.py): the corpus, the replay of its entries
(tests/shared/gpu_truth_replay.py), its predictions and the goals' table."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from truth_corpus import TruthEntry, load_corpus

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "data" / "gpu_truth"
MiB = 2**20
NO_CUDA_CORPUS = (
    "no CUDA corpus exists yet: run `python bench/gpu_truth.py` (bench/gpu_session.sh does) on "
    "a CUDA GPU and commit tests/data/gpu_truth/<gpu>/"
)

ENTRIES = load_corpus(CORPUS)


def bench() -> ModuleType:
    import gpu_truth_replay

    return gpu_truth_replay


def params(entries: list[TruthEntry], none_reason: str) -> list[Any]:
    if not entries:
        return [pytest.param(None, marks=pytest.mark.skip(reason=none_reason), id="none")]
    return [pytest.param(e, id=e.name) for e in entries]


def cpu_kernels_differ(entry: TruthEntry) -> str | None:
    """Why a CPU entry's truth does not hold on this machine, or ``None`` when it does: the
    scratch of oneDNN convolutions and CPU attention depends on the instruction set."""
    here = torch.backends.cpu.get_cpu_capability()
    there = entry.environment.get("cpu_capability")
    names = " ".join(entry.trace.op_names) if entry.trace is not None else ""
    if there != here and ("conv" in names or "attention" in names):
        return f"captured on a {there} CPU, this one is {here}: oneDNN picks other kernels"
    return None


@cache
def prediction(name: str) -> dict[str, Any]:
    entry = next(e for e in ENTRIES if e.name == name)
    threads = entry.environment.get("threads")
    before = torch.get_num_threads()
    if isinstance(threads, int) and threads > 0:
        torch.set_num_threads(threads)  # per-thread kernel buffers: as in the capture
    try:
        return dict(bench().predict(entry))
    finally:
        torch.set_num_threads(before)


def table(rows: list[tuple[str, int, int]]) -> str:
    lines = ["| entry | real MiB | predicted MiB | err |", "|---|---:|---:|---:|"]
    for name, real, pred in rows:
        lines.append(
            f"| {name} | {real / MiB:.2f} | {pred / MiB:.2f} | {(pred - real) / real:+.2%} |"
        )
    return "\n".join(lines)


def goals(rows: list[tuple[str, int, int]], mean_goal: float, worst_goal: float) -> None:
    errors = [abs(pred - real) / real for _, real, pred in rows]
    text = table(rows)
    print(text)
    mean, worst = sum(errors) / len(errors), max(errors)
    assert mean <= mean_goal and worst <= worst_goal, (
        f"mean |err| {mean:.2%} (goal {mean_goal:.0%}), worst {worst:.2%} (goal "
        f"{worst_goal:.0%})\n{table}"
    )
