"""Where the time of a Brax measurement compiled for a card goes.

    python bench/brax_measure_profile.py --env humanoid --backend mjx --gpu "RTX 4070"

Stages, each timed on its own (wall seconds, this process's and the child's CPU):

* ``make``: importing Brax and making the env;
* ``export env``: tracing and exporting the wrapped, vmapped ``env.step`` for CUDA at
  :data:`memfit.estimate.brax_measure.ENV_STEP_SIZES` (the env's step and reset behind one
  ``jax.jit`` each with ``--traced-once``, an experiment: it saves the env's tracing in every
  program but changes XLA's temporaries, so a measurement does not do it);
* ``export train``: capturing Brax's training step and exporting it at each of
  :data:`memfit.estimate.brax_measure.MEASURE_POINTS`;
* ``compile``: XLA's GPU compile of each exported program for the card, one child per
  program (its own seconds, and whether the cuBLAS variant was compiled too), under each set
  of ``XLA_FLAGS`` given with ``--flags`` (``""``: JAX's defaults), with the memory figures
  each gives (a faster compile must give the same bytes).

The exports are kept in ``--keep`` (default ``bench/out/brax_profile``) and read back on a
later run, so the compile stage can be repeated alone. Writes
``bench/out/brax_measure_profile.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "out"


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def traced_once(env: Any) -> Any:
    """``env`` with its ``step`` and ``reset`` each behind one ``jax.jit``: JAX traces a
    jitted function once per abstract signature, so the env's physics is traced once for
    every program that holds it. Not what a measurement does: the nested ``jit`` changes
    XLA's temporaries (ant on spring at 1,024 envs: 3,850,800 B against 3,924,968 B)."""
    import jax
    from brax import envs

    class _TracedOnce(envs.Wrapper):  # type: ignore[misc]
        def __init__(self, inner: Any) -> None:
            super().__init__(inner)
            self._step = jax.jit(inner.step)
            self._reset = jax.jit(inner.reset)

        def reset(self, rng: Any) -> Any:
            return self._reset(rng)

        def step(self, state: Any, action: Any) -> Any:
            return self._step(state, action)

    return _TracedOnce(env)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", default="humanoid")
    ap.add_argument("--backend", default="mjx")
    ap.add_argument("--gpu", default="RTX 4070")
    ap.add_argument(
        "--flags",
        action="append",
        default=None,
        help="XLA_FLAGS for the child's compile (repeat; default: only JAX's)",
    )
    ap.add_argument("--keep", default=str(OUT / "brax_profile"))
    ap.add_argument(
        "--only",
        action="append",
        default=None,
        help="compile only these programs (env0, env1, train0, train1, train2)",
    )
    ap.add_argument(
        "--no-variant",
        action="store_true",
        help="skip the cuBLAS variant compile (XLA_FLAGS turn it off)",
    )
    ap.add_argument(
        "--traced-once",
        action="store_true",
        help="the env's step and reset behind one jax.jit each (an experiment: the compiled "
        "programs differ from what Brax runs)",
    )
    args = ap.parse_args(argv)
    command = "python bench/brax_measure_profile.py " + shlex.join(
        sys.argv[1:] if argv is None else argv
    )
    from memfit.estimate.xla._quiet import quiet_jax_start

    quiet_jax_start(brax=True)
    rows: list[dict[str, Any]] = []

    def stage(name: str, start: float, cpu: float, **extra: Any) -> None:
        row = {"stage": name, "wall_s": round(time.perf_counter() - start, 1),
               "cpu_s": round(_cpu() - cpu, 1), **extra}  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)

    t, c = time.perf_counter(), _cpu()
    import jax

    from memfit.estimate import _brax_exports as exports
    from memfit.estimate import brax_measure as bm
    from memfit.estimate.xla.gpu import compile_exported

    env, _env_id, _backend = bm._env_object(f"brax:{args.env}", args.backend)
    env = traced_once(env) if args.traced_once else env
    envs: Any = __import__("brax.envs", fromlist=["training"])
    config = bm.measurement_config()
    stage("make", t, c)
    target = bm.gpu_target_for(args.gpu)
    if target is None:
        raise SystemExit(f"no XLA target for {args.gpu!r} (the gpu-target extra?)")
    keep = Path(args.keep)

    t, c = time.perf_counter(), _cpu()
    wrapped = envs.training.wrap(env, episode_length=config["episode_length"], action_repeat=1)

    def env_jobs() -> tuple[list[Any], dict[str, Any]]:
        jobs = []
        for n in bm.ENV_STEP_SIZES:
            states = jax.eval_shape(wrapped.reset, bm._keys(n))
            actions = jax.ShapeDtypeStruct((n, int(env.action_size)), jax.numpy.float32)
            jobs.append((jax.jit(wrapped.step), (states, actions)))
        return jobs, {}

    env_steps, _ = exports.shared_exports(env_jobs, keep / "env")
    stage("export env", t, c, programs=len(env_steps))

    t, c = time.perf_counter(), _cpu()
    factory = bm.network_factory(config)

    def train_jobs() -> tuple[list[Any], dict[str, Any]]:
        jobs = []
        for n, batch, minis, unroll in bm.MEASURE_POINTS:
            fn, a, _ = bm._prepare_step(env, factory, config, n, batch, minis, unroll,
                                        single_device_jit=True)  # fmt: skip
            jobs.append((fn, a))
        return jobs, {}

    train_steps, _ = exports.shared_exports(train_jobs, keep / "train")
    stage("export train", t, c, programs=len(train_steps))

    programs = {f"env{i}": s for i, s in enumerate(env_steps)}
    programs.update({f"train{i}": s for i, s in enumerate(train_steps)})
    base = int(target.device_memory_size * 0.75)
    for flags in args.flags or [""]:
        for name, step in programs.items():
            if args.only and name not in args.only:
                continue
            environ = dict(os.environ)
            extra = " --xla_gpu_cublas_fallback=false" if args.no_variant else ""
            environ["XLA_FLAGS"] = (flags + extra).strip()
            t, c = time.perf_counter(), _cpu()
            (done,) = compile_exported([step], target, memory_base_bytes=base, environ=environ)
            stage(
                f"compile {name}", t, c, flags=environ["XLA_FLAGS"],
                child_s=round(done.seconds, 1), temp=done.temp_bytes,
                argument=done.argument_bytes, output=done.output_bytes,
                cublas_temp=done.cublas_temp_bytes, bytes=len(step.serialized),
            )  # fmt: skip
    lines = [
        f"`{command}`",
        "",
        "| stage | XLA_FLAGS | wall (s) | CPU (s) | temp | cuBLAS variant temp |",
        "|---|---|---:|---:|---:|---:|",
        *(
            f"| {r['stage']} | {r.get('flags', '') or '-'} | {r['wall_s']} | {r['cpu_s']} | "
            f"{r.get('temp', '')} | {r.get('cublas_temp', '') or ''} |"
            for r in rows
        ),
    ]
    text = "\n".join(lines)
    print(text)
    OUT.mkdir(exist_ok=True)
    (OUT / "brax_measure_profile.json").write_text(json.dumps({"command": command, "rows": rows}))
    (OUT / "brax_measure_profile.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
