"""skrl: a PPO agent trained by skrl's own SequentialTrainer on a gymnasium env (CPU), with
out-of-memory injected into its update and its rollout: the same transitions and the same
parameters as a run without; the Recorder fed from the trainer; knobs read and written."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

import pytest

import memfit
from memfit.errors import ConfigError, OutOfMemory

torch = pytest.importorskip("torch", reason="skrl's torch agents need torch")
pytest.importorskip("skrl", reason="the skrl integration is tested with skrl itself")
gymnasium = pytest.importorskip("gymnasium", reason="the test env is a gymnasium env")

from skrl.agents.torch.ppo import PPO, PPO_CFG  # noqa: E402
from skrl.envs.wrappers.torch import wrap_env  # noqa: E402
from skrl.memories.torch import RandomMemory  # noqa: E402
from skrl.models.torch import DeterministicMixin, GaussianMixin, Model  # noqa: E402
from skrl.resources.preprocessors.torch import RunningStandardScaler  # noqa: E402
from skrl.trainers.torch import SequentialTrainer  # noqa: E402

from memfit.integrations import skrl as mskrl  # noqa: E402
from memfit.testing import inject_oom  # noqa: E402

# skrl logs through a handler bound to the stdout it saw at import (pytest's capture, closed
# by the time an env is garbage-collected): keep its info lines out
logging.getLogger("skrl").setLevel(logging.WARNING)

ENVS = 4
ROLLOUTS = 8
TIMESTEPS = 32  # four updates


class Policy(GaussianMixin, Model):  # type: ignore[misc]
    def __init__(self, observation_space: Any, action_space: Any) -> None:
        Model.__init__(
            self, observation_space=observation_space, action_space=action_space, device="cpu"
        )
        GaussianMixin.__init__(self)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(self.num_observations, 32),
            torch.nn.ELU(),
            torch.nn.Linear(32, self.num_actions),
        )
        self.log_std = torch.nn.Parameter(torch.zeros(self.num_actions))

    def compute(self, inputs: dict[str, Any], role: str = "") -> Any:
        return self.net(inputs["observations"]), {"log_std": self.log_std}


class Value(DeterministicMixin, Model):  # type: ignore[misc]
    def __init__(self, observation_space: Any, action_space: Any) -> None:
        Model.__init__(
            self, observation_space=observation_space, action_space=action_space, device="cpu"
        )
        DeterministicMixin.__init__(self)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(self.num_observations, 32), torch.nn.ELU(), torch.nn.Linear(32, 1)
        )

    def compute(self, inputs: dict[str, Any], role: str = "") -> Any:
        return self.net(inputs["observations"]), {}


def _agent(mini_batches: int = 2) -> tuple[Any, Any]:
    torch.manual_seed(0)
    venv = gymnasium.make_vec("Pendulum-v1", num_envs=ENVS, vectorization_mode="sync")
    venv.reset(seed=0)
    env = wrap_env(venv, wrapper="gymnasium", verbose=False)
    memory = RandomMemory(memory_size=ROLLOUTS, num_envs=ENVS, device="cpu")
    models = {
        "policy": Policy(env.observation_space, env.action_space),
        "value": Value(env.observation_space, env.action_space),
    }
    cfg = PPO_CFG(
        rollouts=ROLLOUTS,
        learning_epochs=2,
        mini_batches=mini_batches,
        observation_preprocessor=RunningStandardScaler,
        observation_preprocessor_kwargs={"size": env.observation_space, "device": "cpu"},
        value_preprocessor=RunningStandardScaler,
        value_preprocessor_kwargs={"size": 1, "device": "cpu"},
    )
    cfg.experiment.write_interval = 0
    cfg.experiment.checkpoint_interval = 0
    agent = PPO(
        models=models,
        memory=memory,
        observation_space=env.observation_space,
        action_space=env.action_space,
        device="cpu",
        cfg=cfg,
    )
    return agent, env


def _chaos(fn: Callable[..., Any], fire: Callable[[int, int], list[int] | None]) -> Any:
    """``fn`` run under ``inject_oom(at=...)`` where ``fire(call, attempt)`` says (the call
    is counted by its timestep, attempts from 0 within it)."""
    attempts: dict[Any, int] = {}

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        key = kwargs.get("timestep")
        attempt = attempts.get(key, 0)
        attempts[key] = attempt + 1
        at = fire(key, attempt)
        context = inject_oom(1.0, at=at) if at else contextlib.nullcontext()
        with context:
            return fn(*args, **kwargs)

    return wrapped


def _train(
    *,
    guarded: bool = True,
    update_fire: Callable[[int, int], list[int] | None] | None = None,
    act_fire: Callable[[int, int], list[int] | None] | None = None,
    recorder: Any | None = None,
    **guard_kwargs: Any,
) -> tuple[Any, list[dict[str, Any]], Any]:
    agent, env = _agent()
    transitions: list[dict[str, Any]] = []
    add = agent.memory.add_samples

    def spy(**tensors: Any) -> None:
        transitions.append({k: v.clone() for k, v in tensors.items() if v is not None})
        add(**tensors)

    agent.memory.add_samples = spy
    if update_fire is not None:
        agent.update = _chaos(agent.update, update_fire)
    if act_fire is not None:
        agent.act = _chaos(agent.act, act_fire)
    guard = mskrl.guard(agent, recorder=recorder, **guard_kwargs) if guarded else None
    trainer = SequentialTrainer(
        env=env,
        agents=agent,
        cfg={"timesteps": TIMESTEPS, "headless": True, "disable_progressbar": True},
    )
    trainer.train()
    return agent, transitions, guard


def _params(agent: Any) -> list[Any]:
    return [p.detach().clone() for m in (agent.policy, agent.value) for p in m.parameters()]


def _same(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def reference() -> tuple[list[Any], list[dict[str, Any]]]:
    """The run without faults and without memfit."""
    agent, transitions, _ = _train(guarded=False)
    return _params(agent), transitions


def _same_transitions(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
        for x, y in zip(a, b, strict=True)
    )


def test_guard_alone_changes_nothing(reference: tuple[list[Any], list[Any]]) -> None:
    agent, transitions, guard = _train()
    assert guard.updates == TIMESTEPS // ROLLOUTS and guard.events == []
    assert _same_transitions(transitions, reference[1])
    assert _same(_params(agent), reference[0])


@pytest.mark.parametrize("at", [3, 40, 400])
def test_oom_in_the_update_loses_nothing(reference: tuple[list[Any], list[Any]], at: int) -> None:
    # the second and fourth updates fail once, `at` operations in (forward, backward or
    # inside Adam's step, after earlier minibatches already changed the parameters)
    def fire(timestep: int, attempt: int) -> list[int] | None:
        return [at] if timestep in (15, 31) and attempt == 0 else None

    agent, transitions, guard = _train(update_fire=fire)
    kinds = [e.kind for e in guard.events]
    assert kinds == ["oom", "retry", "oom", "retry"]
    assert all(e.source == "skrl" for e in guard.events)
    assert _same_transitions(transitions, reference[1])
    assert _same(_params(agent), reference[0])
    assert agent.cfg.mini_batches == 2  # a transient failure changes no knob


def test_oom_choosing_actions_loses_no_transition(reference: tuple[list[Any], list[Any]]) -> None:
    def fire(timestep: int, attempt: int) -> list[int] | None:
        return [2] if timestep in (3, 20) and attempt == 0 else None

    agent, transitions, guard = _train(act_fire=fire)
    assert [e.kind for e in guard.events] == ["oom", "retry", "oom", "retry"]
    assert all(e.source == "RolloutGuard" for e in guard.events)
    assert _same_transitions(transitions, reference[1])
    assert _same(_params(agent), reference[0])


def test_actions_in_chunks_record_every_environment() -> None:
    # the first call fails whole and in every retry: chunks of the environments
    def fire(timestep: int, attempt: int) -> list[int] | None:
        return [0] if timestep == 0 and attempt < 3 else None

    _, transitions, guard = _train(act_fire=fire)
    assert "split" in [e.kind for e in guard.events]
    assert len(transitions) == TIMESTEPS
    for record in transitions:  # every field of every environment, every step
        assert all(v.shape[0] == ENVS for v in record.values())
        assert record["log_prob"].shape == (ENVS, 1) and record["values"].shape == (ENVS, 1)


def test_persistent_oom_splits_minibatches_then_grows_back() -> None:
    def fire(timestep: int, attempt: int) -> list[int] | None:
        return [5] if timestep == 7 and attempt < 3 else None

    agent, _, guard = _train(update_fire=fire, retries=2, grow_back_after=2)
    kinds = [e.kind for e in guard.events]
    assert kinds[:6] == ["oom", "retry", "oom", "retry", "oom", "split"]
    assert guard.events[5].data["mini_batches"] == 4
    assert kinds[-1] == "grow_back" and agent.cfg.mini_batches == 2
    assert guard.updates == TIMESTEPS // ROLLOUTS


def test_giving_up_leaves_the_agent_as_before_the_update() -> None:
    agent, env = _agent()
    guard = mskrl.guard(agent, retries=1, max_mini_batches=2, rollout=False)
    trainer = SequentialTrainer(
        env=env, agents=agent, cfg={"timesteps": ROLLOUTS - 1, "headless": True,
                                    "disable_progressbar": True},
    )  # fmt: skip
    trainer.train()  # fills the memory, no update yet
    before = _params(agent)
    values = agent.memory.get_tensor_by_name("values").clone()
    agent.enable_models_training_mode(True)
    with inject_oom(1.0, where=("optimizer",)), pytest.raises(OutOfMemory, match="even after"):
        agent.update(timestep=ROLLOUTS - 1, timesteps=TIMESTEPS)
    assert _same(_params(agent), before)
    # (the row the eighth step would fill is still empty: NaN == NaN there)
    assert torch.allclose(agent.memory.get_tensor_by_name("values"), values, 0, 0, True)
    assert [e.kind for e in guard.events][-1] == "give_up"
    guard.remove()
    assert "update" not in vars(agent) and "act" not in vars(agent)


def test_recorder_is_fed_from_the_trainer() -> None:
    rec = memfit.Recorder(None, log=False)
    with memfit.simulate_gpu("1GiB"):
        agent, _, _ = _train(recorder=rec)
    rec.close()
    steps = [s["step"] for s in rec.samples]
    assert steps == list(range(TIMESTEPS))
    assert all(s["allocated_bytes"] is not None for s in rec.samples)
    # skrl's own tracked data (what its TensorBoard writer logs) has the memory too
    tracked = agent.tracking_data["Memory / Allocated (MiB)"]
    assert len(tracked) == TIMESTEPS
    assert tracked == [s["allocated_bytes"] / 2**20 for s in rec.samples]


def test_knobs_read_and_written() -> None:
    agent, _ = _agent()
    knobs = mskrl.knobs_of(agent)
    assert knobs == {"rollouts": 8, "mini_batches": 2, "memory_size": 8, "num_envs": 4}
    cfg = mskrl.apply_knobs(agent.cfg, {"rollouts": 32, "num_envs": 4096})
    assert cfg.rollouts == 32 and agent.cfg.rollouts == 8
    isaac = {"rollouts": 16, "learning_epochs": 4, "mini_batches": 2}
    assert mskrl.apply_knobs(isaac, {"rollouts": 24, "batch_size": 9}) == {
        "rollouts": 24, "learning_epochs": 4, "mini_batches": 2}  # fmt: skip
    with pytest.raises(ConfigError, match="dataclass or a dict"):
        mskrl.apply_knobs([1], {})
    with pytest.raises(ConfigError, match="must be an skrl agent"):
        mskrl.guard(object())
    mskrl.guard(agent)
    with pytest.raises(ConfigError, match="guarded already"):
        mskrl.guard(agent)


def test_autoconfig_writes_the_plan_into_the_config() -> None:
    from memfit.backends.simulated import SimulatedDevice

    # an 8 GB card with Isaac Sim started (3.5 GiB used): plan the rest
    probe = SimulatedDevice("8GiB", used_by_others="3.5GiB")
    cfg, result = mskrl.autoconfig(PPO_CFG(), "skrl_isaaclab_ppo", probe=probe)
    assert cfg.rollouts == result.knobs["rollouts"] and result.knobs["num_envs"] >= 256


def test_skrl_layout_matches_skrl_memory() -> None:
    """The workload's rollout terms are the bytes of skrl's own memory and of what its
    ``sample`` returns for one PPO epoch."""
    from memfit.core.families import evaluate
    from memfit.core.workload import load_workload

    w = load_workload("skrl_isaaclab_ppo@no_sim")
    values = {**w.default_values(), "num_envs": 64, "rollouts": 16}
    agent, _ = _agent()
    obs = gymnasium.spaces.Box(-1, 1, (w.observations.vector,))
    act = gymnasium.spaces.Box(-1, 1, (w.action_dim,))
    memory = RandomMemory(memory_size=16, num_envs=64, device="cpu")
    # the tensors skrl's PPO.init creates, as it creates them (no state space here)
    agent.memory, agent.observation_space, agent.action_space = memory, obs, act
    agent.state_space = None
    PPO.init(agent)
    stored = sum(t.numel() * t.element_size() for t in memory.tensors.values())
    terms = evaluate(w, values).terms
    assert terms["rollout_buffer"] == stored
    for name in memory.tensors:
        memory.tensors[name].zero_()
    memory.filled = True
    batches = memory.sample(names=agent._tensors_names, batch_size=len(memory), mini_batches=2)
    sampled = sum(t.numel() * t.element_size() for b in batches for t in b if t is not None)
    assert terms["rollout_shuffled_copy"] == sampled


class Critic(DeterministicMixin, Model):  # type: ignore[misc]
    def __init__(self, observation_space: Any, action_space: Any) -> None:
        Model.__init__(
            self, observation_space=observation_space, action_space=action_space, device="cpu"
        )
        DeterministicMixin.__init__(self)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(self.num_observations + self.num_actions, 32),
            torch.nn.ReLU(),
            torch.nn.Linear(32, 1),
        )

    def compute(self, inputs: dict[str, Any], role: str = "") -> Any:
        return self.net(torch.cat([inputs["observations"], inputs["taken_actions"]], 1)), {}


def _sac_run(fire: Callable[[int, int], list[int] | None] | None) -> tuple[list[Any], Any]:
    from skrl.agents.torch.sac import SAC, SAC_CFG

    torch.manual_seed(0)
    venv = gymnasium.make_vec("Pendulum-v1", num_envs=ENVS, vectorization_mode="sync")
    venv.reset(seed=0)
    env = wrap_env(venv, wrapper="gymnasium", verbose=False)
    obs, act = env.observation_space, env.action_space
    models = {
        "policy": Policy(obs, act),
        **{name: Critic(obs, act) for name in
           ("critic_1", "critic_2", "target_critic_1", "target_critic_2")},
    }  # fmt: skip
    cfg = SAC_CFG(batch_size=16, gradient_steps=2, learning_starts=4)
    cfg.experiment.write_interval = 0
    cfg.experiment.checkpoint_interval = 0
    memory = RandomMemory(memory_size=64, num_envs=ENVS, device="cpu")
    agent = SAC(models=models, memory=memory, observation_space=obs, action_space=act,
                device="cpu", cfg=cfg)  # fmt: skip
    if fire is not None:
        agent.update = _chaos(agent.update, fire)
    guard = mskrl.guard(agent) if fire is not None else None
    SequentialTrainer(env=env, agents=agent, cfg={
        "timesteps": 12, "headless": True, "disable_progressbar": True}).train()  # fmt: skip
    params = [
        p.detach().clone()
        for name in ("policy", "critic_1", "critic_2", "target_critic_1", "target_critic_2")
        for p in agent.models[name].parameters()
    ]
    return [*params, agent.log_entropy_coefficient.detach().clone()], guard


@pytest.mark.parametrize("at", [20, 150, 350])
def test_sac_update_with_oom_gives_the_same_networks_and_temperature(at: int) -> None:
    reference, _ = _sac_run(None)

    def fire(timestep: int, attempt: int) -> list[int] | None:
        # an update is ~400 operations (2 gradient steps); 350 is in the second, after the
        # first has stepped three optimizers and moved the target critics in place
        return [at] if timestep in (5, 9) and attempt == 0 else None

    chaotic, guard = _sac_run(fire)
    assert [e.kind for e in guard.events] == ["oom", "retry", "oom", "retry"]
    assert _same(chaotic, reference)
    assert knobs_sac(guard.agent) == {"batch_size": 16, "gradient_steps": 2,
                                      "memory_size": 64, "num_envs": ENVS}  # fmt: skip


def knobs_sac(agent: Any) -> dict[str, int]:
    return mskrl.knobs_of(agent)
