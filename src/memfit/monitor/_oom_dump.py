"""The evidence of an out-of-memory error, written next to the run's log."""

from __future__ import annotations

import json
import os
import pickle
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memfit._userfiles import file_error
from memfit.backends.live import torch_cuda_available

__all__ = ["simulated_snapshot", "write_oom_dump"]


def simulated_snapshot(exc: BaseException | None = None) -> dict[str, Any] | None:
    """The snapshot of the (CPU) ``memfit.simulate_gpu`` that raised ``exc``, else of the
    active one; ``None`` when there is none."""
    from memfit.runtime import simulate

    gpu = simulate.raised_by(exc)
    if gpu is None:
        gpu = simulate.active()
    if gpu is None or gpu.device_kind != "cpu":
        return None
    return gpu.snapshot()


def _write_pickle(path: Path, data: Any) -> None:
    """Write whole or not at all: a temporary file in the same folder, then a rename."""
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            pickle.dump(data, handle, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(temp, path)
    except BaseException:
        with __import__("contextlib").suppress(OSError):
            os.unlink(temp)
        raise


def write_oom_dump(
    directory: Path,
    stem: str,
    samples: Sequence[dict[str, Any]],
    events: Sequence[dict[str, Any]],
    exc: BaseException | None = None,
) -> list[Path]:
    """Write ``<stem>.samples.jsonl`` (the samples and events) and a CUDA memory snapshot,
    ``<stem>.snapshot.pickle``: on CUDA ``torch.cuda.memory._snapshot()`` (open it at
    https://pytorch.org/memory_viz), under ``memfit.simulate_gpu`` the simulated GPU's
    allocations in the same format (:meth:`memfit.runtime.simulate.SimulatedGpu.snapshot`).
    ``exc`` is the out-of-memory error, when there is one (a simulated GPU's names it).
    Either is what ``memfit explain`` reads (:mod:`memfit.allocator.snapshot`); the simulated one
    is checked with that reader before it is written.

    Returns:
        The files written.

    Raises:
        ConfigError: When ``directory`` cannot be written.
    """
    from memfit.allocator.snapshot import snapshot_from_data

    written: list[Path] = []
    try:
        directory.mkdir(parents=True, exist_ok=True)
        samples_path = directory / f"{stem}.samples.jsonl"
        with samples_path.open("w", encoding="utf-8") as handle:
            for sample in samples:
                handle.write(json.dumps({"type": "sample", "mode": "step", **sample}) + "\n")
            for record in events:
                handle.write(json.dumps({"type": "event", **record}) + "\n")
        written.append(samples_path)
        snapshot: Any = simulated_snapshot(exc)
        if snapshot is not None:
            snapshot_from_data(snapshot, source="the OOM snapshot")  # what explain reads
        else:
            torch_module = torch_cuda_available()
            if torch_module is not None:
                snapshot = torch_module.cuda.memory._snapshot()
        if snapshot is not None:
            snapshot_path = directory / f"{stem}.snapshot.pickle"
            _write_pickle(snapshot_path, snapshot)
            written.append(snapshot_path)
    except OSError as exc:
        raise file_error(
            exc,
            directory,
            action="write the OOM dump",
            hint="pass oom_dir= a writable directory",
        ) from exc
    return written
