"""memfit's figure for each published multi-GPU reading
(``tests/data/published_truth/multi_gpu/readings.yaml``) and its error: ``bench/multi_gpu_truth.py``
writes the table, tests/hardware/test_multi_gpu_truth.py checks it."""

from __future__ import annotations

from typing import Any

from memfit.core.families.common import ddp_terms
from memfit.core.multi_gpu import device_terms, stray_context
from memfit.hardware.catalog import gpu
from memfit.hardware.cuda import cuda_context_bytes
from memfit.hardware.nccl import nccl_memory
from memfit.hardware.runtime import cuda_context, parse_runtime

MiB = 2**20
#: The caching allocator's small-pool segment (kSmallBuffer, 2 MiB).
SEGMENT = 2 * MiB


def gradient_bucket_bytes(setup: dict[str, Any]) -> int:
    """What ``gradient_as_bucket_view=True`` saves at the peak in memfit's DDP terms: the
    buckets kept beside the gradients without it, less those kept with it."""
    grads = int(
        setup.get("parameter_bytes") or int(setup["parameters"]) * int(setup["param_bytes"])
    )

    def kept(view: bool) -> int:
        return sum(sum(t.tensors) for t in ddp_terms(grads, view))

    return kept(False) - kept(True)


def predict(reading: dict[str, Any]) -> int:
    """memfit's figure for what the reading measured, in bytes."""
    setup = reading["setup"]
    quantity = reading["quantity"]
    if quantity == "ddp_gradient_buckets":
        return gradient_bucket_bytes(setup)
    spec = gpu(setup["gpu"])
    if quantity == "nccl_per_communicator":
        est = nccl_memory(
            setup["ranks"],
            setup["topology"],
            nccl=setup["nccl"],
            capability=spec.compute_capability,
        )
        return est.total_bytes
    if quantity == "nccl_nvls":
        est = nccl_memory(
            setup["ranks"],
            setup["topology"],
            nccl=setup["nccl"],
            capability=spec.compute_capability,
        )
        return next(t.bytes for t in est.terms if t.name == "nccl_nvls")
    if quantity == "nccl_p2p_buffers":
        est = nccl_memory(
            setup["ranks"],
            setup["topology"],
            nccl=setup["nccl"],
            capability=spec.compute_capability,
            all_to_all=True,
        )
        return next(t.bytes for t in est.terms if t.name == "nccl_p2p_buffers")
    if quantity == "cuda_context":
        return cuda_context_bytes(spec, runtime=parse_runtime(setup["runtime"]))
    if quantity == "stray_cuda_context":
        init = setup.get("stray_init", "unknown")
        return stray_context(spec, parse_runtime(setup["runtime"]), init)[0]
    if quantity == "device_used" and setup["framework"] == "torch":
        # a rank's own device: its CUDA context (with the step's kernels), the collective
        # terms on every device, and its tensors in whole caching-allocator segments
        runtime = parse_runtime(setup["runtime"])
        terms, _ = device_terms(
            spec,
            setup["ranks"],
            framework="torch",
            strategy=setup["strategy"],
            topology=setup["topology"],
            nccl=setup["nccl"],
            nccl_env=setup.get("nccl_env"),
        )
        segments = -(-int(setup["tensor_bytes"]) // SEGMENT) * SEGMENT
        return (
            cuda_context(spec, runtime).bytes
            + segments
            + sum(t.bytes for t in terms if not t.device0_only)
        )
    if quantity == "device_used":
        terms, _ = device_terms(
            spec,
            setup["ranks"],
            framework=setup["framework"],
            strategy="pmap",
            topology=setup["topology"],
            nccl=setup["nccl"],
            jaxlib=setup.get("jaxlib"),
        )
        # the one-device plan, with the context memfit counted then replaced by
        # today's (a JAX step's context on the card: hardware.runtime.cuda_context)
        context = cuda_context(spec, framework=setup["framework"]).bytes
        one_device = (
            int(reading["single_device_plan_mib"]) - int(reading["single_device_context_mib"])
        ) * MiB + context
        return one_device + sum(t.bytes for t in terms if not t.device0_only)
    raise ValueError(f"unknown quantity {quantity!r}")


def rows(part: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each reading with its prediction and error."""
    out = []
    for reading in part:
        real = round(float(reading["value"]) * int(reading["unit_bytes"]))
        pred = predict(reading)
        err = (pred - real) / real if real else None  # as bench/_common.rel_err
        out.append(
            {
                "id": reading["id"],
                "quantity": reading["quantity"],
                "measured_mib": real / MiB,
                "predicted_mib": pred / MiB,
                "error": err,
                "source": reading["source"].get("url")
                or reading["source"].get("where")
                or "primary source not located",
            }
        )
    return out
