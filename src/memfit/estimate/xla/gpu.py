"""XLA's GPU compiler for a named card, on a machine without that card (or any GPU).

A jitted step is exported for CUDA (``jax.export.export(..., platforms=("cuda",))``: the
StableHLO a GPU would get, donations included) in the caller's process, and compiled in a
child process with compile-only CUDA devices made from the card's target config
(:mod:`memfit.hardware.xla_target`; ``jax.experimental.topologies.get_topology_desc``). The
child is needed for three reasons: the route needs ``JAX_PLATFORMS=cpu`` before JAX starts
(memfit never changes the caller's JAX platform), XLA writes its rematerialization verdict to
file descriptor 2 rather than raising it, and a target config XLA cannot use crashes the
process (a floating point exception) instead of raising.

The child needs the ``gpu-target`` extra: ``jax-cuda12-plugin`` and ``jax-cuda12-pjrt`` at
the installed jaxlib's version, ``nvidia-cuda-nvcc-cu12`` (ptxas and libdevice) and
``flatbuffers`` (the exported step's serialization).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata, util
from pathlib import Path
from typing import Any

from memfit.errors import BackendUnavailable, ConfigError, EstimateError
from memfit.estimate.xla._callbacks import HeldByCallbacks
from memfit.estimate.xla.runtime import (
    DEFAULT_WORKSPACE,
    HOPPER_WORKSPACE,
    GemmBuffers,
    cub_sort_scratch_bytes,
    xla_flag,
)
from memfit.hardware.xla_target import TargetConfig, base_for_limit

__all__ = [
    "EXTRA_INSTALL",
    "ExportedStep",
    "GpuCompile",
    "RematShortfall",
    "compile_exported",
    "compile_for_gpu",
    "cpu_fallback_note",
    "cublas_may_replace_triton",
    "export_or_fall_back",
    "export_step",
    "gpu_target_missing",
    "parse_remat",
]

#: The command that installs what the GPU compile needs.
EXTRA_INSTALL = 'pip install "memfit[gpu-target]"'

#: Seconds one child process may take before it is stopped.
CHILD_TIMEOUT_S = 900.0

_REMAT = re.compile(
    r"Can't reduce memory use below \S+ \((\d+) bytes\) by rematerialization; only reduced "
    r"to \S+ \((\d+) bytes\)(?:, down from \S+ \((\d+) bytes\) originally)?"
)
_SORT_FALLBACK = "Missing deviceless CUB scratch size data for sort"


@dataclass(frozen=True)
class RematShortfall:
    """XLA's rematerialization could not bring the step under its memory limit.

    Attributes:
        limit_bytes: The limit it worked under (``GetSchedulerMemoryLimit``).
        reduced_to_bytes: What it got the step's memory down to.
        original_bytes: What the step needed before rematerialization, where XLA says.
    """

    limit_bytes: int
    reduced_to_bytes: int
    original_bytes: int | None

    def sentence(self) -> str:
        """The verdict in words."""
        from memfit.units import format_bytes

        return (
            f"does not fit: XLA's GPU compiler could not get the step under its memory limit "
            f"of {format_bytes(self.limit_bytes)} by rematerialization (only down to "
            f"{format_bytes(self.reduced_to_bytes)})"
        )


def parse_remat(log: str) -> RematShortfall | None:
    """XLA's rematerialization verdict in a compile's log, or ``None`` when it has none.

    >>> parse_remat("W hlo_rematerialization.cc:3231] Can't reduce memory use below 2.28GiB "
    ...     "(2448288638 bytes) by rematerialization; only reduced to 12.00GiB (12890144804 "
    ...     "bytes), down from 16.00GiB (17185112100 bytes) originally").limit_bytes
    2448288638
    """
    match = _REMAT.search(log)
    if match is None:
        return None
    original = match.group(3)
    return RematShortfall(
        int(match.group(1)), int(match.group(2)), int(original) if original else None
    )


@dataclass(frozen=True)
class GpuCompile:
    """XLA:GPU's memory analysis of one step compiled for a target (bytes).

    Attributes:
        argument_bytes: Input buffers.
        output_bytes: Output buffers.
        alias_bytes: Outputs that reuse donated inputs.
        temp_bytes: XLA's temporaries (one buffer on a GPU).
        generated_code_bytes: The compiled code.
        compiled_for: What it was compiled for (``"cuda sm_89 (NVIDIA GeForce RTX 4070)"``).
        memory_base_bytes: The ``device_memory_size`` the compile worked from.
        remat: XLA's rematerialization verdict when it could not fit its limit, else ``None``.
        gemm_buffers: For each GEMM / cuDNN call, how XLA tunes it and the bytes of its
            buffers (what the autotuner allocates for it on a device).
        warnings: What XLA said it could not do without a device (sort scratch).
        seconds: The compile's time in the child.
        devices: The devices the step was compiled for (``topology="1x1xN"``): the figures
            are per device (XLA's SPMD partitioner gives each device the same program).
        collectives: ``(op, result bytes)`` of each collective in the compiled program.
        cublas_temp_bytes: XLA's temporaries when every GEMM fusion runs on cuBLAS instead
            (``xla_gpu_enable_triton_gemm=false``): on a device the autotuner may pick cuBLAS
            for any GEMM fusion (``xla_gpu_cublas_fallback``), and the fusion's fused operands
            then become buffers of their own; ``None`` when the step has no GEMM fusion or
            the flags rule cuBLAS out.
        cublas_gemm_buffers: The cuBLAS calls of that variant (:attr:`gemm_buffers` of the
            step compiled with ``xla_gpu_enable_triton_gemm=false``): a GEMM fusion the
            autotuner hands to cuBLAS is inlined as such a call, which the autotuner then
            tunes again as a call; ``()`` when there is no variant.
        callbacks: What the step's host callbacks hold on the device (their operands and
            results), compiled without them; ``None`` when it had none.
        route: How the step was exported (:attr:`ExportedStep.route`).
        sort_scratch_bytes: What the step's largest sort adds on a device, where the deviceless
            compile kept XLA's own sort for want of CUB's scratch sizes
            (:func:`memfit.estimate.xla.runtime.cub_sort_scratch_bytes`); 0 otherwise.
    """

    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    generated_code_bytes: int
    compiled_for: str
    memory_base_bytes: int
    remat: RematShortfall | None = None
    gemm_buffers: tuple[GemmBuffers, ...] = ()
    warnings: tuple[str, ...] = ()
    seconds: float = 0.0
    devices: int = 1
    collectives: tuple[tuple[str, int], ...] = ()
    cublas_temp_bytes: int | None = None
    cublas_gemm_buffers: tuple[GemmBuffers, ...] = ()
    callbacks: HeldByCallbacks | None = None
    route: str = "export"
    sort_scratch_bytes: int = 0

    @property
    def device_temp_bytes(self) -> int:
        """The temporaries a device may need: the larger of the compile's and its cuBLAS
        variant's (the autotuner's choice between them is made on the device)."""
        return max(self.temp_bytes, self.cublas_temp_bytes or 0)


@dataclass(frozen=True)
class ExportedStep:
    """A step exported for CUDA: its serialization, which flat arguments it donates and, for
    a step sharded over several devices, its mesh and each flat argument's partition.

    Attributes:
        serialized: ``jax.export``'s serialization.
        donate: Flat argument indices it donates.
        mesh: ``((axis name, size), ...)`` of the devices its arguments are sharded over;
            ``()`` for a step on one device.
        specs: For each flat argument, its ``PartitionSpec`` entries (``None``, an axis
            name, or a list of axis names per dimension); ``()`` for one device.
        held: What the step's host callbacks hold on the device, when they were replaced
            for the export (``route="callbacks"``), else ``None``.
        route: How it was exported: ``"export"`` (``jax.export`` as it is),
            ``"callbacks"`` (its host callbacks replaced by what they hold) or ``"lowered"``
            (``jax.export`` refused it; lowered for CUDA directly and wrapped).
    """

    serialized: bytes
    donate: tuple[int, ...] = field(default=())
    mesh: tuple[tuple[str, int], ...] = ()
    specs: tuple[tuple[Any, ...] | None, ...] = ()
    held: HeldByCallbacks | None = None
    route: str = "export"

    @property
    def devices(self) -> int:
        """How many devices the step runs on (the mesh's size)."""
        count = 1
        for _, size in self.mesh:
            count *= size
        return count


def _mesh_and_specs(
    leaves: Sequence[Any],
) -> tuple[tuple[tuple[str, int], ...], tuple[tuple[Any, ...] | None, ...]]:
    """The mesh the leaves are sharded over (``NamedSharding`` on a mesh of several
    devices, concrete or ``jax.sharding.AbstractMesh``) and each leaf's partition.

    Raises:
        ConfigError: When the leaves are sharded over different meshes.
    """
    from jax.sharding import NamedSharding

    mesh: tuple[tuple[str, int], ...] = ()
    specs: list[tuple[Any, ...] | None] = []
    for index, leaf in enumerate(leaves):
        sharding = getattr(leaf, "sharding", None)
        if not isinstance(sharding, NamedSharding) or sharding.mesh.size <= 1:
            specs.append(None)
            continue
        axes = tuple(
            (str(name), int(size))
            for name, size in zip(sharding.mesh.axis_names, sharding.mesh.axis_sizes, strict=True)
        )
        if mesh and axes != mesh:
            raise ConfigError(
                f"argument leaf {index} is sharded over mesh {dict(axes)}, another over "
                f"{dict(mesh)}",
                key_path="args",
                hint="shard every argument over the same mesh (one jax.sharding.Mesh or "
                "AbstractMesh)",
            )
        mesh = axes
        entries: list[Any] = []
        for entry in sharding.spec:
            if entry is None or isinstance(entry, str):
                entries.append(entry)
            else:
                entries.append([str(e) for e in entry])
        specs.append(tuple(entries))
    if not mesh:
        return (), ()
    return mesh, tuple(() if spec is None else spec for spec in specs)


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def gpu_target_missing() -> list[str]:
    """What the GPU compile still needs here, as sentences; ``[]`` when it is ready.

    Reads package metadata only (nothing of the CUDA plugin is imported).
    """
    jaxlib = _version("jaxlib")
    if jaxlib is None or util.find_spec("jax") is None:
        return ["jax is not installed"]
    missing = []
    # jax's CUDA plugin comes for CUDA 12 (the extra's) or CUDA 13 (``jax[cuda13]``); either
    # compiles for a compile-only CUDA topology
    family = next(
        (cuda for cuda in ("cuda12", "cuda13") if _version(f"jax-{cuda}-plugin") is not None),
        "cuda12",
    )
    for name in (f"jax-{family}-plugin", f"jax-{family}-pjrt"):
        found = _version(name)
        if found is None:
            missing.append(f"{name} is not installed")
        elif found != jaxlib:
            missing.append(f"{name} {found} does not match jaxlib {jaxlib}")
    nvcc = "nvidia-cuda-nvcc-cu12" if family == "cuda12" else "nvidia-cuda-nvcc"
    if _version(nvcc) is None and shutil.which("ptxas") is None:
        missing.append(f"no ptxas ({nvcc} is not installed)")
    if _version("flatbuffers") is None:
        missing.append("flatbuffers is not installed")
    return missing


def _donated(module_text: str, kept: Sequence[int]) -> tuple[int, ...]:
    """Flat argument indices that the exported ``main`` donates (``tf.aliasing_output`` or
    ``jax.buffer_donor`` on its arguments; ``kept`` maps its arguments to the flat ones)."""
    start = module_text.find("@main(")
    if start < 0:
        return ()
    depth, end = 0, start + len("@main")
    for end in range(start + len("@main"), len(module_text)):
        char = module_text[end]
        depth += char == "("
        depth -= char == ")"
        if depth == 0:
            break
    signature = module_text[start:end]
    args = re.split(r"%arg(\d+):", signature)[1:]
    donated = []
    for number, text in zip(args[::2], args[1::2], strict=True):
        if "tf.aliasing_output" in text or "jax.buffer_donor" in text:
            position = int(number)
            if position < len(kept):
                donated.append(int(kept[position]))
    return tuple(donated)


def export_step(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> ExportedStep:
    """Export ``fn`` (jitted or not) for CUDA at these arguments, in this process.

    Raises:
        EstimateError: When JAX cannot trace or export the step.
        BackendUnavailable: When ``flatbuffers`` (the serialization) is missing.
    """
    import jax
    from jax import export

    jitted: Any = fn if hasattr(fn, "lower") else jax.jit(fn)
    every_call = [export.DisabledSafetyCheck.custom_call("ALL")]  # the child has this jaxlib
    leaves, tree = jax.tree_util.tree_flatten((args, kwargs))

    def flat(*flat_leaves: Any) -> Any:
        call_args, call_kwargs = jax.tree_util.tree_unflatten(tree, flat_leaves)
        return jax.tree_util.tree_leaves(jitted(*call_args, **call_kwargs))

    try:
        # exported as it is first, for the donations its own jit declares; then over flat
        # leaves, so pytrees of any class (Brax's states) serialize
        own = export.export(jitted, platforms=("cuda",), disabled_checks=every_call)(
            *args, **kwargs
        )
        donate = _donated(own.mlir_module(), own.module_kept_var_idx)
        exported = export.export(
            jax.jit(flat, donate_argnums=donate), platforms=("cuda",), disabled_checks=every_call
        )(*leaves)
        serialized = bytes(exported.serialize())
        mesh, specs = _mesh_and_specs(leaves)
    except ImportError as exc:
        raise BackendUnavailable(
            f"exporting the step for the GPU compile failed: {exc}", hint=EXTRA_INSTALL
        ) from exc
    except (TypeError, ValueError, NotImplementedError, jax.errors.JAXTypeError) as exc:
        # jax.export raises NotImplementedError for a primitive with no CUDA lowering (a
        # CPU-only custom call) and ValueError for a host callback (its lowering asks this
        # process's CPU backend): the callbacks are taken out first, then the step is lowered
        # for CUDA directly
        return _export_fallback(flat, leaves, exc)
    return ExportedStep(serialized=serialized, donate=donate, mesh=mesh, specs=specs)


def _export_fallback(
    flat: Callable[..., Any], leaves: Sequence[Any], first: Exception
) -> ExportedStep:
    """The step exported after ``jax.export`` refused it (``first``): with its host callbacks
    replaced (:mod:`memfit.estimate.xla._callbacks`) when it has any, else lowered for CUDA
    directly (``jit(...).trace(...).lower(lowering_platforms=("cuda",))``) and wrapped as an
    export.

    Raises:
        EstimateError: When neither route gives a CUDA export (the caller may compile on its
            own backend instead).
    """
    import jax
    from jax import export

    from memfit.estimate.xla._callbacks import strip_callbacks

    every_call = [export.DisabledSafetyCheck.custom_call("ALL")]
    mesh, specs = _mesh_and_specs(leaves)
    reasons = [f"{type(first).__name__}: {first}"]
    try:
        stripped = strip_callbacks(flat, leaves)
    except Exception as exc:  # JAX's own re-trace failed: the direct lowering is next
        stripped = None
        reasons.append(f"replacing its host callbacks failed ({type(exc).__name__}: {exc})")
    if stripped is not None:
        run, donate, held = stripped
        try:
            exported = export.export(
                jax.jit(run, donate_argnums=donate), platforms=("cuda",),
                disabled_checks=every_call,
            )(*leaves)  # fmt: skip
            return ExportedStep(
                serialized=bytes(exported.serialize()), donate=donate, mesh=mesh, specs=specs,
                held=held, route="callbacks",
            )  # fmt: skip
        except Exception as exc:
            reasons.append(
                f"with its {held.describe()} replaced it still failed ({type(exc).__name__}: {exc})"
            )
    try:
        from jax._src.export import _export

        traced = jax.jit(flat).trace(*leaves)
        lowered = traced.lower(lowering_platforms=("cuda",))
        exported = _export._export_lowered(
            lowered, traced.jaxpr, "memfit_step", disabled_checks=every_call
        )
        donate = _donated(exported.mlir_module(), exported.module_kept_var_idx)
        return ExportedStep(
            serialized=bytes(exported.serialize()), donate=donate, mesh=mesh, specs=specs,
            route="lowered",
        )  # fmt: skip
    except Exception as exc:
        reasons.append(f"lowering it for CUDA directly failed ({type(exc).__name__}: {exc})")
    raise EstimateError(
        "JAX could not export the step for CUDA: " + "; ".join(reasons),
        hint="the step must be jit-able at these argument shapes; values that decide "
        "control flow must be static",
    ) from first


def _child_env(environ: Mapping[str, str] | None) -> dict[str, str]:
    env = dict(os.environ if environ is None else environ)
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # the rematerialization verdict is a warning
    return env


def _split_log(stderr: str, jobs: int) -> list[str]:
    from memfit.estimate.xla._gpu_child import MARKER

    parts = [""] * jobs
    current = -1
    for line in stderr.splitlines():
        if line.startswith(MARKER):  # a job's index; "cublas": its cuBLAS variant, not kept
            rest = line[len(MARKER) :].strip()
            current = int(rest) if rest.isdigit() else -1
            continue
        if 0 <= current < jobs:
            parts[current] += line + "\n"
    return parts


def cublas_may_replace_triton(environ: Mapping[str, str]) -> bool:
    """Whether a device's GEMM autotuner may replace a Triton GEMM fusion by a cuBLAS call:
    yes unless ``XLA_FLAGS`` turns off Triton GEMMs (the compile is then cuBLAS already),
    the cuBLAS fallback (``xla_gpu_cublas_fallback``, default true in
    ``xla/debug_options_flags.cc``; ``gemm_fusion_autotuner.cc`` adds cuBLAS as a candidate
    and, when it wins, inlines the fusion back for the GEMM rewriter) or autotuning
    (``xla_gpu_autotune_level=0``: default tilings, as the deviceless compile).

    >>> cublas_may_replace_triton({})
    True
    >>> cublas_may_replace_triton({"XLA_FLAGS": "--xla_gpu_cublas_fallback=false"})
    False
    """
    off = ("false", "0")
    flags = ("xla_gpu_enable_triton_gemm", "xla_gpu_cublas_fallback", "xla_gpu_autotune_level")
    return all((xla_flag(environ, name) or "true").lower() not in off for name in flags)


def _tail(text: str, lines: int = 6) -> str:
    kept = [line for line in text.splitlines() if "cudart_stub" not in line and line.strip()]
    return "\n".join(kept[-lines:])


def compile_exported(
    steps: Sequence[ExportedStep],
    target: TargetConfig,
    *,
    memory_base_bytes: int | None = None,
    environ: Mapping[str, str] | None = None,
    timeout_s: float = CHILD_TIMEOUT_S,
) -> list[GpuCompile]:
    """Compile exported steps for ``target`` in one child process.

    Args:
        steps: From :func:`export_step`.
        target: The card's target config.
        memory_base_bytes: The memory XLA's limit is taken from (JAX passes its allocator's
            ``bytes_limit``); ``None``: the card's memory (XLA then uses 80% of it).
        environ: The child's environment (default this process's; ``XLA_FLAGS`` apply).
        timeout_s: Seconds before the child is stopped.

    Raises:
        BackendUnavailable: When the ``gpu-target`` extra is missing.
        EstimateError: When the child fails, crashes or times out, or XLA rejects a step.
    """
    missing = gpu_target_missing()
    if missing:
        raise BackendUnavailable(
            "XLA's GPU compiler is not available here: " + "; ".join(missing),
            hint=EXTRA_INSTALL,
        )
    base = (
        target.device_memory_size
        if memory_base_bytes is None
        else base_for_limit(memory_base_bytes)
    )
    child = Path(__file__).with_name("_gpu_child.py")
    results: list[GpuCompile] = []
    with tempfile.TemporaryDirectory(prefix="memfit-xla-gpu-") as folder:
        jobs = []
        devices = {step.devices for step in steps}
        if len(devices) > 1:
            raise ConfigError(
                f"the steps run on different numbers of devices ({sorted(devices)})",
                key_path="steps",
                hint="compile steps sharded over one mesh together, others apart",
            )
        variant = cublas_may_replace_triton(os.environ if environ is None else environ)
        for index, step in enumerate(steps):
            path = Path(folder) / f"step{index}.bin"
            path.write_bytes(step.serialized)
            jobs.append(
                {
                    "exported": str(path),
                    "donate": list(step.donate),
                    "mesh": [list(axis) for axis in step.mesh],
                    "specs": [list(spec) if spec is not None else None for spec in step.specs],
                    "cublas_variant": variant,
                }
            )
        count = devices.pop() if devices else 1
        request = Path(folder) / "request.json"
        for extension in (True, False):
            config = target.text(device_memory_size=base, feature_extension=extension)
            request.write_text(
                json.dumps({"config": config, "jobs": jobs, "devices": count}), encoding="utf-8"
            )
            try:
                done = subprocess.run(
                    [sys.executable, str(child), str(request)],
                    capture_output=True, text=True, env=_child_env(environ),
                    timeout=timeout_s, check=False, stdin=subprocess.DEVNULL,
                )  # fmt: skip
            except subprocess.TimeoutExpired as exc:
                raise EstimateError(
                    f"XLA's GPU compile for {target.name} took more than {timeout_s:.0f} s",
                    hint="compile fewer or smaller steps, or estimate with the CPU compile",
                ) from exc
            lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
            rejected = (
                lines and not lines[0]["ok"] and lines[0].get("stage") == "topology"
                and "GpuTargetConfigProto" in lines[0]["error"]
            )  # fmt: skip
            if not (rejected and extension):
                break
        if done.returncode != 0 or len(lines) != len(jobs):
            how = f"signal {-done.returncode}" if done.returncode < 0 else f"exit {done.returncode}"
            first = lines[0]["error"] if lines and not lines[0]["ok"] else _tail(done.stderr)
            raise EstimateError(
                f"XLA's GPU compile for {target.name} failed ({how}): {first}",
                hint="compare with `memfit gpus NAME --target-config`; the CPU compile "
                "(compiler='cpu') still estimates",
            )
        logs = _split_log(done.stderr, len(jobs))
        for step, line, log in zip(steps, lines, logs, strict=True):
            if not line["ok"]:
                raise EstimateError(
                    f"XLA's GPU compiler rejected the step for {target.name}: {line['error']}",
                    hint="the CPU compile (compiler='cpu') may still estimate it",
                )
            warnings = []
            if line.get("cublas_error"):
                warnings.append(
                    "the step's cuBLAS variant (every GEMM fusion as the cuBLAS call the "
                    f"autotuner may pick) did not compile ({line['cublas_error']}): the "
                    "temporaries are the Triton compile's and may be under-counted"
                )
            # a sort left in the compiled program is one XLA kept for want of CUB's scratch
            # sizes (it says so once a minute, not once a job); sequential sorts share their
            # scratch in buffer assignment: the largest
            sort_scratch = max(
                (cub_sort_scratch_bytes(s) for s in line.get("sorts", [])), default=0
            )
            if _SORT_FALLBACK in log or sort_scratch:
                warnings.append(
                    "a sort was compiled without CUB's scratch sizes (XLA needs a device for "
                    "them): the CUB radix sort a device compiles instead is counted from CUB's "
                    "source (alternate key and value buffers, digit histograms), "
                    f"{sort_scratch:,} B"
                )
            results.append(
                GpuCompile(
                    argument_bytes=line["argument"],
                    output_bytes=line["output"],
                    alias_bytes=line["alias"],
                    temp_bytes=_device_cublas_calls(line["temp"], line["gemms"], target),
                    generated_code_bytes=line["code"],
                    compiled_for=target.compiled_for,
                    memory_base_bytes=base,
                    remat=parse_remat(log),
                    gemm_buffers=tuple(GemmBuffers.from_plain(g) for g in line["gemms"]),
                    warnings=tuple(warnings),
                    seconds=float(line["seconds"]),
                    devices=count,
                    collectives=tuple(
                        (str(op), int(size)) for op, size in line.get("collectives", [])
                    ),
                    cublas_temp_bytes=_device_workspace(line.get("cublas_temp"), target),
                    cublas_gemm_buffers=tuple(
                        GemmBuffers.from_plain(g) for g in line.get("cublas_gemms", [])
                    ),
                    callbacks=step.held,
                    route=step.route,
                    sort_scratch_bytes=sort_scratch,
                )
            )
    return results


def _device_cublas_calls(temp: int, gemms: list[dict[str, Any]], target: TargetConfig) -> int:
    """The compile's temporaries as the card holds them when it has cuBLAS calls of its own
    (``xla_gpu_enable_triton_gemm=false``, Turing and older): on Hopper and later their shared
    workspace is the rewriter's 32 MiB, not the deviceless default of 4 MiB (measured on an
    H100, jaxlib 0.11.2: 32.1 MiB of temporaries for a tiny MLP step with Triton GEMMs off)."""
    if tuple(target.compute_capability) < (9, 0) or not any(
        g.get("kind") == "cublas" for g in gemms
    ):
        return temp
    return temp + HOPPER_WORKSPACE - DEFAULT_WORKSPACE


def _device_workspace(cublas_temp: int | None, target: TargetConfig) -> int | None:
    """The cuBLAS variant's temporaries as the card holds them: without a device XLA gives a
    cuBLASLt call the default 4 MiB workspace (``backends/gpu/codegen/cublaslt.cc``, default
    config); on Hopper and later the device's keeps the rewriter's 32 MiB
    (``gemm_rewriter.cc``; measured on an H100 with jaxlib 0.11.2: the device compile's
    temporaries are 32 MiB above the deviceless one's whenever cuBLASLt wins a GEMM)."""
    if cublas_temp is None or tuple(target.compute_capability) < (9, 0):
        return cublas_temp
    return cublas_temp + HOPPER_WORKSPACE - DEFAULT_WORKSPACE


def compile_for_gpu(
    fn: Callable[..., Any],
    *args: Any,
    target: TargetConfig,
    memory_base_bytes: int | None = None,
    environ: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> GpuCompile:
    """:func:`export_step` then :func:`compile_exported` for one step.

    Raises:
        BackendUnavailable: When the ``gpu-target`` extra is missing.
        EstimateError: When the step cannot be exported or compiled.
    """
    missing = gpu_target_missing()
    if missing:
        raise BackendUnavailable(
            "XLA's GPU compiler is not available here: " + "; ".join(missing),
            hint=EXTRA_INSTALL,
        )
    start = time.perf_counter()
    step = export_step(fn, *args, **kwargs)
    (result,) = compile_exported(
        [step], target, memory_base_bytes=memory_base_bytes, environ=environ
    )
    del start
    return result


def local_target_config() -> str:
    """The target config of this machine's first GPU, as XLA reads it from the device
    (``xla_client.get_topology_for_devices(jax.devices()).target_config``): the real one, to
    compare with ``memfit gpus NAME --target-config``.

    Raises:
        BackendUnavailable: When JAX has no GPU here.
    """
    import jax
    from jaxlib import xla_client

    devices = jax.devices()
    if not devices or devices[0].platform != "gpu":
        raise BackendUnavailable(
            f"JAX has no GPU here (its devices: {', '.join(str(d) for d in devices)})",
            hint='on a machine with an NVIDIA GPU: pip install -U "jax[cuda12]"; here, '
            "`memfit gpus NAME --target-config` shows memfit's config for a card",
        )
    config = xla_client.get_topology_for_devices(devices).target_config
    return config if isinstance(config, str) else str(config)


def cpu_fallback_note(card: str) -> str:
    """The note of a step compiled on this process's backend because it could not be
    exported for CUDA (:func:`export_or_fall_back` warned why)."""
    return (
        f"compiled with this process's XLA backend, not XLA's GPU compiler for {card}: JAX "
        "could not export the step for CUDA (the warning says why); GPU fusions, layouts and "
        "rematerialization toward the card's memory are not seen"
    )


def export_or_fall_back(
    fn: Callable[..., Any], args: Any, kwargs: Any, compiler: str, card: str
) -> Any:
    """The step exported for CUDA (:func:`memfit.estimate.xla.gpu.export_step`: host
    callbacks replaced by what they hold, else lowered for CUDA directly), or ``None`` with a
    warning naming why when neither works and ``compiler="auto"`` (the caller then compiles
    on this process's backend); ``compiler="gpu"`` raises instead."""
    import warnings

    try:
        step = export_step(fn, *args, **kwargs)
    except EstimateError as exc:
        if compiler == "gpu":
            raise
        warnings.warn(
            f"memfit: the step is compiled with this process's XLA backend, not XLA's GPU "
            f"compiler for {card}: {exc}",
            RuntimeWarning,
            stacklevel=4,
        )
        return None
    if step.route == "lowered":
        warnings.warn(
            "memfit: jax.export refused the step; it was lowered for CUDA directly "
            "(jit(...).trace(...).lower(lowering_platforms=('cuda',))) and compiled from that",
            RuntimeWarning,
            stacklevel=4,
        )
    return step
