"""An Optuna sweep of the fire-raster DQN on a 3.7 GB card: no trial on a configuration that
cannot fit.

The study sweeps the DQN's replay capacity and batch size (memfit's knobs, with the replay
buffer on the GPU, where it is what limits a 4 GB laptop card) together with the learning
rate and the discount (the user's own hyperparameters). ``memfit.integrations.optuna.suggest``
draws the knobs from the configurations that keep the workload's rules and fit the card by
memfit's plan; each trial then builds the Q-networks and the replay buffer and runs a few
guarded updates under ``memfit.simulate_gpu`` of the card's size, and prints the knobs, the
plan's prediction and the peak it measured. A trial that still ran out of memory would be
reported to Optuna as pruned with the reason (``memfit.integrations.optuna.objective``).

The environment and the networks are those of ``examples/dqn_fire``.

    python examples/sweep_optuna/run.py                       # 12 trials, about a minute
    python examples/sweep_optuna/run.py --storage sqlite:///sweep.db --study fire   # a worker

Run the second line on several machines (or twice here) with one database: Optuna shares the
study between them (use PostgreSQL or MySQL across machines).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

import optuna
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fire_trial import run_trial, sweep_workload

from memfit.integrations import optuna as memfit_optuna
from memfit.units import format_bytes, parse_bytes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", default="3.68GiB", help="the card to fit (name or size)")
    ap.add_argument("--trials", type=int, default=12)
    ap.add_argument("--size", type=int, default=48, help="grid side in cells")
    ap.add_argument("--num-envs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=12, help="environment steps per trial")
    ap.add_argument("--learning-starts", type=int, default=8)
    ap.add_argument("--margin", default="10%")
    ap.add_argument("--storage", default=None, help="Optuna storage URL shared by workers")
    ap.add_argument("--study", default="dqn_fire_sweep")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    t0 = time.perf_counter()
    workload = sweep_workload(args.size, args.num_envs)
    space = memfit_optuna.space(workload, gpu=args.gpu, margin=args.margin)
    declared = len(workload.knobs["buffer_size"].values()) * len(
        workload.knobs["batch_size"].values()
    )
    print(
        f"{workload.name} on {args.gpu}: {len(space)} of {declared} declared configurations "
        f"fit (budget {format_bytes(space.budget_bytes)}); a sampler over the declared ranges "
        f"would draw one that cannot fit {100 * (1 - len(space) / declared):.0f}% of the time"
    )
    study = optuna.create_study(
        study_name=args.study,
        storage=args.storage,
        load_if_exists=args.storage is not None,
        direction="maximize",
        sampler=optuna.samplers.TPESampler(seed=args.seed, n_startup_trials=6),
    )
    budget = parse_bytes(args.gpu) if args.gpu[0].isdigit() else None

    @memfit_optuna.objective
    def objective(trial: optuna.Trial) -> float:
        knobs = memfit_optuna.suggest(trial, workload, gpu=args.gpu, margin=args.margin)
        lr = trial.suggest_float("lr", 1e-5, 1e-3, log=True)
        gamma = trial.suggest_float("gamma", 0.9, 0.999)
        reward, peak = run_trial(
            args.gpu,
            knobs,
            lr,
            gamma,
            size=args.size,
            num_envs=args.num_envs,
            steps=args.steps,
            learning_starts=args.learning_starts,
            seed=args.seed,
        )
        record = trial.user_attrs[memfit_optuna.ATTR]
        trial.set_user_attr("measured_peak_bytes", peak)
        print(
            f"trial {trial.number:2d}: buffer_size={knobs['buffer_size']:>9,} "
            f"batch_size={knobs['batch_size']:>4} lr={lr:.1e} gamma={gamma:.3f}  "
            f"planned {format_bytes(record['predicted_bytes'])}, "
            f"measured peak {format_bytes(peak)}  reward {reward:+.3f}"
        )
        return reward

    study.optimize(objective, n_trials=args.trials)
    states = [t.state for t in study.trials]
    complete = states.count(optuna.trial.TrialState.COMPLETE)
    pruned = states.count(optuna.trial.TrialState.PRUNED)
    peaks = [t.user_attrs.get("measured_peak_bytes", 0) for t in study.trials]
    distinct = {tuple(sorted((memfit_optuna.knobs(t) or {}).items())) for t in study.trials}
    print(
        f"{len(states)} trials: {complete} complete, {pruned} pruned for memory, "
        f"{len(distinct)} distinct configurations; largest measured peak "
        f"{format_bytes(max(peaks))}" + (f" of {format_bytes(budget)}" if budget else "")
    )
    best = study.best_trial
    print(f"best: {memfit_optuna.knobs(best)} lr={best.params['lr']:.1e} ({best.value:+.3f})")
    print(f"wall time {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
