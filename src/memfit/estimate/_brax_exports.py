"""The steps a Brax measurement exports for CUDA, kept for every card.

A measurement compiled for a card (:func:`memfit.estimate.brax_measure.measure_ppo` with
``gpu=``) exports the env step and Brax's training step for CUDA in the caller's process and
compiles them in a child process for the card. The exports are the same for every card (only
XLA's compile for the card differs), so they are written beside the measurement cache and
read back when another card is measured: that one only compiles.

The programs are exported from the env as Brax runs it (the env's step traced in each: a
nested ``jax.jit`` around it would save that tracing but changes XLA's temporaries, by -1.9%
for ant on spring at 1,024 envs), and compiled in child processes side by side, one per core
(:func:`compile_exported_all`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "MAX_COMPILE_CHILDREN",
    "compile_children",
    "compile_exported_all",
    "shared_exports",
]


def _read_exports(folder: Path) -> tuple[list[Any], dict[str, Any]] | None:
    """Exported steps written by :func:`_write_exports`, or ``None`` when absent or damaged."""
    from memfit.estimate.xla._callbacks import HeldByCallbacks
    from memfit.estimate.xla.gpu import ExportedStep

    try:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
        steps = []
        for i, m in enumerate(meta["steps"]):
            held = m.get("held")
            steps.append(
                ExportedStep(
                    serialized=(folder / f"step{i}.bin").read_bytes(),
                    donate=tuple(int(d) for d in m["donate"]),
                    mesh=tuple((str(a), int(n)) for a, n in m["mesh"]),
                    specs=tuple(None if x is None else tuple(x) for x in m["specs"]),
                    held=None
                    if held is None
                    else HeldByCallbacks(
                        count=int(held["count"]),
                        operand_bytes=int(held["operand_bytes"]),
                        result_bytes=int(held["result_bytes"]),
                        kinds=tuple((str(k), int(n)) for k, n in held["kinds"]),
                    ),
                    route=str(m["route"]),
                )
            )
        return steps, dict(meta["extra"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_exports(folder: Path, steps: Sequence[Any], extra: Mapping[str, Any]) -> None:
    """Write exported steps (and ``extra``, plain data) atomically; a folder that cannot be
    written is not an error."""
    try:
        tmp = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        meta = []
        for i, step in enumerate(steps):
            (tmp / f"step{i}.bin").write_bytes(step.serialized)
            held = step.held
            meta.append(
                {
                    "donate": list(step.donate),
                    "mesh": [list(a) for a in step.mesh],
                    "specs": [None if x is None else list(x) for x in step.specs],
                    "route": step.route,
                    "held": None
                    if held is None
                    else {
                        "count": held.count,
                        "operand_bytes": held.operand_bytes,
                        "result_bytes": held.result_bytes,
                        "kinds": [list(k) for k in held.kinds],
                    },
                }
            )
        payload = json.dumps({"steps": meta, "extra": dict(extra)})
        (tmp / "meta.json").write_text(payload, encoding="utf-8")
        if folder.exists():
            return  # another process wrote it first: theirs stands
        os.replace(tmp, folder)
    except OSError:
        return


def shared_exports(
    build: Callable[[], tuple[list[tuple[Any, tuple[Any, ...]]], dict[str, Any]]],
    share: Path | None,
) -> tuple[list[Any], dict[str, Any]]:
    """The steps ``build()`` makes, exported for CUDA; with ``share`` (a folder), read from
    there when a measurement for another card wrote them (the program is the same for every
    card: only XLA's compile for the card differs), else written there."""
    from memfit.estimate.xla.gpu import export_step

    if share is not None:
        found = _read_exports(share)
        if found is not None:
            return found
    jobs, extra = build()
    steps = [export_step(fn, *args) for fn, args in jobs]
    if share is not None:
        _write_exports(share, steps, extra)
    return steps, extra


#: The most child processes a measurement's compiles for a card are spread over (one per
#: CPU core up to this): XLA's GPU compile of one program keeps about one core busy, and the
#: humanoid's programs take about a minute of CPU each (docs/benchmarks.md, "Where the
#: humanoid's measurement time goes").
MAX_COMPILE_CHILDREN = 4


def compile_children(jobs: int, cpus: int | None = None) -> int:
    """How many child processes compile ``jobs`` programs side by side: one per core of
    ``cpus`` (default this machine's), at most :data:`MAX_COMPILE_CHILDREN` and ``jobs``.

    >>> compile_children(5, 2), compile_children(5, 16), compile_children(1, 16)
    (2, 4, 1)
    """
    found = os.cpu_count() if cpus is None else cpus
    return max(1, min(jobs, found or 1, MAX_COMPILE_CHILDREN))


def compile_exported_all(steps: Sequence[Any], target: Any) -> list[tuple[int, int, int, int]]:
    """The steps compiled for ``target``, spread over :func:`compile_children` child
    processes that run side by side (each compiles its share one after another)."""
    from concurrent.futures import ThreadPoolExecutor

    from memfit.estimate.xla.gpu import compile_exported

    def one(share: Sequence[Any]) -> list[Any]:
        # JAX's default allocator limit on the card: 75% of the memory CUDA reports
        return compile_exported(
            share, target, memory_base_bytes=int(target.device_memory_size * 0.75)
        )

    children = compile_children(len(steps))
    shares = [list(steps[i::children]) for i in range(children)]
    with ThreadPoolExecutor(max_workers=children) as pool:
        done = list(pool.map(one, shares))
    results: list[Any] = [None] * len(steps)
    for i, part in enumerate(done):
        results[i::children] = part
    return [(r.argument_bytes, r.output_bytes, r.alias_bytes, r.device_temp_bytes) for r in results]
