"""What each CUDA kernel really allocates, op by op, against what the trace assumes.

For the first session with a GPU (``bench/gpu_session.sh`` lane E). Each case below runs one
op (forward, and backward where it has one) on the GPU under
``torch.cuda.memory._record_memory_history``, and lists every allocation the caching
allocator made inside it (requested bytes, freed inside the op or kept); the same case is
traced by :func:`memfit.estimate.trace_requests` for this GPU (``gpu=`` the device's name,
``runtime=`` this torch), and the two lists are compared: what the kernel keeps (a dropout
mask, an attention log-sum-exp) and what it takes and gives back (cuDNN's workspace, the
attention backward's accumulators, cuBLASLt's workspace).

    python bench/cuda_kernel_allocs.py          # writes bench/out/cuda_kernel_allocs.{json,md}

Without CUDA it says so and exits 0 (nothing to measure here).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common


def _cases() -> dict[str, tuple[Callable[[], Any], Callable[[Any], Any]]]:
    """name -> (make inputs on the current default device, run the op and its backward)."""
    import torch
    from torch import nn
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def attention(backend: Any, dtype: Any, dropout: float) -> tuple[Any, Any]:
        def make() -> Any:
            return [torch.randn(8, 12, 512, 64, dtype=dtype, requires_grad=True) for _ in range(3)]

        def run(qkv: Any) -> Any:
            with sdpa_kernel(backend):
                out = nn.functional.scaled_dot_product_attention(*qkv, dropout_p=dropout)
            out.sum().backward()

        return make, run

    def conv(dtype: Any, hw: int, channels_last: bool) -> tuple[Any, Any]:
        layer = nn.Conv2d(32, 32, 3)

        def make() -> Any:
            x = torch.randn(64, 32, hw, hw, dtype=dtype, requires_grad=True)
            m = layer.to(device=x.device, dtype=dtype)
            if channels_last:
                x = x.contiguous(memory_format=torch.channels_last).detach().requires_grad_()
                m = m.to(memory_format=torch.channels_last)
            return m, x

        def run(mx: Any) -> Any:
            m, x = mx
            m(x).sum().backward()

        return make, run

    def dropout() -> tuple[Any, Any]:
        def make() -> Any:
            return torch.randn(8, 12, 512, 512, requires_grad=True)

        def run(x: Any) -> Any:
            nn.functional.dropout(x, 0.1, True).sum().backward()

        return make, run

    def linear(dtype: Any) -> tuple[Any, Any]:
        def make() -> Any:
            m = nn.Linear(768, 3072).to(dtype=dtype)
            return m, torch.randn(8 * 512, 768, dtype=dtype, requires_grad=True)

        def run(mx: Any) -> Any:
            m, x = mx
            m(x).sum().backward()

        return make, run

    cases: dict[str, tuple[Any, Any]] = {
        "dropout fp32 8x12x512x512": dropout(),
        "linear+bias fp32 (cuBLASLt)": linear(torch.float32),
        "linear+bias bf16 (cuBLASLt)": linear(torch.bfloat16),
    }
    for name, backend in (
        ("flash", SDPBackend.FLASH_ATTENTION),
        ("efficient", SDPBackend.EFFICIENT_ATTENTION),
        ("cudnn", SDPBackend.CUDNN_ATTENTION),
        ("math", SDPBackend.MATH),
    ):
        for dropout_p in (0.0, 0.1):
            cases[f"sdpa {name} fp16 p={dropout_p}"] = attention(backend, torch.float16, dropout_p)
    for dtype, label in ((torch.float32, "fp32"), (torch.float16, "fp16")):
        for hw in (84, 128, 256, 512):
            for cl in (False, True):
                cases[f"conv3x3 {label} {hw}px{' NHWC' if cl else ''}"] = conv(dtype, hw, cl)
    return cases


def _measure(make: Callable[[], Any], run: Callable[[Any], Any]) -> dict[str, Any]:
    """Allocations inside two runs of the op on the GPU (the first makes the library
    handles and their workspaces, as the trace's first step does)."""
    import torch

    inputs = make()
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    run(inputs)
    run(inputs)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    events = [e for trace in snapshot["device_traces"] for e in trace]
    allocs = [e["size"] for e in events if e["action"] == "alloc"]
    return {"peak_above_inputs": peak, "allocations": allocs}


def make_count(make: Callable[[], Any]) -> int:
    """How many storages the inputs take (the trace lists them first; the real run made them
    before recording)."""
    import torch
    from torch.utils._pytree import tree_flatten

    made = make()
    tensors = [t for t in tree_flatten(made)[0] if isinstance(t, torch.Tensor)]
    if isinstance(made, tuple) and isinstance(made[0], torch.nn.Module):
        tensors += list(made[0].parameters())
    return len({id(t.untyped_storage()) for t in tensors})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="run the cases whose name contains this")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure (run this on a GPU, bench/gpu_session.sh)")
        return 0
    import memfit
    from memfit.estimate.torch.trace import trace_requests

    name = torch.cuda.get_device_name()
    rows: list[str] = []
    results: dict[str, Any] = {}
    for case, (make, run) in _cases().items():
        if args.only and args.only not in case:
            continue
        torch.set_default_device("cuda")
        try:
            real = _measure(make, run)
        except Exception as exc:  # a backend this GPU or build does not have
            results[case] = {"skipped": f"{type(exc).__name__}: {str(exc)[:120]}"}
            continue
        finally:
            torch.set_default_device("cpu")

        def build(make: Any = make) -> tuple[Any, Any]:
            return None, make()

        def step(_m: Any, inputs: Any, _b: Any, run: Any = run) -> None:
            run(inputs)

        try:
            traced = trace_requests(
                build, step, lambda n: None, 1, device="cpu", gpu=name, steps=2,
                kernel_scratch=False,
            )  # fmt: skip
        except Exception as exc:  # the GPU ran it, the trace refused: a finding, not the end
            results[case] = {"real": real, "trace_refused": f"{type(exc).__name__}: {exc}"[:300]}
            rows.append(f"| {case} | {real['peak_above_inputs']:,} | {len(real['allocations'])} "
                        f"| {sum(real['allocations']):,} | refused: {str(exc)[:80]} |")  # fmt: skip
            print(rows[-1], flush=True)
            continue
        inputs = make_count(make)
        traced_sizes = [r.nbytes for r in traced if r.target in ("all", "cuda")][inputs:]
        results[case] = {"real": real, "traced_requests": traced_sizes}
        rows.append(
            f"| {case} | {real['peak_above_inputs']:,} | {len(real['allocations'])} | "
            f"{sum(real['allocations']):,} | {sum(traced_sizes):,} |"
        )
        print(rows[-1], flush=True)
    header = (
        f"CUDA kernel allocations, {_common.utc_minute()}, {name}, torch {torch.__version__}, "
        f"memfit {memfit.__version__} (`python bench/cuda_kernel_allocs.py`). Both byte "
        "columns cover two runs of the op (the first makes the library handles and their "
        "workspaces).\n\n"
        "| case | real peak above inputs (B) | real allocations | real bytes requested | "
        "traced bytes requested |\n|---|---:|---:|---:|---:|\n"
    )
    _common.write_results("cuda_kernel_allocs", results, header + "\n".join(rows) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
