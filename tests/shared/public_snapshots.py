"""Where the reduced public corpus of CUDA allocator snapshots lies, and where its sources are
listed: read by ``bench/public_replay.py`` and by the tests that replay the corpus."""

from __future__ import annotations

import os
from pathlib import Path

#: The checkout's bench/ folder (the paths below are said from there, as the bench script did).
HERE = Path(__file__).resolve().parents[2] / "bench"


#: Where the corpus's sources, commits and licences are listed (the files themselves are data
#: taken from public repositories, which developers do not commit: they live in the steering
#: repository's shared/ folder, beside this checkout).
SOURCES = HERE.parent / "tests" / "data" / "gpu_truth" / "public_sources.md"


def corpus_dir() -> Path | None:
    """The reduced public corpus: ``$MEMFIT_PUBLIC_SNAPSHOTS``, else ``shared/gpu_truth/public``
    beside this checkout (as CI lays it out); ``None`` when neither holds any snapshot."""
    env = os.environ.get("MEMFIT_PUBLIC_SNAPSHOTS")
    for candidate in ([Path(env)] if env else []) + [
        HERE.parent.parent / "shared" / "gpu_truth" / "public"
    ]:
        if candidate.is_dir() and any(candidate.glob("*.json.gz")):
            return candidate
    return None
