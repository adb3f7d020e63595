"""``memfit estimate module:factory --batch 32,64,128``: trace a real step, no GPU needed.

The factory returns a :class:`memfit.estimate.TorchStep` (traced with fake tensors) or a
:class:`memfit.estimate.JaxStep` (compiled by XLA for its memory analysis). The command prints
the predicted peaks and the breakdown per batch size, and the fitted line.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import typer
from rich.table import Table

from memfit._checks import parse_int
from memfit.cli._common import (
    JSON_OPTION,
    RUNTIME_OPTION,
    err_console,
    out_console,
    print_json,
    safe,
    user_code,
)
from memfit.cli._progress import status
from memfit.errors import ConfigError
from memfit.units import format_bytes

__all__ = ["parse_batch_sizes", "register"]


def parse_batch_sizes(text: str) -> list[int]:
    """Parse ``"32,64,128"`` into ``[32, 64, 128]``.

    Raises:
        ConfigError: When an entry is not a positive integer.

    >>> parse_batch_sizes("32, 64,128")
    [32, 64, 128]
    """
    sizes: list[int] = []
    for part in text.split(","):
        item = part.strip()
        sizes.append(
            parse_int(
                "--batch",
                item,
                lo=1,
                hi=10**12 - 1,
                hint="give batch sizes as a comma-separated list of whole numbers below "
                "10**12, e.g. --batch 32,64,128",
            )
        )
    return sizes


def _torch_tables(data: dict[str, Any]) -> tuple[Table, Table]:
    knob = data["batch_knob"]
    peaks = Table(title=f"memfit estimate (torch, traced on {safe(data['device'])})")
    peaks.add_column(safe(knob), justify="right")
    for name in ("allocated peak", "reserved peak", "device used"):
        peaks.add_column(name, justify="right")
    for p in data["points"]:
        used = p["device_used_peak"]
        peaks.add_row(
            str(p["batch_size"]),
            format_bytes(p["allocated_peak"]),
            format_bytes(p["reserved_peak"]),
            "unknown" if used is None else format_bytes(used),
        )
    parts = Table(title="allocated at the peak, by category")
    parts.add_column("category")
    for p in data["points"]:
        parts.add_column(f"{safe(knob)}={p['batch_size']}", justify="right")
    for key in data["points"][0]["breakdown"]:
        if any(p["breakdown"][key] for p in data["points"]):
            parts.add_row(
                key.replace("_", " "), *(format_bytes(p["breakdown"][key]) for p in data["points"])
            )
    return peaks, parts


def _jax_table(data: dict[str, Any]) -> Table:
    table = Table(title="memfit estimate (jax, XLA memory analysis)")
    table.add_column(safe(data["batch_knob"]), justify="right")
    for name in ("arguments", "outputs", "aliased", "temporaries", "peak", "device used"):
        table.add_column(name, justify="right")
    for p in data["points"]:
        used = p["device_used_bytes"]
        table.add_row(
            str(p["batch_size"]),
            format_bytes(p["argument_bytes"]),
            format_bytes(p["output_bytes"]),
            format_bytes(p["alias_bytes"]),
            format_bytes(p["temp_bytes"]),
            format_bytes(p["executable_peak_bytes"]),
            "unknown" if used is None else format_bytes(used),
        )
    return table


def _context_line(context: dict[str, Any]) -> str:
    rt = context["runtime"]
    versions = ", ".join(
        f"{name} {rt[key] or 'unknown'}"
        for name, key in (("torch", "torch"), ("CUDA", "cuda"), ("driver", "driver"))
    )
    return (
        f"device used = reserved + CUDA context {format_bytes(context['bytes'])} "
        f"({rt['module_loading']} module loading: {rt['loading_reason']}; {versions}; "
        f"{context['arch'] or 'unknown architecture'})"
    )


def _fit_line(fit: dict[str, float] | None, knob: str) -> str:
    if fit is None:
        return "fit: needs two or more distinct batch sizes"
    return (
        f"fit: {format_bytes(fit['intercept'])} + {format_bytes(fit['slope'])} per {knob} "
        f"(largest residual {format_bytes(fit['residual'])})"
    )


def _gradients_note(point: dict[str, Any]) -> str | None:
    """Why the gradients at the peak can be fewer than the parameters: the table shows what
    is live at the peak, not what a step holds at its most."""
    parts = point["breakdown"]
    params, grads = parts.get("parameters", 0), parts.get("gradients", 0)
    if not params or grads >= params:
        return None
    return (
        f"gradients: {format_bytes(grads)} of the parameters' {format_bytes(params)} are live "
        "at the peak: it comes before the backward pass has made the rest (or after "
        "zero_grad freed them); the table is what is live at the peak, not each part at its "
        "largest"
    )


def _slope_check(est: Any, trace: Any) -> dict[str, Any] | None:
    """When the traced sizes cannot give the batch's slope (the peak comes where the batch's
    tensors are freed), say so, and trace two sizes where they can
    (:mod:`memfit.estimate.torch._slope`)."""
    from memfit.estimate.torch._slope import check_slope

    if est.fit is None:
        return None
    found = check_slope(est.sequence, [p.batch_size for p in est.points], est.fit.slope)
    if found is None:
        return None
    out = {**found.to_dict(), "text": found.text(est.batch_knob), "fit": None}
    at = found.trace_at()
    if at is not None:
        # fake tensors take no memory at any batch; the kernels' scratch is not measured
        # there (each such op would run for real on this CPU at that size)
        again = trace(at, False)
        out["fit"] = None if again.fit is None else again.fit.to_dict()
    return out


#: The share of the usable memory the largest fitting batch leaves free (as ``memfit fit``).
_MARGIN = 0.05

#: The largest batch searched for.
_MAX_BATCH = 2**31


def _target(gpu: str | None) -> tuple[str, int, str] | None:
    """The device the answer is for: ``(name, total bytes, kind)``, kind ``"host"`` for
    ``--gpu cpu`` (this machine's available RAM) or ``"gpu"``; ``None`` without ``--gpu``."""
    if gpu is None:
        return None
    from memfit.planning import HOST_NAMES, host_memory

    if gpu.strip().lower() in HOST_NAMES:
        here = host_memory()
        if here is None:
            raise ConfigError(
                "this operating system does not say how much RAM it has",
                key_path="--gpu",
                hint="give the RAM as a size instead, e.g. --gpu 16GiB",
            )
        return "CPU (host RAM available now)", here[1], "host"
    from memfit.estimate._devices import split_gpu
    from memfit.hardware.catalog import gpu as lookup_gpu

    spec = lookup_gpu(split_gpu(gpu)[0] or gpu)  # "4xRTX 4090": per device
    return spec.name, spec.total_bytes, "gpu"


def _bisect(fits: Callable[[int], bool], low: int) -> int | None:
    """The largest value from ``low`` up for which ``fits`` holds (taken to fall with the
    value), or ``None`` when ``low`` does not fit."""
    if not fits(low):
        return None
    lo, hi = low, low * 2
    while hi <= _MAX_BATCH and fits(hi):
        lo, hi = hi, hi * 2
    if hi > _MAX_BATCH:
        return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def largest_batch(
    est: Any, data: dict[str, Any], target: tuple[str, int, str]
) -> dict[str, Any] | None:
    """The largest batch size that fits ``target`` with :data:`_MARGIN` left free.

    Torch on a GPU: the traced allocations replayed through the allocator model under the
    card's memory less the CUDA context (``TorchEstimate.largest_fitting``); torch on the
    CPU: the replay's allocated peak under the RAM available now; JAX: the fitted line of
    the executable's peak under the pool JAX preallocates (or the card, on demand).

    Returns:
        ``{"device", "limit_bytes", "batch_size", "peak_bytes", "how"}`` (``batch_size``
        ``None`` when even 1 does not fit), or ``None`` when the traces cannot say (one
        batch size, or a step whose allocations change with the batch size).
    """
    name, total, kind = target
    if data["framework"] == "torch":
        sequence = getattr(est, "sequence", None)
        if sequence is None:
            return None
        if kind == "host":
            limit = total
            usable = int(limit * (1 - _MARGIN))
            best = _bisect(lambda v: sequence.replay(v).allocated_peak <= usable, 1)
            peak = None if best is None else sequence.replay(best).allocated_peak
            how = (
                "the traced allocations replayed at each size, their peak under the RAM "
                f"available now less {_MARGIN:.0%}"
            )
        else:
            context = data["context"]["bytes"] if data.get("context") else 0
            several = data.get("collectives")  # --gpu 4xRTX 4090: NCCL's share of each card
            limit = total - context - (several["every_device_bytes"] if several else 0)
            usable = int(limit * (1 - _MARGIN))
            got: Any = None

            def fits(v: int) -> bool:
                nonlocal got
                one = sequence.replay(
                    v,
                    limit_bytes=limit,
                    target_bytes=usable,
                    expandable_segments=est.expandable_segments,
                    max_split_size=est.max_split_size,
                )
                if one.fits:
                    got = one if got is None or v > got.value else got
                return bool(one.fits)

            best = _bisect(fits, 1)
            peak = None if got is None else got.reserved_peak
            how = (
                "the traced allocations replayed through the caching allocator model under "
                f"the card's memory less the CUDA context, {_MARGIN:.0%} left free"
            )
    else:
        fit = data.get("fit")
        if fit is None or fit["slope"] <= 0:
            return None
        from memfit.estimate.xla.step import preallocation_from_env

        policy = preallocation_from_env()
        on_demand = kind == "host" or policy.platform_allocator or not policy.preallocate
        limit = total if on_demand else int(total * policy.fraction)
        several = _collectives(data)
        if several and on_demand:  # --gpu 8xH100: NCCL's share of each card
            limit -= several["every_device_bytes"]
        usable = int(limit * (1 - _MARGIN))
        room = usable - fit["intercept"]
        best = int(room // fit["slope"]) if room >= fit["slope"] else None
        best = min(best, _MAX_BATCH) if best is not None else None
        peak = None if best is None else round(fit["intercept"] + fit["slope"] * best)
        pool = "the card" if on_demand else f"JAX's preallocated pool ({policy.fraction:.0%})"
        how = f"the fitted line of the executable's peak under {pool}, {_MARGIN:.0%} left free"
    return {
        "device": name,
        "limit_bytes": limit,
        "batch_size": best,
        "peak_bytes": peak,
        "how": how,
    }


def _collectives(data: dict[str, Any]) -> dict[str, Any] | None:
    """The collective terms of an estimate's plain data (``--gpu 4xRTX 4090``), or ``None``."""
    if data.get("collectives"):
        return dict(data["collectives"])
    points = data.get("points") or []
    first = points[0] if points else {}
    return dict(first["collectives"]) if first.get("collectives") else None


def _collective_lines(data: dict[str, Any]) -> list[str]:
    """One line per collective term: name, basis, bytes, where."""
    several = _collectives(data)
    if several is None:
        return []
    lines = [
        f"per device on {several['count']} x {several['card']} ({several['topology']}, "
        f"{several['strategy']}): the collective terms below are in the device figures"
    ]
    for term in several["terms"]:
        where = "device 0 only" if term["device0_only"] else "every device"
        lines.append(
            f"  {term['name']} ({term['basis']}, {where}): {format_bytes(term['bytes'])}: "
            f"{term['detail']}"
        )
    return lines


def _largest_line(largest: dict[str, Any], knob: str) -> str:
    if largest["batch_size"] is None:
        return (
            f"largest {knob} that fits on {largest['device']}: none (even 1 needs more than "
            f"{format_bytes(largest['limit_bytes'])})"
        )
    return (
        f"largest {knob} that fits on {largest['device']}: {largest['batch_size']:,} "
        f"(peak {format_bytes(largest['peak_bytes'])} of {format_bytes(largest['limit_bytes'])}; "
        f"{largest['how']})"
    )


def estimate_command(
    factory: str = typer.Argument(
        ..., help="module:function (or path/to/file.py:function) returning a TorchStep or JaxStep."
    ),
    batch: str = typer.Option(
        "32,64,128", "--batch", "-b", help="Batch sizes to trace, comma-separated."
    ),
    gpu: str | None = typer.Option(
        None,
        "--gpu",
        help="GPU name or size for device-level figures (context, workspace) and the largest "
        "batch that fits; cpu: this machine's RAM.",
    ),
    framework: str | None = typer.Option(
        None, "--framework", help="torch or jax (default: what the factory returns)."
    ),
    alloc_conf: str | None = typer.Option(
        None,
        "--alloc-conf",
        help="PyTorch allocator settings to replay (expandable_segments, max_split_size_mb); "
        "default: PYTORCH_ALLOC_CONF or PYTORCH_CUDA_ALLOC_CONF from the environment.",
    ),
    runtime: str | None = RUNTIME_OPTION,
    json_out: bool = JSON_OPTION,
) -> None:
    """Predict the peak GPU memory of a real PyTorch or JAX step, without a GPU."""
    from memfit.estimate import JaxStep, TorchStep
    from memfit.estimate.bridge import make_step

    sizes = parse_batch_sizes(batch)
    target = _target(gpu)
    trace_gpu = gpu if target is None or target[2] == "gpu" else None
    est: Any = None
    if framework is not None and framework not in ("torch", "jax"):
        raise ConfigError(
            f"unknown framework {framework!r}", key_path="--framework", hint="use torch or jax"
        )
    with user_code(factory):
        step = make_step(factory, key_path="factory")
    kind = "torch" if isinstance(step, TorchStep) else "jax"
    if framework is not None and framework != kind:
        raise ConfigError(
            f"--framework {framework} but {factory} returned a {type(step).__name__}",
            key_path="--framework",
            hint="drop --framework, or point at a factory for that framework",
        )
    data: dict[str, Any]
    if isinstance(step, TorchStep):
        from memfit.allocator.settings import torch_allocator_options
        from memfit.estimate.torch.trace import estimate_torch

        variable = "--alloc-conf"
        if alloc_conf is None:
            for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
                if os.environ.get(name):
                    variable, alloc_conf = name, os.environ[name]
                    break
        expandable, max_split = torch_allocator_options(alloc_conf, variable)
        with (
            status(f"tracing {factory}", quiet=json_out) as say,
            user_code(factory),  # build / make_batch / step are the user's code too
        ):

            def trace(at: list[int], scratch: bool | None = None) -> Any:
                return estimate_torch(
                    step.build,
                    step.step,
                    step.make_batch,
                    at,
                    gpu=trace_gpu,
                    expandable_segments=expandable,
                    max_split_size=max_split,
                    batch_knob=step.batch_knob,
                    runtime=runtime,
                    progress=say,
                    kernel_scratch=scratch,
                )

            est = trace(sizes)
            data = est.to_dict()
            data["slope"] = _slope_check(est, trace)
    elif isinstance(step, JaxStep):
        from memfit.estimate.xla.step import estimate_jax_sweep

        with status(f"compiling {factory}", quiet=json_out) as say, user_code(factory):
            data = estimate_jax_sweep(
                step.fn,
                step.make_args,
                sizes,
                gpu=trace_gpu,
                batch_knob=step.batch_knob,
                progress=say,
            ).to_dict()
    data["largest_fitting"] = None if target is None else largest_batch(est, data, target)
    if json_out:
        print_json(data)
        return
    tables = _torch_tables(data) if kind == "torch" else (_jax_table(data),)
    for table in tables:
        out_console.print(table)
    for line in _collective_lines(data):
        out_console.print(safe(line))
    out_console.print(safe(_fit_line(data["fit"], data["batch_knob"])))
    slope = data.get("slope")
    if slope is not None:
        out_console.print(safe(slope["text"]), soft_wrap=True)
        if slope.get("fit") is not None:
            at = " and ".join(str(v) for v in slope["trace_at"])
            out_console.print(
                safe(f"traced again at {at}: {_fit_line(slope['fit'], data['batch_knob'])}"),
                soft_wrap=True,
            )
        else:
            out_console.print(
                f"trace at {slope['from_value'] * 2:,} or more for the slope", soft_wrap=True
            )
    if kind == "torch" and data.get("context") is not None and trace_gpu == gpu:
        out_console.print(safe(_context_line(data["context"])))
    if kind == "torch":
        note = _gradients_note(data["points"][-1])
        if note is not None:
            out_console.print(safe(note), soft_wrap=True)
        for point in data["points"][-1:]:
            if point["top_modules"]:
                tops = ", ".join(
                    f"{m['module']} {format_bytes(m['bytes'])}" for m in point["top_modules"]
                )
                out_console.print(
                    f"top modules by activation memory at {point['batch_size']}: {safe(tops)}"
                )
        for note in data["deviations"]:
            err_console.print(f"note: {safe(note)}")
    else:
        for note in data["points"][-1]["notes"]:
            err_console.print(f"note: {safe(note)}")
    largest = data["largest_fitting"]
    if target is None:
        out_console.print(
            "largest batch that fits: name the card with --gpu (a name, a size, or cpu)",
            soft_wrap=True,
        )
    elif largest is None:
        out_console.print(
            f"largest {safe(data['batch_knob'])} that fits: cannot tell from these traces "
            "(trace two or more batch sizes, e.g. --batch 32,64)",
            soft_wrap=True,
        )
    else:
        out_console.print(safe(_largest_line(largest, data["batch_knob"])), soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add ``memfit estimate`` to ``app``."""
    app.command("estimate")(estimate_command)
