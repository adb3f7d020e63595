"""A corpus of real JAX RL programs, compiled deviceless for named cards (issue 43).

    python bench/jax_corpus.py --gpu "RTX 4070" --gpu "A100 40GB" [--size small|default]

Every program is a whole training run jitted as its authors jit it (PureJaxRL and purejaxql
put the run in one ``jax.lax.scan``; Brax jits one training epoch), written here from the
published source (named in each builder's docstring; the algorithms and their default
hyperparameters, not the code), with the host callbacks those programs log through. Each
builder returns ``(jitted, args)``; ``args`` are ``jax.ShapeDtypeStruct``, so nothing runs.

- ``purejaxrl_ppo_brax``: PureJaxRL's continuous PPO (``purejaxrl/ppo_continuous_action.py``,
  luchris429/purejaxrl, Apache-2.0) on a Brax env through PureJaxRL's wrappers (episode and
  auto-reset, logging, action clipping, vmapped envs, observation and reward normalization),
  logging with ``jax.debug.callback`` (``DEBUG: True``). Default: hopper (positional
  backend), 2048 envs x 10 steps, 2441 updates, 4 epochs of 32 minibatches.
- ``purejaxrl_dqn``: PureJaxRL's DQN (``purejaxrl/dqn.py``, Apache-2.0) with flashbax's flat
  replay buffer (InstaDeep, Apache-2.0) on a gymnax-style CartPole-v1 (gymnax's dynamics,
  RobertTLange/gymnax, Apache-2.0), seeds vmapped, logging with ``jax.debug.callback``.
  Default: 10 envs, a 10,000-transition buffer, batches of 128, 50,000 updates.
- ``purejaxql_pqn``: PQN (``purejaxql/pqn_gymnax.py``, mttga/purejaxql, Apache-2.0; config
  ``pqn_cartpole.yaml``) on the same CartPole: a LayerNorm Q-network, Q(lambda) targets, no
  replay buffer. Default: 32 envs x 64 steps, 244 updates, 4 epochs of 16 minibatches.
- ``brax_ppo_train``: Brax's own ``ppo.train`` training epoch (google/brax, Apache-2.0),
  captured as :mod:`memfit.estimate.brax_measure` captures it. Default: ant (positional),
  Brax's published ant settings (4096 envs, batch 2048, 32 minibatches, unroll 5, 4 updates
  per batch).

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
