"""The generated tables of docs/guide.md: the ATen operators, how CUDA dispatches each and
what a CUDA target's trace knows of its kernel's memory (``memfit.estimate.torch._cuda_dispatch.
op_table``), and each dtype's hardware support by architecture (``memfit.estimate.torch._cuda_arch.
arch_table``).

    python bench/cuda_op_table.py            # print it
    python bench/cuda_op_table.py --write    # write it between the markers of docs/guide.md
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guide.md"
TABLES = ("cuda-op-table", "cuda-arch-table")


def shown(text: str, name: str = "cuda-op-table") -> str:
    """The table docs/guide.md shows now between ``name``'s markers."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    match = re.search(re.escape(start) + r"\n(.*?)" + re.escape(end), text, re.S)
    return "" if match is None else match.group(1)


def generated(name: str) -> str:
    """What the code makes for ``name``'s block."""
    if name == "cuda-arch-table":
        from memfit.estimate.torch._cuda_arch import arch_table

        return arch_table()
    from memfit.estimate.torch._cuda_dispatch import op_table

    return op_table()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="write them into docs/guide.md")
    args = parser.parse_args(argv)
    text = GUIDE.read_text()
    for name in TABLES:
        table = generated(name)
        if not args.write:
            print(table)
            continue
        start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
        text = text.replace(f"{start}\n{shown(text, name)}{end}", f"{start}\n{table}{end}")
    if args.write:
        GUIDE.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
