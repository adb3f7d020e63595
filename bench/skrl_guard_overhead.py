"""What memfit.integrations.skrl.guard costs per skrl PPO update (CPU).

An skrl PPO agent shaped as Isaac Lab's Ant (observation 60, action 8, one shared
256-128-64 ELU net with a policy and a value head, Adam, RunningStandardScaler on the
observations and values; rollouts 16, learning_epochs 4, mini_batches 2) with a
``RandomMemory`` of ``16 x num_envs`` random transitions runs ``agent.update`` bare and
guarded, interleaved, ``--repeats`` times each. The guard saves the models, optimizer,
scaler and preprocessors to host memory and the RNGs before each update (and the
``values``/``returns``/``advantages`` tensors on first write); the difference is that cost.
Times are CPU time of the calling thread (``time.thread_time``), which other processes on a
shared machine do not inflate, and wall time; fastest and median of the repeats.

Writes ``bench/out/skrl_guard_overhead.json`` and ``.md``. Run:
``python bench/skrl_guard_overhead.py [--envs 256 1024] [--repeats 7]`` (about a minute).
"""

from __future__ import annotations

import argparse
import logging
import platform
import statistics
import time
from typing import Any

import gymnasium
import torch
from _common import utc_minute, write_results
from skrl.agents.torch.ppo import PPO, PPO_CFG
from skrl.memories.torch import RandomMemory
from skrl.models.torch import DeterministicMixin, GaussianMixin, Model
from skrl.resources.preprocessors.torch import RunningStandardScaler

from memfit.integrations import skrl as mskrl

logging.getLogger("skrl").setLevel(logging.WARNING)
OBS, ACT, ROLLOUTS = 60, 8, 16


class Shared(GaussianMixin, DeterministicMixin, Model):  # type: ignore[misc]
    """Isaac Lab's skrl model with ``separate: False``: one net, two heads."""

    def __init__(self, obs: Any, act: Any) -> None:
        Model.__init__(self, observation_space=obs, action_space=act, device="cpu")
        GaussianMixin.__init__(self, role="policy")
        DeterministicMixin.__init__(self, role="value")
        self.net = torch.nn.Sequential(
            torch.nn.Linear(OBS, 256), torch.nn.ELU(), torch.nn.Linear(256, 128), torch.nn.ELU(),
            torch.nn.Linear(128, 64), torch.nn.ELU(),
        )  # fmt: skip
        self.mean = torch.nn.Linear(64, ACT)
        self.value = torch.nn.Linear(64, 1)
        self.log_std = torch.nn.Parameter(torch.zeros(ACT))

    def act(self, inputs: dict[str, Any], role: str = "") -> Any:
        if role == "policy":
            return GaussianMixin.act(self, inputs, role=role)
        return DeterministicMixin.act(self, inputs, role=role)

    def compute(self, inputs: dict[str, Any], role: str = "") -> Any:
        features = self.net(inputs["observations"])
        if role == "policy":
            return self.mean(features), {"log_std": self.log_std}
        return self.value(features), {}


def _agent(envs: int) -> Any:
    obs = gymnasium.spaces.Box(-1, 1, (OBS,))
    act = gymnasium.spaces.Box(-1, 1, (ACT,))
    model = Shared(obs, act)
    cfg = PPO_CFG(
        rollouts=ROLLOUTS,
        learning_epochs=4,
        mini_batches=2,
        observation_preprocessor=RunningStandardScaler,
        observation_preprocessor_kwargs={"size": obs, "device": "cpu"},
        value_preprocessor=RunningStandardScaler,
        value_preprocessor_kwargs={"size": 1, "device": "cpu"},
    )
    cfg.experiment.write_interval = 0
    cfg.experiment.checkpoint_interval = 0
    memory = RandomMemory(memory_size=ROLLOUTS, num_envs=envs, device="cpu")
    agent = PPO(models={"policy": model, "value": model}, memory=memory,
                observation_space=obs, action_space=act, device="cpu", cfg=cfg)  # fmt: skip
    agent.init()
    g = torch.Generator().manual_seed(0)
    for _ in range(ROLLOUTS):
        agent.memory.add_samples(
            observations=torch.randn(envs, OBS, generator=g),
            actions=torch.randn(envs, ACT, generator=g),
            rewards=torch.randn(envs, 1, generator=g),
            terminated=torch.zeros(envs, 1, dtype=torch.bool),
            truncated=torch.zeros(envs, 1, dtype=torch.bool),
            log_prob=torch.randn(envs, 1, generator=g),
            values=torch.randn(envs, 1, generator=g),
        )
    agent._current_next_observations = torch.randn(envs, OBS, generator=g)
    agent._current_next_states = None
    agent.enable_models_training_mode(True)
    return agent


def _time(agent: Any) -> tuple[float, float]:
    cpu, wall = time.thread_time(), time.perf_counter()
    agent.update(timestep=ROLLOUTS - 1, timesteps=10**6)
    return time.thread_time() - cpu, time.perf_counter() - wall


def measure(envs: int, repeats: int) -> dict[str, Any]:
    torch.set_num_threads(1)
    bare_agent, guarded_agent = _agent(envs), _agent(envs)
    guard = mskrl.guard(guarded_agent, rollout=False)
    _time(bare_agent), _time(guarded_agent)  # warm-up
    bare: list[tuple[float, float]] = []
    guarded: list[tuple[float, float]] = []
    for _ in range(repeats):
        bare.append(_time(bare_agent))
        guarded.append(_time(guarded_agent))
    params = sum(p.numel() for p in bare_agent.policy.parameters())
    captures = []
    for _ in range(20):  # the save alone, as the guard takes it before every update
        start = time.thread_time()
        guard._state.capture()
        captures.append(time.thread_time() - start)

    def stats(xs: list[tuple[float, float]], i: int) -> tuple[float, float]:
        values = [x[i] for x in xs]
        return min(values), statistics.median(values)

    b_cpu, g_cpu = stats(bare, 0), stats(guarded, 0)
    return {
        "num_envs": envs,
        "transitions": ROLLOUTS * envs,
        "parameters": params,
        "bare_cpu_ms": [round(v * 1e3, 2) for v in b_cpu],
        "guarded_cpu_ms": [round(v * 1e3, 2) for v in g_cpu],
        "bare_wall_ms": [round(v * 1e3, 2) for v in stats(bare, 1)],
        "guarded_wall_ms": [round(v * 1e3, 2) for v in stats(guarded, 1)],
        "overhead_cpu_ms_min": round((g_cpu[0] - b_cpu[0]) * 1e3, 2),
        "overhead_cpu_pct_min": round(100 * (g_cpu[0] - b_cpu[0]) / b_cpu[0], 1),
        "capture_cpu_ms_median": round(statistics.median(captures) * 1e3, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    rows = [measure(envs, args.repeats) for envs in args.envs]
    when = utc_minute()
    lines = [
        f"{when}, `python bench/skrl_guard_overhead.py --envs "
        f"{' '.join(map(str, args.envs))} --repeats {args.repeats}`, "
        f"{platform.machine()}, torch {torch.__version__}, one torch thread",
        "",
        "| num_envs | transitions | update CPU ms bare (min / median) | guarded | extra CPU "
        "(min) | the save alone, CPU ms (median of 20) | wall ms bare / guarded (median) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['num_envs']} | {r['transitions']:,} | {r['bare_cpu_ms'][0]} / "
            f"{r['bare_cpu_ms'][1]} | {r['guarded_cpu_ms'][0]} / {r['guarded_cpu_ms'][1]} | "
            f"{r['overhead_cpu_ms_min']} ms ({r['overhead_cpu_pct_min']}%) | "
            f"{r['capture_cpu_ms_median']} | "
            f"{r['bare_wall_ms'][1]} / {r['guarded_wall_ms'][1]} |"
        )
    markdown = "\n".join(lines) + "\n"
    write_results("skrl_guard_overhead", {"date": when, "rows": rows}, markdown)
    print(markdown)


if __name__ == "__main__":
    main()
