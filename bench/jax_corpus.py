"""A corpus of real JAX RL programs, compiled deviceless for named cards (issue 43).

    python bench/jax_corpus.py --gpu "RTX 4070" --gpu "A100 40GB" [--size small|default]

The programs, their sources and their default sizes: ``tests/shared/jax_rl_corpus.py``
(shared with tests/estimate/xla/test_jax_corpus.py).

``--size small`` shrinks every count (and uses Brax's ``fast`` env) so that CI compiles the
whole corpus for two cards; ``default`` is each source's own configuration. Writes JSON and a
markdown table to ``bench/out/jax_corpus*``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

# the corpus's programs live with the tests' shared support code
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "shared"))

from jax_rl_corpus import CORPUS, compile_corpus, holds

OUT = Path(__file__).resolve().parent / "out"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", action="append", default=[])
    ap.add_argument("--size", choices=("small", "default"), default="small")
    ap.add_argument("--program", action="append", default=[], choices=sorted(CORPUS))
    ap.add_argument(
        "--holds", action="store_true",
        help="only what each program's run holds at the end (jax.eval_shape, no compile)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    command = "python bench/jax_corpus.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    from memfit.units import format_bytes

    gpus = args.gpu or ["RTX 4070", "A100 40GB"]
    names = args.program or list(CORPUS)
    if args.holds:
        table = [f"`{command}`", "", "| program | size | runner state | metrics | total |",
                 "|---|---|---:|---:|---:|"]  # fmt: skip
        found = {}
        for name in names:
            found[name] = h = holds(name, args.size)
            table.append(
                f"| {name} | {args.size} | {format_bytes(h.get('runner_state', 0))} | "
                f"{format_bytes(h.get('metrics', 0))} | {format_bytes(h['total'])} |"
            )
            print(table[-1], flush=True)
        OUT.mkdir(exist_ok=True)
        stem = f"jax_corpus_holds_{args.size}"
        (OUT / f"{stem}.json").write_text(json.dumps({"command": command, "holds": found}))
        (OUT / f"{stem}.md").write_text("\n".join(table) + "\n")
        return 0
    rows = compile_corpus(names, gpus, args.size)
    lines = [
        f"`{command}`",
        "",
        "| program | size | card | XLA buffers | peak_bytes_in_use | callbacks | compile (s) |",
        "|---|---|---|---:|---:|---|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['program']} | {r['size']} | {r['gpu']} | "
            f"{format_bytes(r['executable_peak_bytes'])} | "
            f"{format_bytes(r['peak_bytes_in_use'])} | {r['callbacks'] or '-'} | "
            f"{r['compile_seconds']:.1f} |"
        )
    text = "\n".join(lines)
    print(text)
    OUT.mkdir(exist_ok=True)
    stem = f"jax_corpus_{args.size}"
    (OUT / f"{stem}.json").write_text(json.dumps({"command": command, "rows": rows}, indent=1))
    (OUT / f"{stem}.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
