"""Measure a Brax PPO job from its real env and Brax's own compiled training step, and check
the fitted model against more compiled settings.

    python bench/brax_measure.py --env humanoid --backend mjx \
        --validate 4096,1024,32,20 --validate 1024,512,2,10

Prints the ``measurements:`` block to paste into a workload file (with its provenance: the
versions, the platform, the date and this command), and for every ``--validate`` setting
(``num_envs,batch_size,num_minibatches,unroll_length``) compiles Brax's training step there
and compares XLA's peak with the model's (``training_state + env_state + rollout_buffer +
env_step_temporaries + sgd_temporaries``). Writes JSON and a markdown table to ``bench/out``.
Nothing runs on a device: everything is ``jax.eval_shape`` and compiled memory analysis, on
the backend JAX has (the CPU here; a GPU backend on a GPU machine).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from memfit.units import format_bytes

OUT = Path(__file__).resolve().parent / "out"


def _setting(text: str) -> tuple[int, int, int, int]:
    parts = [int(p) for p in text.split(",")]
    if len(parts) != 4 or min(parts) < 1:
        raise argparse.ArgumentTypeError("give num_envs,batch_size,num_minibatches,unroll_length")
    return parts[0], parts[1], parts[2], parts[3]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", default="humanoid")
    ap.add_argument("--backend", default="mjx")
    ap.add_argument("--num-updates-per-batch", type=int, default=2)
    ap.add_argument("--validate", type=_setting, action="append", default=[])
    ap.add_argument("--no-cache", action="store_true", help="measure even when cached")
    args = ap.parse_args(argv)
    command = "python bench/brax_measure.py " + shlex.join(sys.argv[1:] if argv is None else argv)

    from memfit.estimate import brax_measure as bm

    start = time.perf_counter()
    record = bm.measure_ppo(
        args.env,
        backend=args.backend,
        num_updates_per_batch=args.num_updates_per_batch,
        refresh=args.no_cache,
        command=command,
    )
    seconds = time.perf_counter() - start
    block = yaml.safe_dump(
        {"measurements": json.loads(record.model_dump_json())}, sort_keys=False, width=96
    )
    print(block)
    print(f"# measured in {seconds:.1f} s (cache hit when ~0 s)")
    rows: list[dict[str, Any]] = []
    if args.validate:
        from brax import envs

        env = envs.get_environment(args.env, backend=args.backend)
        factory = bm.network_factory(record.config)
        for n, b, m, u in args.validate:
            t0 = time.perf_counter()
            compiled = bm.compile_step(env, factory, record.config, n, b, m, u)
            values = {"num_envs": n, "batch_size": b, "num_minibatches": m, "unroll_length": u}
            model = sum(nbytes for _name, nbytes in record.terms(values))
            error = (model - compiled["peak_bytes"]) / compiled["peak_bytes"]
            rows.append(
                {
                    "setting": values,
                    "compiled_peak_bytes": compiled["peak_bytes"],
                    "model_bytes": model,
                    "error": error,
                    "compile_seconds": round(time.perf_counter() - t0, 1),
                }
            )
            print(
                f"{n:>6} {b:>5} {m:>3} {u:>3}  compiled {format_bytes(compiled['peak_bytes']):>11}"
                f"  model {format_bytes(model):>11}  error {error:+.2%}",
                flush=True,
            )
    OUT.mkdir(parents=True, exist_ok=True)
    stem = f"brax_measure_{args.env}_{args.backend}"
    (OUT / f"{stem}.json").write_text(
        json.dumps(
            {
                "command": command,
                "seconds": seconds,
                "measurements": json.loads(record.model_dump_json()),
                "validation": rows,
            },
            indent=2,
        )
        + "\n",
        encoding="utf-8",
    )
    lines = [
        f"# {args.env} ({args.backend}): the measured model against compiled training steps",
        "",
        f"`{command}`",
        "",
        "| num_envs | batch | minibatches | unroll | compiled peak | model | error |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        s = row["setting"]
        lines.append(
            f"| {s['num_envs']} | {s['batch_size']} | {s['num_minibatches']} | "
            f"{s['unroll_length']} | {format_bytes(row['compiled_peak_bytes'])} | "
            f"{format_bytes(row['model_bytes'])} | {row['error']:+.2%} |"
        )
    (OUT / f"{stem}.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
