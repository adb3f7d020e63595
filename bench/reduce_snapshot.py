"""Store a public CUDA memory snapshot reduced, for the replay corpus in CI.

Reads a ``torch.cuda.memory._dump_snapshot()`` pickle with memfit's reader (no global is
resolved, nothing in it runs), drops the stack frames and the times, and writes the same data
as gzip JSON with a ``memfit`` section naming where it came from::

    python bench/reduce_snapshot.py RAW.pickle ../shared/gpu_truth/public/NAME.json.gz \\
        --repo owner/name --path path/in/repo --commit SHA --licence MIT

The corpus is replayed by ``tests/allocator/test_public_snapshots.py``. It is data taken from public
repositories, which developers do not commit: it lives in the steering repository's
``shared/gpu_truth/public/``; its sources are listed in
``tests/data/gpu_truth/public_sources.md``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from memfit.allocator.snapshot import load_snapshot, snapshot_to_data, write_json_gz


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--repo", required=True)
    parser.add_argument("--path", required=True)
    parser.add_argument("--commit", required=True)
    parser.add_argument("--licence", required=True)
    parser.add_argument("--note", default="")
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)
    if args.out.exists() and not args.force:
        print(f"{args.out} exists (pass --force)", file=sys.stderr)
        return 1
    snapshot = load_snapshot(args.raw)
    data = snapshot_to_data(snapshot, frames=False, times=False)
    data["memfit"] = {
        "format": 1,
        "source": f"https://github.com/{args.repo}",
        "path": args.path,
        "commit": args.commit,
        "licence": args.licence,
        "reduced": "stack frames and times dropped by bench/reduce_snapshot.py",
        "note": args.note,
    }
    write_json_gz(data, args.out)
    print(f"{args.out}: {args.out.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
