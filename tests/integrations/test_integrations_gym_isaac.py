"""Gymnasium wrapper (against the real package) and Isaac Lab terms (against its documented
call signatures, with a stand-in env: Isaac Lab needs Isaac Sim and does not install here)."""

from __future__ import annotations

from typing import Any

import pytest

import memfit
from memfit.errors import ConfigError
from memfit.integrations import isaaclab as misaac

torch = pytest.importorskip("torch")


def _oom() -> BaseException:
    return torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")


# -- Gymnasium ---------------------------------------------------------------------------------


def test_wrapper_records_every_step_and_fills_info() -> None:
    gym = pytest.importorskip("gymnasium")
    from memfit.integrations.gymnasium import MemoryWrapper, wrapper_class

    rec = memfit.Recorder(None, log=False)
    env = MemoryWrapper(gym.make("CartPole-v1"), recorder=rec)
    assert isinstance(env, wrapper_class()) and isinstance(env, gym.Wrapper)
    env.reset(seed=0)
    for _ in range(5):
        *_, info = env.step(env.action_space.sample())
    assert "memfit" in info and info["memfit"]["step"] == 4
    assert [s["step"] for s in rec.samples] == [0, 1, 2, 3, 4]
    env.close()


def test_wrapper_retries_a_step_that_runs_out_of_memory() -> None:
    gym = pytest.importorskip("gymnasium")
    from memfit.integrations.gymnasium import MemoryWrapper

    class Flaky(gym.Env):  # type: ignore[misc]
        observation_space = gym.spaces.Box(-1, 1, (2,))
        action_space = gym.spaces.Discrete(2)

        def __init__(self) -> None:
            self.calls = 0

        def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
            return torch.zeros(2).numpy(), {}

        def step(self, action: Any) -> Any:
            self.calls += 1
            if self.calls == 2:
                raise _oom()
            return torch.zeros(2).numpy(), 1.0, False, False, {}

    events: list[memfit.runtime.events.MemoryEvent] = []
    env = MemoryWrapper(Flaky(), on_event=events.append, info_key=None)
    env.reset()
    env.step(0)
    env.step(1)
    assert env.unwrapped.calls == 3  # the failed call was retried
    assert [e.kind for e in events] == ["oom", "retry"]


def test_wrapper_refuses_non_env() -> None:
    pytest.importorskip("gymnasium")
    from memfit.integrations.gymnasium import MemoryWrapper

    with pytest.raises(ConfigError, match="env must be a Gymnasium environment, not"):
        MemoryWrapper(object())


def test_vector_env_gets_vector_wrapper() -> None:
    gym = pytest.importorskip("gymnasium")
    from memfit.integrations.gymnasium import MemoryWrapper

    venv = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    env = MemoryWrapper(venv, recorder=memfit.Recorder(None, log=False))
    env.reset(seed=0)
    obs, *_ = env.step(venv.action_space.sample())
    assert obs.shape == (2, 4) and isinstance(env, gym.vector.VectorWrapper)
    env.close()


# -- Isaac Lab ---------------------------------------------------------------------------------


class FakeIsaacEnv:
    """Stands in for ManagerBasedRLEnv: terms only read ``num_envs`` and the scene."""

    def __init__(self, num_envs: int = 4) -> None:
        self.num_envs = num_envs
        self.fail_next = 0


def fake_image(env: FakeIsaacEnv, sensor_cfg: str, data_type: str = "rgb") -> Any:
    """Shaped as isaaclab.envs.mdp.image: (num_envs, H, W, C), float in [0, 1]."""
    if env.fail_next:
        env.fail_next -= 1
        raise _oom()
    return torch.full((env.num_envs, 8, 8, 3), 0.5)


def test_cleanup_event_runs_the_given_policy_with_event_term_signature() -> None:
    env = FakeIsaacEnv()
    policy = memfit.cleanup.every(2)
    env_ids = torch.arange(env.num_envs)
    results = [misaac.cleanup_event(env, env_ids, policy=policy) for _ in range(4)]
    assert results == [False, True, False, True]
    assert policy.stats.calls == 4 and policy.stats.cleanups == 2


def test_cleanup_event_default_policy_is_kept_on_the_env() -> None:
    env = FakeIsaacEnv()
    with memfit.simulate_gpu("1MiB"):
        hog = torch.zeros(240_000)  # ~92% of the budget: free < 10% -> clean
        assert misaac.cleanup_event(env, None) is True
        del hog
        assert misaac.cleanup_event(env, None) is False
    policy = env._memfit_cleanup_policy  # type: ignore[attr-defined]
    assert policy.stats.calls == 2 and policy.stats.cleanups == 1
    with pytest.raises(ConfigError, match="cleanup policy"):
        misaac.cleanup_event(env, None, policy="every 10")


def test_guarded_term_converts_retries_and_reports_size() -> None:
    events: list[Any] = []
    term = misaac.guarded_term(fake_image, to_dtype=torch.uint8, on_event=events.append,
                               budget_bytes=600)  # fmt: skip
    env = FakeIsaacEnv(num_envs=4)
    env.fail_next = 1
    out = term(env, sensor_cfg="tiled_camera", data_type="rgb")
    assert out.dtype == torch.uint8 and out.shape == (4, 8, 8, 3) and int(out[0, 0, 0, 0]) == 128
    assert term.last_bytes == 4 * 8 * 8 * 3
    kinds = [e.kind for e in events]
    assert kinds == ["oom", "retry", "observation"]
    assert events[-1].data["bytes"] == 768 and "over the 600-byte budget" in events[-1].message
    assert term.__name__ == "fake_image"


def test_guarded_term_rejects_bad_arguments() -> None:
    with pytest.raises(ConfigError, match="callable"):
        misaac.guarded_term("mdp.image")
    with pytest.raises(ConfigError, match="budget_bytes"):
        misaac.guarded_term(fake_image, budget_bytes=0)


def test_isaac_autoconfig_reads_the_env_and_pins_num_envs() -> None:
    from memfit.backends.simulated import SimulatedDevice

    class StandInEnv:  # what Isaac Lab's ManagerBasedRLEnv exposes: num_envs, device
        num_envs = 2
        device = "cuda:0"

    # the simulator started with the env: 4 GiB of the 8 GiB card are in use
    probe = SimulatedDevice("8GiB", used_by_others="4GiB")
    cfg = misaac.autoconfig(StandInEnv(), "act_dual_camera", probe=probe)
    assert cfg.knobs == {"num_envs": 2}
    assert "renderer_cameras" not in cfg.plan.breakdown
    assert misaac._device_index("cuda:1") == 1 and misaac._device_index("cuda") == 0

    class NoEnvs:
        device = "cuda:0"

    with pytest.raises(ConfigError, match="num_envs"):
        misaac.autoconfig(NoEnvs(), "act_dual_camera", probe=probe)
