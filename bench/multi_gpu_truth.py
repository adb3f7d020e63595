"""Published per-device readings of jobs on several GPUs against memfit's model of them.

Reads ``tests/data/published_truth/multi_gpu/readings.yaml`` (a calibration part, which the
rules may be derived from, and a validation part, which nothing was fitted to), predicts each
reading with :mod:`memfit.hardware.nccl` and :mod:`memfit.core.multi_gpu`, and writes the
per-reading error of both parts to ``bench/out/multi_gpu_truth.*`` and to the section of
``docs/benchmarks.md`` between its markers.

    python bench/multi_gpu_truth.py            # prints the table; --write-docs updates the docs
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
# the predictions live with the tests' shared support code
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "shared"))

import _common
from multi_gpu_readings import rows

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "published_truth" / "multi_gpu" / "readings.yaml"
DOCS = ROOT / "docs" / "benchmarks.md"
BEGIN = "<!-- multi_gpu_truth:begin -->"
END = "<!-- multi_gpu_truth:end -->"
MiB = 2**20


def markdown(parts: dict[str, list[dict[str, Any]]], command: str) -> str:
    """The docs section."""
    lines = [
        BEGIN,
        "",
        f"Taken {_common.utc_minute()} on a 2-core development VM, no GPU "
        f"({platform.machine()}, Python {platform.python_version()}), with `{command}`. "
        "The readings and their sources: `tests/data/published_truth/multi_gpu/readings.yaml`. "
        "Calibration: what the rules were derived from (`nccl_comm_base` was fitted on "
        "`nccl964_two_ranks`, the NVLink channel count read from its difference to "
        "`nccl964_three_ranks` with NCCL's 12 MiB P2P connection; the eager CUDA context by "
        "build, `rules_torch.json` "
        "`context.eager_mib`, on the `cuda_context` readings, its CUDA 11.7+ row on "
        "`torchdrug180_stray_contexts`); validation: nothing was "
        "fitted to it.",
        "",
    ]
    for name, part in parts.items():
        lines += [
            f"**{name}** ({_common.error_summary([r['error'] for r in part], 'readings')})",
            "",
            "| reading | quantity | measured MiB | predicted MiB | error | source |",
            "|---|---|---:|---:|---:|---|",
        ]
        for r in part:
            lines.append(
                f"| `{r['id']}` | {r['quantity']} | {r['measured_mib']:,.0f} | "
                f"{r['predicted_mib']:,.0f} | {r['error']:+.1%} | {r['source']} |"
            )
        lines.append("")
    lines.append(END)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write-docs", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args(argv)
    data = yaml.safe_load(DATA.read_text(encoding="utf-8"))
    parts = {"Calibration": rows(data["calibration"]), "Validation": rows(data["validation"])}
    command = "python bench/multi_gpu_truth.py --write-docs"
    text = markdown(parts, command)
    _common.write_results("multi_gpu_truth", parts, text)
    print(text)
    if args.write_docs:
        doc = DOCS.read_text(encoding="utf-8")
        if BEGIN in doc:
            head, rest = doc.split(BEGIN, 1)
            doc = head + text + rest.split(END, 1)[1]
        else:
            doc = (
                doc.rstrip("\n")
                + "\n\n## Several GPUs: NCCL and device 0 (issue 44)\n\n"
                + text
                + "\n"
            )
        DOCS.write_text(doc, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
