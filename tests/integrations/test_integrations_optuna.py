"""memfit.integrations.optuna: suggestions that fit and keep the rules, pruned OOM trials,
and one study shared by two worker processes through SQLite (issue 24)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

optuna = pytest.importorskip("optuna", reason="memfit[optuna] is not installed")

import memfit  # noqa: E402
from memfit.integrations import optuna as mo  # noqa: E402
from memfit.planning import feasible  # noqa: E402

optuna.logging.set_verbosity(optuna.logging.WARNING)

ROOT = Path(__file__).resolve().parents[2]

# (workload, GPU): a 4-knob PPO space on two cards, the DQN's replay on a 3.7 GB card, and a
# vision workload whose rules and simulator limit it
CASES = [
    ("brax_humanoid_ppo", "RTX 4070"),
    ("brax_humanoid_ppo", "8GiB"),
    ("dqn_fire_raster@device_replay", "3.68GiB"),
    ("act_dual_camera", "RTX 3060"),
]


def _held_out(workload: str, gpu: str, chosen: dict[str, Any]) -> None:
    """What a trial got keeps every rule and fits, by memfit's own check and a plan with
    every knob pinned (another path through the planner than the enumeration)."""
    pins = {k: v for k, v in chosen.items() if isinstance(v, int)}
    assert memfit.check(workload, overrides=pins) == []
    pinned = memfit.plan(workload, gpu=gpu, overrides=pins)
    assert pinned.fits, (workload, gpu, chosen)
    assert pinned.predicted_bytes <= pinned.budget_bytes


@pytest.mark.parametrize(("workload", "gpu"), CASES)
@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_every_suggestion_keeps_the_rules_and_fits(workload: str, gpu: str, sampler: str) -> None:
    samplers = {
        "random": optuna.samplers.RandomSampler(seed=3),
        "tpe": optuna.samplers.TPESampler(seed=3, multivariate=True, n_startup_trials=5),
    }
    study = optuna.create_study(direction="maximize", sampler=samplers[sampler])
    seen: list[dict[str, Any]] = []

    def objective(trial: Any) -> float:
        chosen = mo.suggest(trial, workload, gpu=gpu)
        seen.append(chosen)
        return float(trial.user_attrs[mo.ATTR]["predicted_bytes"])

    study.optimize(objective, n_trials=20)
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    for chosen in {tuple(sorted(c.items())) for c in seen}:
        _held_out(workload, gpu, dict(chosen))
    # the search does not collapse: different configurations from trial to trial
    space = feasible(workload, gpu=gpu)
    assert len({tuple(sorted(c.items())) for c in seen}) >= min(len(space), 20) // 3


def test_every_feasible_configuration_is_reachable() -> None:
    space = feasible("brax_humanoid_ppo@quick", gpu="RTX 4070")
    ranges = [range(len(space.domains[n])) for n in space.order]
    reached = set()
    for positions in itertools.product(*ranges):
        trial = optuna.trial.FixedTrial(
            {mo.PARAM_PREFIX + n: p for n, p in zip(space.order, positions, strict=True)}
        )
        chosen = mo.suggest(trial, "brax_humanoid_ppo@quick", gpu="RTX 4070")
        reached.add(tuple(sorted(chosen.items())))
    assert reached == {tuple(sorted(c.items())) for c in space.configs}
    assert len(reached) > 50


def test_a_larger_position_never_gives_a_smaller_value() -> None:
    values = []
    for position in range(100):
        trial = optuna.trial.FixedTrial({"memfit.buffer_size": position})
        values.append(mo.suggest(trial, "dqn_fire_raster@device_replay", gpu="3.68GiB"))
    sizes = [int(v["buffer_size"]) for v in values]
    assert sizes == sorted(sizes)
    assert sizes[0] == 10_000
    assert (
        sizes[-1]
        == memfit.plan("dqn_fire_raster@device_replay", gpu="3.68GiB").knobs["buffer_size"]
    )


def test_fixed_knobs_stay_as_given_and_are_not_parameters() -> None:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))

    def objective(trial: Any) -> float:
        chosen = mo.suggest(trial, "brax_humanoid_ppo", gpu="RTX 4070", fixed={"num_envs": 4096})
        assert chosen["num_envs"] == 4096
        _held_out("brax_humanoid_ppo", "RTX 4070", chosen)
        return 0.0

    study.optimize(objective, n_trials=8)
    assert all("memfit.num_envs" not in t.params for t in study.trials)
    assert all("memfit.batch_size" in t.params for t in study.trials)
    assert mo.knobs(study.trials[0]) == study.trials[0].user_attrs["memfit"]["knobs"]


def test_nothing_fits_is_said_before_any_trial_runs() -> None:
    trial = optuna.trial.FixedTrial({})
    with pytest.raises(memfit.InfeasiblePlan):
        mo.suggest(trial, "brax_humanoid_ppo", gpu="64MiB")


def _tiny_model() -> tuple[Any, Any, Any]:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = torch.randn(256, 64)
    return model, optimizer, batch


def test_an_oom_is_a_pruned_trial_with_its_reason() -> None:
    torch = pytest.importorskip("torch")
    study = optuna.create_study()

    @mo.objective
    def objective(trial: Any) -> float:
        mo.suggest(trial, "dqn_fire_raster@device_replay", gpu="3.68GiB")
        with memfit.simulate_gpu("64KiB"):
            torch.zeros(1 << 20)  # 4 MiB on a 64 KiB card
        return 1.0

    study.optimize(objective, n_trials=1)
    trial = study.trials[0]
    assert trial.state == optuna.trial.TrialState.PRUNED
    assert trial.user_attrs[mo.PRUNED_ATTR]["reason"] == "out_of_memory"
    assert "simulated GPU" in trial.user_attrs[mo.PRUNED_ATTR]["message"]
    assert mo.knobs(trial) is not None


def test_a_guard_that_gives_up_is_a_pruned_trial_with_what_it_tried() -> None:
    model, optimizer, batch = _tiny_model()
    study = optuna.create_study()

    def loss_fn(b: Any) -> Any:
        return model(b).square().mean()

    def objective(trial: Any) -> float:
        guard = memfit.TrainGuard(optimizer, loss_fn, max_splits=2)
        with mo.pruned_on_oom(trial), memfit.simulate_gpu("4KiB"):
            guard(batch)
        return 1.0

    study.optimize(objective, n_trials=1)
    trial = study.trials[0]
    assert trial.state == optuna.trial.TrialState.PRUNED
    record = trial.user_attrs[mo.PRUNED_ATTR]
    assert record["reason"] == "guard_gave_up"
    assert record["tried"], record


def test_other_errors_still_fail_the_trial() -> None:
    study = optuna.create_study()

    @mo.objective
    def objective(trial: Any) -> float:
        raise ValueError("a bug in the objective")

    study.optimize(objective, n_trials=1, catch=(ValueError,))
    assert study.trials[0].state == optuna.trial.TrialState.FAIL
    assert mo.PRUNED_ATTR not in study.trials[0].user_attrs


_WORKER = textwrap.dedent(
    """
    import os, sys
    import optuna
    from memfit.integrations import optuna as mo
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(
        sys.argv[1], engine_kwargs={"connect_args": {"timeout": 60}}
    )
    study = optuna.load_study(
        study_name="sweep", storage=storage,
        sampler=optuna.samplers.TPESampler(seed=int(sys.argv[2]), n_startup_trials=3),
    )

    def objective(trial):
        chosen = mo.suggest(trial, "brax_humanoid_ppo", gpu="RTX 4070")
        trial.set_user_attr("worker", os.getpid())
        return float(chosen["num_envs"] * chosen["unroll_length"])

    study.optimize(objective, n_trials=6)
    """
)


@pytest.mark.slow  # tens of seconds of CPU: the slow suite runs it (issue 32)
def test_two_worker_processes_share_one_sqlite_study(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    optuna.create_study(study_name="sweep", storage=url, direction="maximize")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, url, str(seed)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for seed in (1, 2)
    ]
    for worker in workers:
        out, _ = worker.communicate(timeout=240)
        assert worker.returncode == 0, out[-3000:]
    study = optuna.load_study(study_name="sweep", storage=url)
    trials = study.trials
    assert len(trials) == 12
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    assert len({t.user_attrs["worker"] for t in trials}) == 2
    chosen = {tuple(sorted(mo.knobs(t).items())) for t in trials}  # type: ignore[union-attr]
    assert len(chosen) >= 4
    for config in chosen:
        _held_out("brax_humanoid_ppo", "RTX 4070", dict(config))
