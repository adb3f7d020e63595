"""Child process of :mod:`memfit.estimate.xla.gpu`: compile exported steps for a GPU target.

Run as a script (``python _gpu_child.py REQUEST.json``), never imported by memfit: it
sets ``JAX_PLATFORMS=cpu`` for its own process only (the CUDA plugin then skips its driver
check and registers the compile-only topology), compiles every job of the request with XLA's
GPU compiler for the target config, and prints one JSON line per job on stdout. Before each
job it writes a marker line to file descriptor 2, so the parent can tell which job XLA's own
log lines (rematerialization, sort fallback) belong to. A crash of XLA (a signal) ends only
this process.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from typing import Any

MARKER = "memfit-xla-gpu-job "
_SHAPE = re.compile(
    r"\b(pred|s4|u4|s8|u8|s16|u16|f16|bf16|s32|u32|f32|s64|u64|f64|c64|c128|f8e4m3fn|f8e5m2|f8e4m3fnuz|f8e5m2fnuz|token)\[([0-9,]*)\]"
)
_BYTES = {
    "pred": 1,
    "s4": 1,
    "u4": 1,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
    "f8e4m3fn": 1,
    "f8e5m2": 1,
    "f8e4m3fnuz": 1,
    "f8e5m2fnuz": 1,
    "token": 0,
}
_GEMM = ('"__cublas$gemm"', '"__cublas$lt$matmul"', "_gemm_fusion", '"__cudnn$')
_DEF = re.compile(r"^\s*(?:ROOT )?%(\S+) = (.+?) ([a-z][a-z0-9-]*)\((.*?)\)(?:, |$)")


def _shape_bytes(dtype: str, dims: str) -> int:
    n = 1
    for d in dims.split(","):
        if d:
            n *= int(d)
    return n * _BYTES[dtype]


def _gemm_buffers(hlo: str) -> list[dict[str, Any]]:
    """For each GEMM or cuDNN call of the optimized HLO's entry and loop bodies, how XLA's
    autotuner tunes it (``kind``: ``"cublas"`` for a cuBLAS custom call, ``"cudnn"`` for a
    cuDNN one, ``"fusion"`` for a Triton or cuDNN GEMM fusion) and the bytes of its results
    and operands (the buffers the autotuner allocates for it on a device)."""
    sizes: dict[str, list[int]] = {}
    shapes: dict[str, list[Any] | None] = {}
    found: list[dict[str, Any]] = []
    for line in hlo.splitlines():
        match = _DEF.match(line)
        if match is None:
            continue
        name, result, op, operands = match.groups()
        result_sizes = [_shape_bytes(t, d) for t, d in _SHAPE.findall(result)]
        sizes[name] = result_sizes
        shapes[name] = _first_shape(result)
        if op == "custom-call" and any(t in line for t in _GEMM[:2]):
            kind = "cublas"
        elif op == "custom-call" and _GEMM[3] in line:
            kind = "cudnn"
        elif (
            op == "fusion"
            and "kind=kCustom" in line
            and (_GEMM[2] in line or "__cudnn$fusion" in line)
        ):
            kind = "fusion"
        else:
            continue
        names = re.findall(r"%([^\s,()]+)", operands)
        operand_sizes = [sum(sizes.get(operand, [0])) for operand in names]
        entry: dict[str, Any] = {"kind": kind, "results": result_sizes, "operands": operand_sizes}
        if kind == "cudnn":
            conv = _conv(line, result, [shapes.get(operand) for operand in names])
            if conv is not None:
                entry["conv"] = conv
        found.append(entry)
    return found


def _first_shape(text: str) -> list[Any] | None:
    """``[dtype, [dims]]`` of the first array shape in ``text``."""
    found = _SHAPE.search(text)
    if found is None:
        return None
    return [found.group(1), [int(d) for d in found.group(2).split(",") if d]]


_CONV_KIND = {
    "convForward": "forward",
    "convBiasActivationForward": "forward",
    "convBackwardInput": "backward_input",
    "convBackwardFilter": "backward_filter",
}


def _conv(line: str, result: str, operands: list[Any]) -> dict[str, Any] | None:
    """What sizes a cuDNN convolution custom call's workspace: its kind (the forward
    convolution's input, filter and output are the call's operands and result in an order
    the kind decides), ``dim_labels`` and the three shapes (``[dtype, [dims]]``)."""
    target = re.search(r'custom_call_target="__cudnn\$(\w+)"', line)
    labels = re.search(r"dim_labels=(\S+?)(?:,|$)", line)
    groups = re.search(r"feature_group_count=(\d+)", line)
    out = _first_shape(result)
    if target is None or labels is None or out is None or len(operands) < 2:
        return None
    kind = _CONV_KIND.get(target.group(1))
    if kind is None or operands[0] is None or operands[1] is None:
        return None
    return {
        "kind": kind,
        "dim_labels": labels.group(1),
        "groups": int(groups.group(1)) if groups else 1,
        "shapes": [operands[0], operands[1], out],
    }


def _sorts(hlo: str) -> list[dict[str, Any]]:
    """Each ``sort`` of the optimized HLO: its operands' ``[dtype, [dims]]`` (the result
    tuple's elements, in order) and the sorted dimension; what XLA's ``SortRewriter`` turns
    into a CUB radix sort on a device, with its scratch."""
    found: list[dict[str, Any]] = []
    for line in hlo.splitlines():
        match = _DEF.match(line)
        if match is None or match.group(3) != "sort":
            continue
        shapes = [
            [t, [int(d) for d in dims.split(",") if d]]
            for t, dims in _SHAPE.findall(match.group(2))
        ]
        dimension = re.search(r"dimensions=\{(\d+)\}", line)
        found.append({"shapes": shapes, "dimension": int(dimension.group(1)) if dimension else -1})
    return found


_COLLECTIVES = (
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
    "ragged-all-to-all",
)


def _collectives(hlo: str) -> list[list[Any]]:
    """``[op, result bytes]`` of each collective of the optimized HLO (their ``-start`` halves
    where XLA made them asynchronous): what one device sends or receives through NCCL."""
    found: list[list[Any]] = []
    for line in hlo.splitlines():
        match = _DEF.match(line)
        if match is None:
            continue
        _, result, op, _ = match.groups()
        base = op[: -len("-start")] if op.endswith("-start") else op
        if base in _COLLECTIVES:
            found.append([base, sum(_shape_bytes(t, d) for t, d in _SHAPE.findall(result))])
    return found


def _compile(job: dict[str, Any], config: str, topology: Any, jax: Any) -> dict[str, Any]:
    from jax import export
    from jax.experimental import topologies
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as _PartitionSpec

    partition_spec: Any = _PartitionSpec  # untyped in jax's stubs
    with open(job["exported"], "rb") as f:
        exp: Any = export.deserialize(bytearray(f.read()))
    axes = job.get("mesh") or []
    if axes:  # sharded over several devices: the same mesh over the compile-only devices
        names = tuple(str(name) for name, _ in axes)
        mesh = topologies.make_mesh(topology, tuple(int(size) for _, size in axes), names)
    else:
        mesh = topologies.make_mesh(topology, (1,), ("x",))
    specs = job.get("specs") or [None] * len(exp.in_avals)
    avals = []
    for aval, spec in zip(exp.in_avals, specs, strict=True):
        entries = [tuple(e) if isinstance(e, list) else e for e in (spec or [])]
        sharding = NamedSharding(mesh, partition_spec(*entries))
        avals.append(jax.ShapeDtypeStruct(aval.shape, aval.dtype, sharding=sharding))

    def flat(*leaves: Any) -> Any:
        args, kwargs = jax.tree_util.tree_unflatten(exp.in_tree, leaves)
        return exp.call(*args, **kwargs)

    start = time.perf_counter()
    lowered = jax.jit(flat, donate_argnums=tuple(job["donate"])).lower(*avals)
    compiled = lowered.compile()
    stats = compiled.memory_analysis()
    try:
        hlo = compiled.as_text() or ""
    except Exception:  # the analysis stands without the HLO text
        hlo = ""

    def get(analysis: Any, name: str) -> int:
        return int(getattr(analysis, name, 0) or 0)

    gemms = _gemm_buffers(hlo)
    result: dict[str, Any] = {
        "ok": True,
        "argument": get(stats, "argument_size_in_bytes"),
        "output": get(stats, "output_size_in_bytes"),
        "alias": get(stats, "alias_size_in_bytes"),
        "temp": get(stats, "temp_size_in_bytes"),
        "code": get(stats, "generated_code_size_in_bytes"),
        "gemms": gemms,
        "collectives": _collectives(hlo),
        "sorts": _sorts(hlo),
    }
    if job.get("cublas_variant") and any(g["kind"] == "fusion" for g in gemms):
        # On a device the autotuner may pick cuBLAS for any GEMM fusion; the fusion is then
        # inlined and its fused operands become buffers of their own. The same step with
        # every GEMM on cuBLAS bounds that (the deviceless compile picks default tilings).
        os.write(2, f"\n{MARKER}cublas\n".encode())
        try:
            variant = lowered.compile(compiler_options={"xla_gpu_enable_triton_gemm": False})
            result["cublas_temp"] = get(variant.memory_analysis(), "temp_size_in_bytes")
            # the cuBLAS calls the fusions become: the autotuner tunes them again as calls
            result["cublas_gemms"] = [
                g for g in _gemm_buffers(variant.as_text() or "") if g["kind"] == "cublas"
            ]
        except Exception as exc:  # the step's own compile stands; the parent says so
            result["cublas_error"] = f"{type(exc).__name__}: {exc}"[:300]
    result["seconds"] = round(time.perf_counter() - start, 3)
    return result


def main(path: str) -> int:
    """Compile the request at ``path``; one JSON line per job on stdout."""
    os.environ["JAX_PLATFORMS"] = "cpu"
    with open(path, encoding="utf-8") as f:
        request = json.load(f)
    import jax
    from jax.experimental import topologies

    try:
        topology = topologies.get_topology_desc(
            platform="cuda",
            target_config=request["config"],
            topology=f"1x1x{int(request.get('devices', 1))}",
        )
    except Exception as exc:
        print(
            json.dumps({"ok": False, "stage": "topology", "error": f"{type(exc).__name__}: {exc}"})
        )
        return 0
    for index, job in enumerate(request["jobs"]):
        os.write(2, f"\n{MARKER}{index}\n".encode())
        try:
            result = _compile(job, request["config"], topology, jax)
        except Exception as exc:
            result = {"ok": False, "stage": "compile", "error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
