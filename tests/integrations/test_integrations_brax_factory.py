"""A Brax env of the user's own, named in the workload as ``env: module:function``, is
measured the same way as a registered one."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import memfit
from memfit.core.workload import parse_workload
from memfit.errors import ConfigError

pytest.importorskip("brax", reason="measuring a Brax env needs brax")

FACTORY = """\
from brax import envs


def make_env(backend=None):
    assert backend in (None, "generalized")
    return envs.get_environment("fast")


def not_an_env():
    return 42
"""

WORKLOAD = """family: ppo
framework: jax
ppo: {layout: brax}
env: my_envs_memfit:make_env
observations: {vector: 2}
action_dim: 1
networks:
  policy: {layers: [32, 32, 32, 32, 2]}
  value: {layers: [256, 256, 256, 256, 256, 1]}
knobs:
  num_envs: {min: 256, max: 65536, powers_of_two: true}
  unroll_length: {choices: [10, 20]}
  batch_size: {min: 64, max: 4096, powers_of_two: true}
  num_minibatches: {min: 4, max: 32, powers_of_two: true}
objective: num_envs * unroll_length
constraints: {presets: [brax_ppo]}
"""


@pytest.fixture
def user_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder holding the user's env module, as the current directory, with its own
    measurement cache."""
    (tmp_path / "my_envs_memfit.py").write_text(FACTORY, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MEMFIT_CACHE_DIR", str(tmp_path / "cache"))
    yield tmp_path


@pytest.mark.slow
def test_factory_env_is_measured_like_the_registered_one(
    user_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import jax
    from brax import envs

    from memfit.estimate import brax_measure as bm
    from memfit.integrations import brax as mbrax

    handed: list[tuple[str, str]] = []
    measure = bm._measure

    def spy(env: object, env_id: str, *args: object, **kwargs: object) -> object:
        handed.append((type(env).__name__, env_id))
        return measure(env, env_id, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(bm, "_measure", spy)
    mine = mbrax.measure_ppo("my_envs_memfit:make_env")
    # the one measuring path every env takes, given the factory's env
    assert handed == [("Fast", "my_envs_memfit:make_env")]
    assert mine.env == "my_envs_memfit:make_env" and mine.provenance.platform == "cpu"
    raw = jax.eval_shape(envs.get_environment("fast").reset, jax.random.PRNGKey(0))
    assert mine.env_state_raw_bytes == sum(
        x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(raw)
    )
    # the workload names the factory; the plan uses its measurement (from the cache now)
    w = parse_workload(WORKLOAD)
    # a card known by its size alone: no XLA GPU target to compile for, so the plan takes
    # this installation's measurement (a named card, with the gpu-target extra, is compiled
    # for: tests/estimate/xla/test_xla_gpu_target.py)
    p = memfit.plan(w, gpu="12GiB")
    assert p.breakdown["training_state"] == mine.training_state_bytes
    assert any("cached for this installation" in n for n in p.notes)
    assert len(handed) == 1
    # editing the env's module is another cache entry: it would be measured again
    key = bm._key("my_envs_memfit:make_env", None, {}, {}, "cpu")
    (user_dir / "my_envs_memfit.py").write_text(FACTORY + "\n# edited\n", encoding="utf-8")
    assert bm._key("my_envs_memfit:make_env", None, {}, {}, "cpu") != key


def test_factory_mistakes_are_config_errors(user_dir: Path) -> None:
    from memfit.estimate import brax_measure as bm

    with pytest.raises(ConfigError, match=r"not a brax\.envs\.Env"):
        bm._env_object("my_envs_memfit:not_an_env", None)
    with pytest.raises(ConfigError, match="failed: AssertionError"):
        bm._env_object("my_envs_memfit:make_env", "mjx")
    with pytest.raises(ConfigError, match="cannot import module"):
        bm._env_object("no_such_module_memfit:make_env", None)
    made, env_id, backend = bm._env_object("my_envs_memfit:make_env", "generalized")
    assert env_id == "my_envs_memfit:make_env" and backend == "generalized"
    assert type(made).__name__ == "Fast"


@pytest.mark.parametrize("env", ["gym:Pendulum-v1", "brax:", "my envs:make", "mod:"])
def test_env_names_a_brax_env_or_a_factory(env: str) -> None:
    with pytest.raises(ConfigError, match="module:function"):
        parse_workload(WORKLOAD.replace("my_envs_memfit:make_env", f'"{env}"'))


def test_cache_dir_is_the_users(user_dir: Path) -> None:
    from memfit.estimate import brax_measure as bm

    assert bm.cache_dir() == Path(os.environ["MEMFIT_CACHE_DIR"]) / "measurements"
