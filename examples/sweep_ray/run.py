"""A Ray Tune sweep of the fire-raster DQN over two cards of different memory, packed by
memory.

Two logical GPUs stand in for a 3.68 GiB laptop card (GPU 0) and an 8 GiB card (GPU 1):
each trial runs under ``memfit.simulate_gpu`` of the card it landed on. memfit:

1. gives the sweep only configurations that fit a card of the cluster
   (``memfit.integrations.ray.feasible_configs``); at ``--smoke`` a few, spread over the range;
2. sizes each trial's GPU request from its predicted peak (``resources``: a fraction of the
   smallest card it fits), so Ray runs several small trials on one card and a large one
   alone, rather than one trial per card;
3. inside the trial, plans for the card the trial landed on (``trial_autoconfig``): the
   sweep's knobs are kept and checked against the trial's share of the card, and with
   ``--follow buffer_size`` the replay capacity follows the card (a larger buffer on the
   larger card; the trial then asks for a whole card);
4. reports the card, the knobs, the plan and the measured peak with ``tune.report``
   (``memfit.integrations.ray.metrics``), which the driver prints per trial.

    python examples/sweep_ray/run.py --smoke          # 4 trials, about a minute on 2 cores
    python examples/sweep_ray/run.py --smoke --follow buffer_size
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "sweep_optuna"))

from fire_trial import run_trial, sweep_workload

import memfit
from memfit.integrations import ray as memfit_ray
from memfit.units import format_bytes

CARDS = {0: "3.68GiB", 1: "8GiB"}
PYTHONPATH = os.environ.get("PYTHONPATH", "")
EXAMPLES = Path(__file__).resolve().parent.parent
HELPERS = [str(EXAMPLES / "sweep_optuna"), str(EXAMPLES / "dqn_fire")]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="a few trials, about a minute")
    ap.add_argument("--trials", type=int, default=16, help="trials without --smoke")
    ap.add_argument("--follow", default=None, help="a knob that follows the card (buffer_size)")
    ap.add_argument("--size", type=int, default=48, help="grid side in cells")
    ap.add_argument("--steps", type=int, default=10, help="environment steps per trial")
    ap.add_argument("--margin", default="10%")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import ray
    from ray import tune

    t0 = time.perf_counter()
    workload = sweep_workload(args.size, 8)
    cards = [memfit_ray.Card(CARDS[0], label="small"), memfit_ray.Card(CARDS[1], label="large")]
    configs = memfit_ray.feasible_configs(workload, cards, margin=args.margin)
    count = 4 if args.smoke else args.trials
    if args.follow is None:
        # packing: configurations every card holds (a single-node stand-in cannot steer a
        # trial to the card its label names), spread from the smallest to the largest
        small = memfit_ray.fits_some(workload, cards[:1], margin=args.margin)
        configs = [c for c in configs if small(c)]
    configs.sort(key=lambda c: (int(c["buffer_size"]), int(c["batch_size"])))
    rng = random.Random(args.seed)
    chosen = sorted(rng.sample(range(len(configs)), min(count, len(configs))))
    sweep = [configs[i] for i in chosen]
    print(
        f"{workload.name}: {len(configs)} configurations fit a card of the cluster "
        f"({', '.join(CARDS.values())}); sweeping {len(sweep)}"
    )
    for config in sweep:
        if args.follow:
            others = {k: v for k, v in config.items() if k != args.follow}
            print(f"  {others} ({args.follow} follows the card) asks for a whole GPU")
            continue
        req = memfit_ray.request_for(config, workload, cards, margin=args.margin)
        print(
            f"  {config} asks for {req.gpu:.2f} GPU"
            + (f" on {', '.join(req.labels)}" if req.labels else "")
            + f" (predicted {format_bytes(req.peak_bytes)})"
        )
    folder = tempfile.mkdtemp(prefix="mfray", dir="/tmp")  # Ray's socket paths stay short
    ray.init(
        num_cpus=2,
        num_gpus=2,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        _temp_dir=folder,
        # the workers import this example's helpers (fire_trial, the dqn_fire env) by name
        runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([*HELPERS, PYTHONPATH])}},
    )
    try:
        follow = (args.follow,) if args.follow else ()

        def trainable(config: dict[str, Any]) -> None:
            gpu_id = int(float(ray.get_gpu_ids()[0]))
            card = CARDS[gpu_id]
            # packing: the plan stays inside the share Ray gave the trial
            share = None
            if not follow:
                share = memfit_ray.request_for(
                    config["memfit"], workload, cards, margin=args.margin
                ).gpu
            with memfit.simulate_gpu(card):
                cfg = memfit_ray.trial_autoconfig(
                    workload, config["memfit"], follow=follow, share=share, margin=args.margin
                )
            knobs = dict(cfg.knobs)
            reward, peak = run_trial(
                card, knobs, 1e-4, 0.99, size=args.size, steps=args.steps, seed=args.seed
            )
            tune.report(
                {
                    **memfit_ray.metrics(peak_bytes=peak, cfg=cfg),
                    "gpu_id": gpu_id,
                    "reward": reward,
                    "share": share or 1.0,
                    "fits": cfg.plan.fits,
                }
            )

        if follow:
            size = lambda config: tune.PlacementGroupFactory([{"CPU": 0.5, "GPU": 1.0}])  # noqa: E731
        else:
            size = memfit_ray.resources(workload, cards, cpu=0.5, margin=args.margin)
        tuner = tune.Tuner(
            tune.with_resources(trainable, size),
            param_space={"memfit": tune.grid_search(sweep)},
            run_config=tune.RunConfig(storage_path=str(Path(folder) / "results"), verbose=0),
        )
        results = tuner.fit()
        for result in sorted(results, key=lambda r: r.metrics.get("memfit/knob/buffer_size", 0)):
            if result.error is not None:
                print(f"trial failed: {result.error}")
                continue
            m = result.metrics
            print(
                f"trial on GPU {m['gpu_id']} ({CARDS[m['gpu_id']]}): "
                f"buffer_size={m['memfit/knob/buffer_size']:,} "
                f"batch_size={m['memfit/knob/batch_size']}  "
                f"share {m['share']:.2f} (plan fits it: {m['fits']}), "
                f"planned {format_bytes(m['memfit/planned_bytes'])}, "
                f"measured peak {format_bytes(m['memfit/peak_bytes'])}"
            )
        errors = len(results.errors)
    finally:
        ray.shutdown()
        shutil.rmtree(folder, ignore_errors=True)
    print(f"{len(sweep)} trials, {errors} failed; wall time {time.perf_counter() - t0:.1f} s")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
