"""The CUDA context with lazy loading: memfit's figure against every transcribed reading.

Reads ``tests/data/published_truth/cuda_context/readings.yaml`` (a calibration part, which
``memfit.hardware.runtime``'s context figures were derived from, and a validation part, which
nothing was fitted to), predicts each reading with :func:`memfit.hardware.runtime.cuda_context`
(``kernels=False`` for a process that ran no step, ``True`` after training steps; the
reading's framework, torch or JAX) and writes both parts' errors, torch's and JAX's readings
in tables of their own, to ``bench/out/context_truth.*`` and to the section of
``docs/benchmarks.md`` between its markers.

    python bench/context_truth.py            # prints the table; --write-docs updates the docs
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "shared"))

import _common
from context_readings import load, rows

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "benchmarks.md"
BEGIN = "<!-- context_truth:begin -->"
END = "<!-- context_truth:end -->"
#: The frameworks tabled apart, with their labels.
FRAMEWORKS = (("torch", "torch"), ("jax", "JAX"))


def markdown(parts: dict[str, list[dict[str, Any]]], command: str) -> str:
    """The docs section."""
    lines = [
        BEGIN,
        "",
        f"Taken {_common.utc_minute()} on a 2-core development VM, no GPU "
        f"({platform.machine()}, Python {platform.python_version()}), with `{command}`. "
        "The readings and their sources: `tests/data/published_truth/cuda_context/readings.yaml` "
        "(`init`: CUDA started, no step run; `step`: after training steps, NVML's per-process "
        "used less the caching allocator's reserved peak). The model: the context once started "
        "is a fixed part (`CONTEXT_BASE_BYTES`) plus what it reserves per resident thread (SMs x "
        "resident threads per SM x `LOCAL_BYTES_PER_THREAD`), a step adds the kernel images it "
        "loads (`LAZY_KERNEL_IMAGES_BYTES`; `memfit.hardware.runtime`). Calibration: what the two "
        "figures were derived from; validation: nothing was fitted to it. A reading whose "
        "source names no card is listed, not compared. A JAX process's readings are tabled "
        'apart (`cuda_context(..., framework="jax")`: the same context once started, a '
        "step's kernel images assumed, as no reading of a JAX step was found to fit them on).",
        "",
    ]
    for name, part in parts.items():
        for framework, label in FRAMEWORKS:
            rows_ = [r for r in part if r["framework"] == framework]
            if not rows_:
                lines += [f"**{name}, {label}**: none.", ""]
                continue
            errors = [r["error"] for r in rows_ if r["error"] is not None]
            lines += [
                f"**{name}, {label}** ({_common.error_summary(errors, 'readings')})",
                "",
                "| reading | state | GPU | measured MiB | predicted MiB | error | source |",
                "|---|---|---|---:|---:|---:|---|",
            ]
            for r in rows_:
                pred = "-" if r["predicted_mib"] is None else f"{r['predicted_mib']:,.0f}"
                err = "not compared" if r["error"] is None else f"{r['error']:+.1%}"
                lines.append(
                    f"| `{r['id']}` | {r['state']} | {r['gpu'] or 'not stated'} | "
                    f"{r['measured_mib']:,.0f} | {pred} | {err} | {r['source']} |"
                )
            lines.append("")
    lines.append(END)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--write-docs", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args(argv)
    data = load()
    parts = {"Calibration": rows(data["calibration"]), "Validation": rows(data["validation"])}
    text = markdown(parts, "python bench/context_truth.py --write-docs")
    _common.write_results("context_truth", parts, text)
    print(text)
    if args.write_docs:
        doc = DOCS.read_text(encoding="utf-8")
        if BEGIN in doc:
            head, rest = doc.split(BEGIN, 1)
            doc = head + text + rest.split(END, 1)[1]
        else:
            doc = doc.rstrip("\n") + "\n\n## The CUDA context (issues 41, 48)\n\n" + text + "\n"
        DOCS.write_text(doc, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
