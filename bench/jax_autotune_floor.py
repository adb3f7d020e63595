"""The first call's autotuning floor by the target's jaxlib (issue 30): a small MLP step
compiled deviceless for two cards, ``peak_bytes_in_use`` under each jaxlib's autotuner rules
(:func:`memfit.estimate.xla.runtime.autotune_rules`).

    python bench/jax_autotune_floor.py      # writes bench/out/jax_autotune_floor.*

Needs the ``gpu-target`` extra (XLA's GPU compiler without the card); nothing runs on a GPU.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common
from xla_deviceless import make_step

MiB = 2**20
CARDS = ("RTX 4090", "H100 80GB")
JAXLIBS = (None, "0.4.33", "0.5.0", "0.7.2")


def main() -> int:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # this process; the compile child has its own
    import memfit
    from memfit.estimate.xla.step import _jaxlib_version

    fn, args = make_step("mlp", 64)  # three tanh layers of 512 x 512, SGD, batch 64
    rows, results = [], []
    for card in CARDS:
        for jaxlib in JAXLIBS:
            est = memfit.estimate_jax(fn, *args, gpu=card, environ={}, jaxlib=jaxlib)
            assert est.peak_bytes_in_use is not None
            name = jaxlib or f"{_jaxlib_version()} (installed)"
            results.append(
                {
                    "card": card,
                    "jaxlib": name,
                    "buffers_bytes": est.executable_peak_bytes,
                    "peak_bytes_in_use": est.peak_bytes_in_use,
                }
            )
            rows.append(
                f"| {card} | {name} | {est.executable_peak_bytes / MiB:.1f} | "
                f"{est.peak_bytes_in_use / MiB:.1f} |"
            )
            print(rows[-1], flush=True)
    markdown = (
        f"First-call autotuning by jaxlib, {_common.utc_minute()} "
        "(`python bench/jax_autotune_floor.py`)\n\n"
        "| card | jaxlib | XLA buffers MiB | peak_bytes_in_use MiB |\n|---|---|---:|---:|\n"
        + "\n".join(rows)
        + "\n"
    )
    _common.write_results("jax_autotune_floor", {"runs": results}, markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
