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
import copy
import sys
import time
from pathlib import Path
from typing import Any

import optuna
import torch
import torch.nn.functional as F
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "dqn_fire"))

from env import ACTIONS, CHANNELS, FireEnv
from model import NETWORK_SPECS, NETWORKS

import memfit
from memfit.core.workload import BUNDLED_DIR, Workload, parse_workload
from memfit.integrations import optuna as memfit_optuna
from memfit.units import format_bytes, parse_bytes


def sweep_workload(size: int, num_envs: int) -> Workload:
    """The bundled DQN with this grid, the basic Q-network, the replay buffer on the GPU,
    and the batch size a knob (it is a setting in the bundled workload)."""
    data = yaml.safe_load((BUNDLED_DIR / "dqn_fire_raster.yaml").read_text(encoding="utf-8"))
    data.pop("variants", None)
    spec = NETWORK_SPECS["basic"]
    data["name"] = f"dqn_fire_sweep_{size}"
    data["observations"] = {
        "raster": {"channels": len(CHANNELS), "height": size, "width": size, "dtype": "uint8"}
    }
    data["networks"] = {"q": spec, "q_target": {**spec, "target": True}}
    data["replay"] = {**data["replay"], "placement": "gpu"}
    data["settings"] = {"num_envs": num_envs}
    data["knobs"] = {
        "buffer_size": {"min": 20_000, "max": 2_000_000, "step": 20_000, "priority": 2},
        "batch_size": {"min": 32, "max": 4096, "powers_of_two": True, "priority": 1},
    }
    data["constraints"] = {
        "rules": [{"knob": "buffer_size", "divisible_by": num_envs, "name": "buffer per env"}]
    }
    return parse_workload(yaml.safe_dump(data, sort_keys=False), source=data["name"])


class Replay:
    """A uint8 ring buffer of transitions on the (simulated) GPU."""

    def __init__(self, capacity: int, obs_shape: tuple[int, ...]) -> None:
        self.capacity, self.size, self.pos = capacity, 0, 0
        # torch.empty: the pages are only touched where transitions are written, so a large
        # buffer costs this CPU little real memory while the simulated GPU counts all of it
        self.obs = torch.empty((capacity, *obs_shape), dtype=torch.uint8)
        self.next_obs = torch.empty_like(self.obs)
        self.act = torch.empty(capacity, dtype=torch.int64)
        self.rew = torch.empty(capacity)
        self.done = torch.empty(capacity)

    def add(self, obs: Any, act: Any, rew: Any, next_obs: Any, done: Any) -> None:
        idx = (torch.arange(obs.shape[0]) + self.pos) % self.capacity
        self.obs[idx], self.next_obs[idx], self.act[idx] = obs, next_obs, act
        self.rew[idx], self.done[idx] = rew, done.float()
        self.pos = (self.pos + obs.shape[0]) % self.capacity
        self.size = min(self.size + obs.shape[0], self.capacity)

    def sample(self, batch: int, gen: torch.Generator) -> dict[str, Any]:
        idx = torch.randint(0, self.size, (batch,), generator=gen)
        return {
            "obs": self.obs[idx],
            "act": self.act[idx],
            "rew": self.rew[idx],
            "next_obs": self.next_obs[idx],
            "done": self.done[idx],
        }


def run_trial(args: argparse.Namespace, knobs: dict[str, Any], lr: float, gamma: float) -> Any:
    """Build the DQN with these knobs on a simulated card and run a few guarded updates.

    Returns:
        (mean reward over the run, simulated peak in bytes)
    """
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    with memfit.simulate_gpu(args.gpu) as gpu:
        env = FireEnv(args.num_envs, args.size, device=torch.device("cpu"), seed=args.seed)
        q = NETWORKS["basic"](len(CHANNELS), args.size, len(ACTIONS))
        target = copy.deepcopy(q)
        optimizer = torch.optim.Adam(q.parameters(), lr=lr)
        replay = Replay(int(knobs["buffer_size"]), env.observation_shape)

        def loss_fn(b: dict[str, Any]) -> torch.Tensor:
            with torch.no_grad():
                best = target(b["next_obs"]).max(dim=1).values
                y = b["rew"] + gamma * (1.0 - b["done"]) * best
            qa = q(b["obs"]).gather(1, b["act"].unsqueeze(1)).squeeze(1)
            return F.smooth_l1_loss(qa, y)

        guard = memfit.TrainGuard(optimizer, loss_fn, max_splits=8)
        obs = env.reset()
        rewards = []
        for step in range(args.steps):
            with torch.no_grad():
                greedy = q(obs).argmax(dim=1)
            explore = torch.rand(args.num_envs, generator=gen) < 0.2
            act = torch.where(
                explore, torch.randint(0, len(ACTIONS), (args.num_envs,), generator=gen), greedy
            )
            next_obs, rew, done = env.step(act)
            replay.add(obs, act, rew, next_obs, done)
            rewards.append(float(rew.mean()))
            obs = next_obs
            if step >= args.learning_starts:
                guard(replay.sample(int(knobs["batch_size"]), gen))
        return sum(rewards) / len(rewards), gpu.peak_allocated_bytes


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
        reward, peak = run_trial(args, knobs, lr, gamma)
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
        f"{format_bytes(max(peaks))}"
        + (f" of {format_bytes(budget)}" if budget else "")
    )
    best = study.best_trial
    print(f"best: {memfit_optuna.knobs(best)} lr={best.params['lr']:.1e} ({best.value:+.3f})")
    print(f"wall time {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
