"""The evidence of an out-of-memory error, written next to the run's log."""

from __future__ import annotations

import json
import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memfit.backends.live import torch_cuda_available
from memfit.errors import file_error

__all__ = ["write_oom_dump"]


def write_oom_dump(
    directory: Path,
    stem: str,
    samples: Sequence[dict[str, Any]],
    events: Sequence[dict[str, Any]],
) -> list[Path]:
    """Write ``<stem>.samples.jsonl`` (the samples and events) and, when torch has CUDA,
    ``<stem>.snapshot.pickle`` (``torch.cuda.memory._snapshot()``; open it at
    https://pytorch.org/memory_viz).

    Returns:
        The files written.

    Raises:
        ConfigError: When ``directory`` cannot be written.
    """
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
        torch_module = torch_cuda_available()
        if torch_module is not None:
            snapshot = torch_module.cuda.memory._snapshot()
            snapshot_path = directory / f"{stem}.snapshot.pickle"
            with snapshot_path.open("wb") as binary:
                pickle.dump(snapshot, binary)
            written.append(snapshot_path)
    except OSError as exc:
        raise file_error(
            exc,
            directory,
            action="write the OOM dump",
            hint="pass oom_dir= a writable directory",
        ) from exc
    return written
