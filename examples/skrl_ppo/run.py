"""skrl PPO (Isaac Lab's RL library) guarded by memfit, on a gymnasium env on the CPU.

1. plans the bundled ``skrl_isaaclab_ppo`` workload (Isaac-Ant-Direct-v0's shape with Isaac
   Sim in the process) for ``--gpu`` and writes the knobs into skrl's ``PPO_CFG``
   (``memfit.integrations.skrl.apply_knobs``);
2. trains skrl's PPO with skrl's own ``SequentialTrainer`` on ``Pendulum-v1`` (vectorised),
   with ``memfit.integrations.skrl.guard``: the update and ``act`` survive out-of-memory,
   the Recorder is stepped at each trainer timestep;
3. with ``--chaos`` (default on), out-of-memory is injected into two updates and one
   ``act``, and the run is repeated without faults: the same transitions and the same
   parameters.

    python examples/skrl_ppo/run.py [--gpu "RTX 4060 Ti 8GB"] [--timesteps 64] [--no-chaos]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
from typing import Any

import gymnasium
import torch
from skrl.agents.torch.ppo import PPO, PPO_CFG
from skrl.envs.wrappers.torch import wrap_env
from skrl.memories.torch import RandomMemory
from skrl.models.torch import DeterministicMixin, GaussianMixin, Model
from skrl.trainers.torch import SequentialTrainer

import memfit
from memfit.integrations import skrl as mskrl
from memfit.testing import inject_oom

logging.getLogger("skrl").setLevel(logging.WARNING)


class Policy(GaussianMixin, Model):  # type: ignore[misc]
    def __init__(self, obs: Any, act: Any) -> None:
        Model.__init__(self, observation_space=obs, action_space=act, device="cpu")
        GaussianMixin.__init__(self)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(self.num_observations, 64), torch.nn.ELU(),
            torch.nn.Linear(64, self.num_actions),
        )  # fmt: skip
        self.log_std = torch.nn.Parameter(torch.zeros(self.num_actions))

    def compute(self, inputs: dict[str, Any], role: str = "") -> Any:
        return self.net(inputs["observations"]), {"log_std": self.log_std}


class Value(DeterministicMixin, Model):  # type: ignore[misc]
    def __init__(self, obs: Any, act: Any) -> None:
        Model.__init__(self, observation_space=obs, action_space=act, device="cpu")
        DeterministicMixin.__init__(self)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(self.num_observations, 64), torch.nn.ELU(), torch.nn.Linear(64, 1)
        )

    def compute(self, inputs: dict[str, Any], role: str = "") -> Any:
        return self.net(inputs["observations"]), {}


def train(
    cfg: PPO_CFG, *, envs: int, timesteps: int, chaos: bool, rec: memfit.Recorder | None
) -> tuple[list[torch.Tensor], list[dict[str, torch.Tensor]], Any]:
    """One skrl run; returns the parameters, every recorded transition and the guard."""
    torch.manual_seed(0)
    venv = gymnasium.make_vec("Pendulum-v1", num_envs=envs, vectorization_mode="sync")
    venv.reset(seed=0)
    env = wrap_env(venv, wrapper="gymnasium", verbose=False)
    memory = RandomMemory(memory_size=cfg.rollouts, num_envs=envs, device="cpu")
    models = {
        "policy": Policy(env.observation_space, env.action_space),
        "value": Value(env.observation_space, env.action_space),
    }
    agent = PPO(models=models, memory=memory, observation_space=env.observation_space,
                action_space=env.action_space, device="cpu", cfg=cfg)  # fmt: skip
    transitions: list[dict[str, torch.Tensor]] = []
    add = memory.add_samples

    def keep(**tensors: Any) -> None:
        transitions.append({k: v.clone() for k, v in tensors.items() if v is not None})
        add(**tensors)

    memory.add_samples = keep
    if chaos:  # out-of-memory in the 2nd and 4th updates and in one act, once each
        tried: set[Any] = set()

        def faulty(fn: Any, when: set[int], at: int) -> Any:
            def call(*args: Any, **kwargs: Any) -> Any:
                key = (fn.__name__, kwargs.get("timestep"))
                fire = kwargs.get("timestep") in when and key not in tried
                tried.add(key)
                with inject_oom(1.0, at=[at]) if fire else contextlib.nullcontext():
                    return fn(*args, **kwargs)

            return call

        period = cfg.rollouts
        agent.update = faulty(agent.update, {2 * period - 1, 4 * period - 1}, 40)
        agent.act = faulty(agent.act, {5}, 2)
    guard = mskrl.guard(agent, recorder=rec)
    trainer = SequentialTrainer(env=env, agents=agent, cfg={
        "timesteps": timesteps, "headless": True, "disable_progressbar": True})  # fmt: skip
    trainer.train()
    params = [p.detach().clone() for m in (agent.policy, agent.value) for p in m.parameters()]
    return params, transitions, guard


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpu", default="RTX 4060 Ti 8GB")
    parser.add_argument("--timesteps", type=int, default=64)
    parser.add_argument("--envs", type=int, default=4)
    parser.add_argument("--no-chaos", dest="chaos", action="store_false")
    args = parser.parse_args()

    plan = memfit.plan("skrl_isaaclab_ppo", gpu=args.gpu)
    isaac_cfg = mskrl.apply_knobs({"rollouts": 16, "learning_epochs": 4, "mini_batches": 2},
                                  plan.knobs)  # fmt: skip
    print(f"plan on {plan.gpu}: num_envs={plan.knobs['num_envs']} rollouts="
          f"{plan.knobs['rollouts']}, needs {plan.predicted_bytes / 2**30:.2f} GiB "
          f"(Isaac Sim {plan.breakdown['simulator_base'] / 2**30:.1f} GiB of it); "
          f"agent cfg -> {isaac_cfg}")  # fmt: skip

    cfg = PPO_CFG(rollouts=8, learning_epochs=2, mini_batches=2)
    cfg.experiment.write_interval = 0
    cfg.experiment.checkpoint_interval = 0
    rec = memfit.Recorder(None, log=False)
    with memfit.simulate_gpu("1GiB"):
        params, transitions, guard = train(
            cfg, envs=args.envs, timesteps=args.timesteps, chaos=args.chaos, rec=rec
        )
    rec.close()
    kinds = [f"{e.source}:{e.kind}" for e in guard.events]
    print(f"trained {args.timesteps} timesteps x {args.envs} envs, {guard.updates} updates; "
          f"events: {', '.join(kinds) or 'none'}")  # fmt: skip
    peak = max(s["peak_allocated_bytes"] or 0 for s in rec.samples)
    print(f"recorder: {len(rec.samples)} samples from the trainer, peak {peak / 2**20:.2f} MiB")
    if args.chaos:
        cfg = PPO_CFG(rollouts=8, learning_epochs=2, mini_batches=2)
        cfg.experiment.write_interval = 0
        cfg.experiment.checkpoint_interval = 0
        ref_params, ref_transitions, _ = train(
            cfg, envs=args.envs, timesteps=args.timesteps, chaos=False, rec=None
        )
        same_t = len(ref_transitions) == len(transitions) and all(
            a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
            for a, b in zip(ref_transitions, transitions, strict=True)
        )
        same_p = all(torch.equal(a, b) for a, b in zip(ref_params, params, strict=True))
        print(f"same transitions as a run without faults: {same_t}; same parameters: {same_p}")
        if not (same_t and same_p):
            raise SystemExit(1)


if __name__ == "__main__":
    main()
