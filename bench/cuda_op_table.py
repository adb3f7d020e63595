"""The table of ATen operators in docs/guide.md: how CUDA dispatches each and what a CUDA
target's trace knows of its kernel's memory (``memfit.estimate._cuda_dispatch.op_table``).

    python bench/cuda_op_table.py            # print it
    python bench/cuda_op_table.py --write    # write it between the markers of docs/guide.md
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guide.md"
START, END = "<!-- cuda-op-table:start -->", "<!-- cuda-op-table:end -->"


def shown(text: str) -> str:
    """The table docs/guide.md shows now."""
    match = re.search(re.escape(START) + r"\n(.*?)" + re.escape(END), text, re.S)
    return "" if match is None else match.group(1)


def main(argv: list[str] | None = None) -> int:
    from memfit.estimate._cuda_dispatch import op_table

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="write it into docs/guide.md")
    args = parser.parse_args(argv)
    table = op_table()
    if not args.write:
        print(table, end="")
        return 0
    text = GUIDE.read_text()
    GUIDE.write_text(text.replace(f"{START}\n{shown(text)}{END}", f"{START}\n{table}{END}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
