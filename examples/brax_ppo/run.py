"""Brax PPO on a legged robot, planned and checked by memfit.

1. Allocator: ``memfit.configure`` sets XLA's client settings *before* JAX starts (here:
   allocate on demand, so the Recorder sees what the job really uses).
2. Check: ``memfit.integrations.brax.check_ppo`` tests every rule Brax's ``ppo.train``
   asserts, before Brax does, and names the nearest valid settings.
3. Plan: ``measure_ppo`` measures the env and Brax's own training step (the env state as
   ``ppo.train`` holds it, the vmapped step's temporaries, and the step compiled at three
   settings; cached), and ``plan_ppo`` plans ``num_envs`` / ``batch_size`` /
   ``num_minibatches`` / ``unroll_length`` from those measurements for ``--gpu`` and for
   each ``--tiers`` card; ``--out`` writes the fitted configurations (YAML or JSON) with the
   XLA settings to use (memfit's one recommendation, as ``memfit plan`` prints it).
4. Train: Brax's own PPO at the small setting, with a :class:`memfit.Recorder` called from
   ``progress_fn`` (``--skip-train`` only plans).

Small setting (CPU, about a minute): ``python examples/brax_ppo/run.py``.
Tier table: ``python examples/brax_ppo/run.py --gpu "RTX 3060 Ti" --tiers 8,12,16,24
--batch-size 1024 --num-minibatches 32 --unroll-length 10 --out fitted.yaml --skip-train``:
``num_envs`` scales with memory while the learning hyperparameters hold (``--scale``,
``--hold`` choose). Full run on the card the plan was made for:
``python examples/brax_ppo/run.py --from-plan fitted.yaml --tier "RTX 3060 Ti"
--num-timesteps 50000000``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import yaml

import memfit
from memfit.integrations import brax as mbrax
from memfit.units import format_bytes

#: A representative card for each memory tier (GB).
TIER_CARDS: dict[int, str] = {8: "RTX 3060 Ti", 12: "RTX 4070", 16: "RTX 4080", 24: "RTX 4090"}

#: Search ranges for the tier plans (wider than memfit's defaults: ant is a small robot).
RANGES: dict[str, tuple[int, ...]] = {
    "num_envs": (256, 131072),
    "batch_size": (256, 65536),
    "num_minibatches": (4, 64),
    "unroll_length": (5, 10, 20, 30),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--env", default="ant", help="Brax environment name")
    ap.add_argument("--backend", default="spring", help="Brax pipeline (spring is fast on CPU)")
    ap.add_argument("--num-envs", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--num-minibatches", type=int, default=2)
    ap.add_argument("--unroll-length", type=int, default=5)
    ap.add_argument("--num-timesteps", type=int, default=640)
    ap.add_argument("--episode-length", type=int, default=100)
    ap.add_argument("--num-evals", type=int, default=2)
    ap.add_argument("--gpu", default="RTX 3060 Ti", help="GPU to plan for")
    ap.add_argument("--tiers", default="", help="GB tiers to plan, e.g. 8,12,16,24")
    ap.add_argument(
        "--scale",
        default="num_envs",
        help="knob(s) the tier table scales with memory, comma-separated (default num_envs)",
    )
    ap.add_argument(
        "--hold",
        default=None,
        help="knob(s) the tier table holds at this run's values, comma-separated (default: "
        "every other knob: batch_size, num_minibatches and unroll_length change how PPO "
        "learns, so a tier table keeps them unless told otherwise; --hold '' frees them)",
    )
    ap.add_argument("--out", default=None, help="write the fitted configurations here")
    ap.add_argument("--margin", default="5%", help="safety margin (memfit's default)")
    ap.add_argument("--from-plan", default=None, help="train with a fitted configuration file")
    ap.add_argument("--tier", default=None, help="which GPU of --from-plan to use")
    ap.add_argument("--skip-train", action="store_true")
    ap.add_argument(
        "--fast-compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="turn XLA's expensive CPU optimisation passes off (halves compile time; "
        "default: on for the small setting, num_timesteps <= 100000, unless XLA_FLAGS is set)",
    )
    ap.add_argument("--log", default=str(Path(tempfile.gettempdir()) / "brax_ppo.jsonl"))
    return ap.parse_args(argv)


def tier_gpus(text: str) -> list[str]:
    """``"8,12"`` -> the representative card of each tier (a size for unknown tiers)."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        if not part.isdigit():
            raise memfit.ConfigError(f"not a GB tier: {part!r}", key_path="--tiers")
        out.append(TIER_CARDS.get(int(part), f"{part}GB"))
    return out


def tier_pins(args: argparse.Namespace) -> dict[str, int]:
    """The knobs a tier plan holds at this run's values: every knob not in ``--scale``, or
    those ``--hold`` names.

    >>> tier_pins(parse_args(["--batch-size", "1024", "--num-minibatches", "32"]))
    {'batch_size': 1024, 'num_minibatches': 32, 'unroll_length': 5}
    >>> tier_pins(parse_args(["--hold", ""]))
    {}
    """
    values = {
        "num_envs": args.num_envs,
        "batch_size": args.batch_size,
        "num_minibatches": args.num_minibatches,
        "unroll_length": args.unroll_length,
    }
    scaled = {k.strip() for k in args.scale.split(",") if k.strip()}
    if args.hold is None:
        held = [k for k in values if k not in scaled]
    else:
        held = [k.strip() for k in args.hold.split(",") if k.strip()]
    unknown = sorted((scaled | set(held)) - set(values))
    if unknown:
        raise memfit.ConfigError(
            f"not a Brax PPO knob: {', '.join(unknown)}",
            key_path="--scale/--hold",
            hint="use num_envs, batch_size, num_minibatches, unroll_length",
        )
    return {k: values[k] for k in held}


def fitted(plan: memfit.Plan, total_bytes: int) -> dict[str, Any]:
    """One fitted configuration: Brax arguments, XLA settings and the prediction."""
    return {
        "gpu": plan.gpu,
        "ppo": mbrax.ppo_kwargs(plan),
        "env": mbrax.jax_allocator_settings(plan, total_bytes),
        "predicted_bytes": plan.predicted_bytes,
        "used_bytes": plan.used_bytes,
        "pool_bytes": plan.pool_bytes,
        "budget_bytes": plan.budget_bytes,
        "binding": plan.binding,
        "breakdown": plan.breakdown,
    }


def write(path: str, configs: list[dict[str, Any]]) -> None:
    """YAML for ``.yaml`` / ``.yml``, JSON otherwise."""
    target = Path(path)
    if target.suffix in (".yaml", ".yml"):
        target.write_text(yaml.safe_dump({"configs": configs}, sort_keys=False), encoding="utf-8")
    else:
        target.write_text(json.dumps({"configs": configs}, indent=2) + "\n", encoding="utf-8")


def from_plan(path: str, tier: str | None) -> dict[str, int]:
    """The Brax arguments of one configuration in a fitted file."""
    text = Path(path).read_text(encoding="utf-8")
    data = yaml.safe_load(text)  # JSON is YAML too
    configs = data.get("configs", []) if isinstance(data, dict) else []
    if not configs:
        raise memfit.ConfigError("no configs in the file", key_path=path)
    if tier is None:
        return dict(configs[0]["ppo"])
    wanted = memfit.gpu(tier).name
    for config in configs:
        if config["gpu"] == wanted:
            return dict(config["ppo"])
    raise memfit.ConfigError(
        f"no configuration for {wanted}",
        key_path=path,
        hint="one of " + ", ".join(c["gpu"] for c in configs),
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for noisy in ("absl", "jax._src.xla_bridge", "brax"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message="Brax System, piplines")  # brax's own notice
    t0 = time.perf_counter()
    # 1. allocator settings, before JAX initialises a backend
    written = memfit.configure(jax_preallocate=False)
    print("allocator settings: " + ", ".join(f"{k}={v}" for k, v in written.items()))
    fast = args.fast_compile
    if fast is None:
        fast = args.num_timesteps <= 100_000 and "XLA_FLAGS" not in os.environ
    if fast:
        # Most of the small setting's time is XLA compiling Brax's training step for the CPU;
        # these two flags halve it (measured: 67 s -> 36 s of CPU time for ppo.train).
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "")
            + " --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
        ).strip()
        print("fast compile: XLA_FLAGS=" + os.environ["XLA_FLAGS"])

    import jax
    from brax import envs

    from memfit.estimate.xla.step import env_state_bytes

    env = envs.get_environment(args.env, backend=args.backend)
    knobs = {
        "num_envs": args.num_envs,
        "batch_size": args.batch_size,
        "num_minibatches": args.num_minibatches,
        "unroll_length": args.unroll_length,
    }
    if args.from_plan:
        knobs = from_plan(args.from_plan, args.tier)
        print(f"from {args.from_plan}: {knobs}")
    train_kwargs: dict[str, Any] = {
        **knobs,
        "num_timesteps": args.num_timesteps,
        "episode_length": args.episode_length,
        "num_evals": args.num_evals,
        "run_evals": False,
        "num_updates_per_batch": 1,
    }
    # 2. the rules Brax asserts, checked first
    try:
        mbrax.check_ppo(**train_kwargs)
    except memfit.ConfigError as exc:
        print(f"check_ppo: {exc.message}\n  {exc.hint}")
        return 1
    devices = jax.local_device_count()
    print(f"check_ppo: ok ({jax.default_backend()}, {devices} device(s))")
    state_bytes = env_state_bytes(env)
    print(
        f"env {args.env} ({args.backend}): obs {env.observation_size}, action {env.action_size}, "
        f"state {format_bytes(state_bytes)} per env (jax.eval_shape)"
    )
    # 3. measure the env and Brax's own training step (cached), then plan: this setting on
    #    --gpu, then the best configuration per tier
    t_measure = time.perf_counter()
    measured = mbrax.measure_ppo(env)
    took = time.perf_counter() - t_measure
    print(
        f"measured: {format_bytes(measured.env_state_bytes)} per env as ppo.train holds it, "
        f"env step {format_bytes(round(measured.env_step.per_item_bytes))} per env, "
        f"training step compiled at {len(measured.step.points)} settings "
        f"({took:.1f} s; {'from the cache' if took < 1 else 'cached for next time'})"
    )
    mine = mbrax.plan_ppo(env, gpu=args.gpu, margin=args.margin, measurements=measured, **knobs)
    print(
        f"this setting on {mine.gpu}: needs {format_bytes(mine.used_bytes)} (with the CUDA "
        f"context) of a {format_bytes(mine.budget_bytes)} budget"
    )
    configs = []
    gpus = [args.gpu, *(g for g in tier_gpus(args.tiers) if g != args.gpu)]
    print(f"{'GPU':<32} {'num_envs':>8} {'batch':>6} {'minib':>5} {'unroll':>6} "
          f"{'buffers':>10} {'XLA pool':>10}  XLA mem fraction")  # fmt: skip
    held = tier_pins(args)
    ranges = dict(RANGES)
    if held:
        print("tier table holds " + ", ".join(f"{k}={v}" for k, v in held.items())
              + " (how PPO learns) and scales the rest; --hold '' frees them")  # fmt: skip
        if {"batch_size", "num_minibatches"} <= set(held):
            cap = held["batch_size"] * held["num_minibatches"]
            # Brax's rule: num_envs divides batch_size * num_minibatches
            low = min(RANGES["num_envs"][0], args.num_envs)
            ranges["num_envs"] = (low, RANGES["num_envs"][1])
            print(f"  num_envs can reach batch_size x num_minibatches = {cap} at most (Brax)")
    for name in gpus:
        spec = memfit.gpu(name)
        try:
            p = mbrax.plan_ppo(
                env, gpu=spec, margin=args.margin, ranges=ranges, measurements=measured, **held
            )
        except memfit.InfeasiblePlan as exc:
            print(f"{spec.name:<32} does not fit: {exc.message}")
            continue
        config = fitted(p, spec.total_bytes)
        configs.append(config)
        k = config["ppo"]
        print(
            f"{p.gpu:<32} {k['num_envs']:>8} {k['batch_size']:>6} {k['num_minibatches']:>5} "
            f"{k['unroll_length']:>6} "
            f"{format_bytes(p.used_bytes - p.breakdown['cuda_context']):>10} "
            f"{format_bytes(p.pool_bytes or 0):>10}  "
            f"{next(v for k, v in config['env'].items() if k.endswith('MEM_FRACTION'))}"
        )
    if args.out:
        write(args.out, configs)
        print(f"wrote {len(configs)} fitted configuration(s) to {args.out}")
    if args.skip_train:
        return 0
    # 4. Brax's own PPO, with memory recorded at every progress callback
    Path(args.log).unlink(missing_ok=True)
    with memfit.Recorder(args.log, log_every=1) as rec:
        steps: list[int] = []

        def progress(num_steps: int, metrics: dict[str, Any]) -> None:
            steps.append(num_steps)
            rec.step(num_steps)

        start = time.perf_counter()
        _, _, metrics = mbrax.train(env, progress_fn=progress, **train_kwargs)
        seconds = time.perf_counter() - start
    reward = metrics.get("episode/sum_reward")
    reward_text = f", episode reward {float(reward):.2f}" if reward is not None else ""
    print(
        f"trained {steps[-1] if steps else 0} env steps in {seconds:.1f} s "
        f"(memory source: {rec.source}){reward_text}"
    )
    print(f"memory log: {args.log}; total {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
