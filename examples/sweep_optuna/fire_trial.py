"""The fire-raster DQN trial both sweep examples run (``sweep_optuna``, ``sweep_ray``):
the workload with the replay capacity and the batch size as knobs, and one short trial on a
simulated card. The environment and the networks are those of ``examples/dqn_fire``."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "dqn_fire"))

from env import ACTIONS, CHANNELS, FireEnv
from model import NETWORK_SPECS, NETWORKS

import memfit
from memfit.core.workload import BUNDLED_DIR, Workload, parse_workload


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


def run_trial(
    card: str,
    knobs: dict[str, Any],
    lr: float,
    gamma: float,
    *,
    size: int = 48,
    num_envs: int = 8,
    steps: int = 12,
    learning_starts: int = 8,
    seed: int = 0,
) -> Any:
    """Build the DQN with these knobs on a simulated card and run a few guarded updates.

    Returns:
        (mean reward over the run, simulated peak in bytes)
    """
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    with memfit.simulate_gpu(card) as gpu:
        env = FireEnv(num_envs, size, device=torch.device("cpu"), seed=seed)
        q = NETWORKS["basic"](len(CHANNELS), size, len(ACTIONS))
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
        for step in range(steps):
            with torch.no_grad():
                greedy = q(obs).argmax(dim=1)
            explore = torch.rand(num_envs, generator=gen) < 0.2
            act = torch.where(
                explore, torch.randint(0, len(ACTIONS), (num_envs,), generator=gen), greedy
            )
            next_obs, rew, done = env.step(act)
            replay.add(obs, act, rew, next_obs, done)
            rewards.append(float(rew.mean()))
            obs = next_obs
            if step >= learning_starts:
                guard(replay.sample(int(knobs["batch_size"]), gen))
        return sum(rewards) / len(rewards), gpu.peak_allocated_bytes
