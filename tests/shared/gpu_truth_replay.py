"""What ``bench/gpu_truth.py`` shares with the tests of the GPU truth corpus
(tests/estimate/test_gpu_truth.py, tests/estimate/torch/test_gpu_truth_cuda.py): the accuracy
workloads each entry names, the op tags the capture puts on the allocator's stacks and the
compression of a snapshot's trace into stored columns, and the replay of a stored entry (its
real and traced requests, the estimator's prediction for the entry's GPU and the runtime it was
captured with)."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

#: Events stored per entry at most (a program's trace beyond this keeps its peaks only).
MAX_STORED_EVENTS = 300_000


def torch_workloads() -> dict[str, tuple[Callable[[], Any], tuple[int, ...]]]:
    """Every PyTorch accuracy workload: name -> (factory, batch sizes)."""
    import accuracy_workloads as W

    out: dict[str, tuple[Callable[[], Any], tuple[int, ...]]] = dict(W.TORCH_WORKLOADS)
    try:
        import third_party_workloads as TP
    except ImportError:  # pragma: no cover - transformers / SB3 missing
        return out
    out.update(TP.THIRD_PARTY_WORKLOADS)
    return out


def jax_workloads() -> dict[str, tuple[Callable[[], Any], tuple[int, ...]]]:
    import accuracy_workloads as W

    return dict(W.JAX_WORKLOADS)


def cpu_workloads() -> dict[str, tuple[Callable[[], Any], int]]:
    """Small versions for the CPU corpus: name -> (factory, batch size)."""
    import accuracy_workloads as W

    out: dict[str, tuple[Callable[[], Any], int]] = {
        "cpu_ppo_mlp": (lambda: W.make_ppo_mlp(32, 4, 128), 256),
        "cpu_dqn_cnn": (lambda: W.make_dqn_cnn(84), 16),
        "cpu_bn_convnet": (lambda: W.make_bn_convnet(32), 16),
        "cpu_checkpointed_mlp": (lambda: W.make_checkpointed_mlp(128, 4), 64),
        "cpu_transformer_block": (lambda: W.make_transformer_block(64, 16), 8),
        "cpu_gpt_small": (lambda: W.make_gpt(vocab=1024, seq=64, dim=128, layers=2), 4),
    }
    try:
        import third_party_workloads as TP
    except ImportError:  # pragma: no cover
        return out
    for name, (factory, batch) in TP.SMALL_THIRD_PARTY.items():
        out[f"cpu_{name}"] = (factory, batch)
    return out


_TAG = "memfit_op:"


def _op_mode() -> Any:
    """A dispatch mode that runs every ATen op inside a Python function named after it, so
    ``_record_memory_history(stacks="python")`` names the op of every allocation."""
    from torch.utils._python_dispatch import TorchDispatchMode

    def call(func: Any, args: Any, kwargs: Any) -> Any:
        return func(*args, **kwargs)

    cache: dict[Any, Callable[..., Any]] = {}

    class OpTags(TorchDispatchMode):  # type: ignore[misc]
        def __torch_dispatch__(
            self, func: Any, types_: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            runner = cache.get(func)
            if runner is None:
                tag = f"{_TAG}{func}"
                names = {"co_name": tag}
                if hasattr(call.__code__, "co_qualname"):  # Python 3.11+ frames show it
                    names["co_qualname"] = tag
                code = call.__code__.replace(**names)
                runner = cache[func] = types.FunctionType(code, call.__globals__)
            return runner(func, args, kwargs or {})

    return OpTags()


def _compress_trace(snapshot: dict[str, Any], device: int) -> tuple[dict[str, Any], list[str]]:
    """A ``_snapshot()``'s trace on ``device`` as :class:`truth_corpus.Trace`
    columns, read through memfit's one snapshot reader (:mod:`memfit.allocator.snapshot`)."""
    from truth_corpus import ACTIONS, Event, Trace

    from memfit.allocator.snapshot import snapshot_from_data

    notes: list[str] = []
    snap = snapshot_from_data(snapshot, source="torch.cuda.memory._snapshot()", kind="pickle")
    dev = next((d for d in snap.devices if d.device == device), None)
    entries = dev.trace if dev is not None else ()
    events: list[Event] = []
    for i, e in enumerate(entries):
        if e.action not in ACTIONS:
            notes.append(f"unknown action {e.action!r} dropped")
            continue
        if e.action == "free_requested":
            nxt = entries[i + 1] if i + 1 < len(entries) else None
            if nxt is not None and nxt.action == "free_completed" and nxt.addr == e.addr:
                continue  # completed at once: the completion says it all
        op = None
        assert dev is not None
        for frame in reversed(dev.stack_frames(e.stack)):
            if frame.name.startswith(_TAG):
                op = frame.name[len(_TAG) :]
                break
        events.append(Event(e.action, e.addr, e.size, e.stream, op))
    if len(events) > MAX_STORED_EVENTS:
        notes.append(f"trace of {len(events)} events not stored (over {MAX_STORED_EVENTS})")
        return {}, notes
    return Trace.from_events(events).to_json(), notes


def factory_for(entry: Any) -> tuple[Callable[[], Any], int] | None:
    """The step factory and batch of a corpus entry (``None`` for programs and JAX)."""
    if entry.kind != "torch":
        return None
    if entry.device == "cpu":
        found = cpu_workloads().get(entry.workload)
        return None if found is None else (found[0], entry.batch)
    found_t = torch_workloads().get(entry.workload)
    return None if found_t is None else (found_t[0], entry.batch)


def traced_requests(entry: Any) -> list[tuple[int, str | None, str | None]]:
    """The traced request sequence for ``entry``, on its device's side, with modelled
    allocations named."""
    from memfit.estimate.torch.trace import trace_requests

    found = factory_for(entry)
    if found is None:
        raise ValueError(f"{entry.name}: no accuracy workload builds this entry")
    factory, batch = found
    step = factory()
    gpu = _catalog_name(entry.gpu)
    requests = trace_requests(step.build, step.step, step.make_batch, batch, device="cpu", gpu=gpu)
    keep = ("all", "cpu") if entry.device == "cpu" else ("all", "cuda")
    out: list[tuple[int, str | None, str | None]] = []
    for r in requests:
        if r.target not in keep:
            continue
        cause = None
        if r.target != "all" and r.transient:
            cause = "measured kernel scratch"
        elif r.target == "cuda":
            cause = "cuBLAS workspace (modelled)"
        elif r.transient:
            cause = "measured kernel scratch"
        out.append((r.nbytes, r.op, cause))
    return out


def real_requests(entry: Any) -> list[tuple[int, str | None]]:
    assert entry.trace is not None
    return [(e.size, e.op) for e in entry.trace.events() if e.action == "alloc"]


def _catalog_name(gpu: str | None) -> str | None:
    if gpu is None:
        return None
    from memfit.errors import ConfigError
    from memfit.hardware.catalog import gpu as lookup

    try:
        return lookup(gpu).name
    except ConfigError:
        return None


def workspaces(entry: Any) -> list[int]:
    sizes = [
        entry.environment.get("cublas_workspace_bytes"),
        entry.environment.get("cublaslt_workspace_bytes"),
    ]
    out = [int(s) for s in sizes if s]
    return out or [8_519_680, 33_554_432, 1_048_576]


def cudnn_text(version: Any) -> str | None:
    """``torch.backends.cudnn.version()`` as text: ``91900`` -> ``"9.19.0"`` (cuDNN 9's
    ``major * 10000 + minor * 100 + patch``), ``8907`` -> ``"8.9.7"`` (cuDNN 8's
    ``major * 1000 + minor * 100 + patch``)."""
    if not isinstance(version, int) or version <= 0:
        return None
    if version >= 90000:
        return f"{version // 10000}.{version % 10000 // 100}.{version % 100}"
    return f"{version // 1000}.{version % 1000 // 100}.{version % 100}"


def entry_runtime(entry: Any) -> dict[str, str] | None:
    """The runtime an entry was captured with (torch, CUDA, cuDNN, driver), for
    ``estimate_torch(runtime=...)``; ``None`` for a CPU entry."""
    env = entry.environment
    if entry.device != "cuda" or not env.get("torch"):
        return None
    out = {"torch": str(env["torch"]).split("+")[0]}
    for key in ("cuda", "driver"):
        if env.get(key):
            out[key] = str(env[key])
    cudnn = cudnn_text(env.get("cudnn"))
    if cudnn is not None:
        out["cudnn"] = cudnn
    return out


def predict(entry: Any) -> dict[str, Any]:
    """What the estimator predicts for ``entry`` (traced on this machine's CPU, for the
    entry's GPU and the runtime it was captured with): the peaks, and for a GPU the band of
    the allocated and reserved ones (``(low, high)`` bytes, ``TorchEstimate.band``)."""
    from memfit.estimate.torch.trace import estimate_torch

    found = factory_for(entry)
    if found is None:
        return {}
    factory, batch = found
    step = factory()
    gpu = _catalog_name(entry.gpu)
    est = estimate_torch(
        step.build,
        step.step,
        step.make_batch,
        [batch],
        device="cpu",
        gpu=gpu,
        runtime=entry_runtime(entry),
    )
    point = est.points[0]
    out: dict[str, Any] = {
        "exact_peak": point.exact_peak,
        "allocated_peak": point.allocated_peak,
        "reserved_peak": point.reserved_peak,
    }
    if est.gpu is not None:
        out["allocated_band"] = est.band("allocated_peak")
        out["reserved_band"] = est.band("reserved_peak")
    return out
