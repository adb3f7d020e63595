"""TrainGuard and RolloutGuard under faults at every point (issue 14): nothing counted twice,
no half step, the same random numbers and the same statistics as a run without a fault.

Models are float64, so "exact" means within 1e-12 (summation order) of the fault-free run.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import memfit
from memfit.errors import OutOfMemory
from memfit.runtime.guard import RolloutGuard, TrainGuard, clip_grad_norm
from memfit.testing import inject_oom

Batch = tuple[torch.Tensor, torch.Tensor]


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2)).double()


def _batches(n: int, size: int = 16, seed: int = 1) -> list[Batch]:
    g = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(size, 8, generator=g, dtype=torch.float64),
            torch.randn(size, 2, generator=g, dtype=torch.float64),
        )
        for _ in range(n)
    ]


def _loss(model: nn.Module) -> Callable[[Batch], torch.Tensor]:
    return lambda b: nn.functional.mse_loss(model(b[0]), b[1])


def _bare(model: nn.Module, opt: torch.optim.Optimizer, batches: list[Batch]) -> None:
    for x, y in batches:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def _params(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((p - q).abs().max()) for p, q in zip(a, b, strict=True))


def _ops_in_step(make: Callable[[], TrainGuard], batch: Batch, **kwargs: Any) -> int:
    guard = make()
    with inject_oom(0.0, **kwargs) as seen:
        guard(batch)
    return seen.ops_seen


# -- 1. a micro-batch's gradient is never counted twice ----------------------------------------


@pytest.mark.parametrize("inplace", [False, True])
def test_a_fault_at_every_point_of_a_split_step_leaves_the_exact_step(inplace: bool) -> None:
    """Four micro-batches, Adam, one fault at each operation in turn (forward, backward,
    the gradient commit, the optimizer step): every run ends at the fault-free step."""
    batch = _batches(1)[0]
    warm = _batches(2, seed=7)

    def make() -> TrainGuard:
        model = _mlp()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2, foreach=True)
        guard = TrainGuard(opt, _loss(model), snapshot_optimizer="always")
        for b in warm:  # optimizer state exists: the step is an ordinary one
            guard(b)
        guard.splits = 4
        guard.model_for_test = model  # type: ignore[attr-defined]
        return guard

    reference = make()
    reference(batch)
    expected = _params(reference.model_for_test)  # type: ignore[attr-defined]
    ops = _ops_in_step(make, batch, inplace=inplace)
    assert ops > 40
    for k in range(ops):
        guard = make()
        with inject_oom(0.0, at=[k], inplace=inplace) as fault:
            guard(batch)
        assert fault.total_raised == 1, k
        assert _max_diff(_params(guard.model_for_test), expected) <= 1e-12, k  # type: ignore[attr-defined]


# -- 3. an error that is not an out-of-memory inside optimizer.step -----------------------------


class HalfwayFailing(torch.optim.SGD):
    """SGD that updates its first parameter, then raises (a KeyboardInterrupt by default)."""

    def __init__(self, params: Any, error: BaseException) -> None:
        super().__init__(params, lr=0.1, momentum=0.9)
        self.error = error
        self.armed = False

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        if not self.armed:
            return super().step(closure)
        first = self.param_groups[0]["params"][0]
        first.add_(first.grad, alpha=-0.1)
        raise self.error


@pytest.mark.parametrize("error", [KeyboardInterrupt(), RuntimeError("a bug in the step")])
def test_a_non_oom_error_in_the_step_restores_the_snapshot(error: BaseException) -> None:
    model = _mlp()
    opt = HalfwayFailing(model.parameters(), error)
    guard = TrainGuard(opt, _loss(model), snapshot_optimizer="always")
    batches = _batches(3)
    guard(batches[0])
    before = _params(model)
    momentum = [opt.state[p]["momentum_buffer"].clone() for p in model.parameters()]
    opt.armed = True
    with pytest.raises(type(error)) as info:
        guard(batches[1])
    assert _max_diff(_params(model), before) == 0.0
    assert all(p.grad is None for p in model.parameters())
    for p, m in zip(model.parameters(), momentum, strict=True):
        assert torch.equal(opt.state[p]["momentum_buffer"], m)
    assert any("restored" in note for note in getattr(info.value, "__notes__", []))
    opt.armed = False
    guard(batches[1])  # the run goes on from where it was
    assert guard.steps == 2


def test_a_non_oom_error_without_a_snapshot_says_the_step_may_be_partial() -> None:
    model = _mlp()
    opt = HalfwayFailing(model.parameters(), RuntimeError("boom"))
    guard = TrainGuard(opt, _loss(model), snapshot_optimizer="never")
    opt.armed = True
    with pytest.raises(RuntimeError, match="boom") as info:
        guard(_batches(1)[0])
    assert any("partly updated" in note for note in info.value.__notes__)
    assert all(p.grad is None for p in model.parameters())


# -- 4. retries draw the same random numbers -------------------------------------------------


def _dropout_run(fault: Any, **guard_kwargs: Any) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Dropout(0.5), nn.Linear(32, 2)).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    guard = TrainGuard(opt, _loss(model), **guard_kwargs)
    batches = _batches(30)
    torch.manual_seed(123)
    with fault:
        for batch in batches:
            guard(batch)
    return _params(model)


def test_dropout_draws_the_same_masks_after_a_retry() -> None:
    clean = _dropout_run(inject_oom(0.0))
    # Faults after the dropout mask is drawn, in backward: the retry must draw it again.
    faulty = _dropout_run(inject_oom(0.05, seed=2, where=("backward",)))
    assert _max_diff(faulty, clean) <= 1e-12
    drifted = _dropout_run(inject_oom(0.05, seed=2, where=("backward",)), restore_rng=False)
    assert _max_diff(drifted, clean) > 1e-3  # what happened before: the run drifts
    # Dropout draws from torch alone: putting back torch's generators is enough.
    torch_only = _dropout_run(inject_oom(0.05, seed=2, where=("backward",)), restore_rng="torch")
    assert _max_diff(torch_only, clean) <= 1e-12
    with pytest.raises(memfit.ConfigError, match="restore_rng"):
        _dropout_run(inject_oom(0.0), restore_rng="numpy")


def test_rollout_guard_restores_numpy_random_and_extra_generators() -> None:
    space_rng = np.random.default_rng(5)
    fail = {"at": {3, 7}, "calls": 0}

    def act(obs: np.ndarray) -> np.ndarray:
        explore = np.random.rand() < 0.5  # epsilon-greedy, as stable-baselines3 does
        noise = space_rng.integers(0, 4, size=len(obs))
        random_pick = random.random()
        fail["calls"] += 1
        if fail["calls"] in fail["at"]:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")
        return np.where(explore, noise, obs.argmax(axis=-1)) + random_pick

    def run(guarded: bool) -> list[np.ndarray]:
        np.random.seed(0)
        random.seed(0)
        space_rng.bit_generator.state = np.random.default_rng(5).bit_generator.state
        fail["calls"] = 0
        obs = np.arange(12.0).reshape(4, 3)
        fn = RolloutGuard(act, rngs=[space_rng]) if guarded else act
        if not guarded:
            fail["at"], saved = set(), fail["at"]
        out = [fn(obs) for _ in range(8)]
        if not guarded:
            fail["at"] = saved
        return out

    clean, guarded = run(False), run(True)
    assert all(np.array_equal(a, b) for a, b in zip(clean, guarded, strict=True))


def test_sb3_epsilon_greedy_predict_is_the_same_after_an_oom() -> None:
    sb3 = pytest.importorskip("stable_baselines3")
    gym = pytest.importorskip("gymnasium")
    env = gym.make("CartPole-v1")
    agent = sb3.DQN("MlpPolicy", env, learning_starts=0, seed=0, device="cpu")
    agent.exploration_rate = 0.5
    obs = np.stack([env.observation_space.sample() for _ in range(6)])

    def actions(fault: Any) -> list[np.ndarray]:
        np.random.seed(0)
        torch.manual_seed(0)
        agent.action_space.seed(0)
        # One call draws one exploration decision for all its observations: a retry must
        # draw the same one, and the call is never cut (chunks would draw one each).
        predict = RolloutGuard(lambda o: agent.predict(o, deterministic=False)[0], max_splits=1)
        with fault:
            return [predict(obs) for _ in range(40)]

    clean = actions(inject_oom(0.0))
    with_faults = actions(inject_oom(0.02, seed=1, where=("forward",)))
    assert len({tuple(a) for a in clean}) > 3  # the policy does explore
    assert all(np.array_equal(a, b) for a, b in zip(clean, with_faults, strict=True))


# -- 5. BatchNorm statistics ---------------------------------------------------------------------


def _bn_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2)).double()


def _bn_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items() if "running" in k or "num_b" in k}


def test_a_retried_forward_does_not_update_batchnorm_twice() -> None:
    batches = _batches(30)

    def run(fault: Any) -> tuple[nn.Module, TrainGuard]:
        model = _bn_model()
        # Retries only: a split normalises over micro-batches, which is not the same step.
        guard = TrainGuard(
            torch.optim.SGD(model.parameters(), lr=0.05), _loss(model), transient_retries=10
        )
        with fault:
            for batch in batches:
                guard(batch)
        return model, guard

    clean, _ = run(inject_oom(0.0))
    faulty, guard = run(inject_oom(0.03, seed=4, where=("forward", "backward")))
    assert sum(e.kind == "retry" for e in guard.events) >= 3
    assert all(e.kind != "split" for e in guard.events)
    expected, got = _bn_state(clean), _bn_state(faulty)
    assert int(got["1.num_batches_tracked"]) == 30
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=0, atol=1e-12)
    assert _max_diff(_params(faulty), _params(clean)) <= 1e-12


def test_split_stats_policies() -> None:
    batch = _batches(1, size=32)[0]
    whole = _bn_model()
    whole.train()
    whole(batch[0])  # the whole batch's update of the running statistics
    full = _bn_state(whole)

    def split(policy: str) -> dict[str, torch.Tensor]:
        model = _bn_model()
        guard = TrainGuard(torch.optim.SGD(model.parameters(), lr=0.0), _loss(model),
                           split_stats=policy)  # fmt: skip
        guard.splits = 4
        guard(batch)
        return _bn_state(model)

    average, first, each = split("average"), split("first"), split("each")
    assert int(average["1.num_batches_tracked"]) == 1
    torch.testing.assert_close(average["1.running_mean"], full["1.running_mean"])
    assert int(first["1.num_batches_tracked"]) == 1
    assert int(each["1.num_batches_tracked"]) == 4
    quarter = _bn_model()
    quarter.train()
    quarter(batch[0][:8])
    torch.testing.assert_close(first["1.running_mean"], _bn_state(quarter)["1.running_mean"])
    with pytest.raises(memfit.ConfigError, match="split_stats"):
        TrainGuard(torch.optim.SGD(whole.parameters(), lr=0.1), _loss(whole), split_stats="x")


def test_buffers_of_modules_loss_fn_refers_to_are_found_without_model() -> None:
    model = _bn_model()
    guard = TrainGuard(torch.optim.SGD(model.parameters(), lr=0.1), _loss(model))
    assert guard._buffers.active


# -- 6. the ladder comes back down after a give-up -------------------------------------------


def test_high_fault_rates_do_not_freeze_the_run_at_the_maximum_split() -> None:
    model = _mlp()
    guard = TrainGuard(torch.optim.SGD(model.parameters(), lr=0.01), _loss(model), max_splits=8)
    done = gave_up = 0
    batches = _batches(150)
    with inject_oom(0.05, seed=0, where=("forward", "backward")):
        for batch in batches:
            try:
                guard(batch)
                done += 1
            except OutOfMemory:
                gave_up += 1
    # At 5% per operation each attempt fails about half the time: splitting does not help
    # (a smaller micro-batch has as many operations), so most steps must come through by
    # retrying, not by climbing to the maximum split and staying there.
    assert done >= 140
    assert guard.splits < 8


# -- 10. before_step ---------------------------------------------------------------------------


def test_clip_grad_norm_hook_equals_torch_clipping_and_survives_faults_inside() -> None:
    batches = _batches(20)
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    norms = []
    for x, y in batches:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        norms.append(float(nn.utils.clip_grad_norm_(model.parameters(), 0.05)))
        opt.step()
    expected = _params(model)

    def run(fault: Any) -> tuple[TrainGuard, list[torch.Tensor]]:
        model = _mlp()
        guard = TrainGuard(
            torch.optim.SGD(model.parameters(), lr=0.5),
            _loss(model),
            before_step=clip_grad_norm(0.05),
            snapshot_optimizer="always",
        )
        got = []
        with fault:
            for batch in batches:
                guard(batch)
                got.append(float(guard.last_before_step))
        return guard, [*_params(model), torch.tensor(got, dtype=torch.float64)]

    _, clean = run(inject_oom(0.0))
    assert _max_diff(clean[:-1], expected) <= 1e-12
    torch.testing.assert_close(clean[-1], torch.tensor(norms, dtype=torch.float64))
    guard, faulty = run(inject_oom(0.02, seed=3, inplace=True))
    assert any("before_step" in e.message for e in guard.events)
    assert _max_diff(faulty[:-1], expected) <= 1e-12


def test_loss_fn_clipping_does_nothing_but_before_step_does() -> None:
    """Clipping inside loss_fn runs before backward, on no gradient at all."""
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)

    def loss_fn(b: Batch) -> torch.Tensor:
        nn.utils.clip_grad_norm_(model.parameters(), 1e-6)  # no .grad yet: a no-op
        return nn.functional.mse_loss(model(b[0]), b[1])

    before = _params(model)
    TrainGuard(opt, loss_fn)(_batches(1)[0])
    unclipped = _max_diff(_params(model), before)
    model2 = _mlp()
    TrainGuard(torch.optim.SGD(model2.parameters(), lr=1.0), _loss(model2),
               before_step=clip_grad_norm(1e-6))(_batches(1)[0])  # fmt: skip
    assert unclipped > 1e-3 and _max_diff(_params(model2), before) <= 2e-6


def _bn_cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Unflatten(1, (2, 2, 2)),
        nn.Conv2d(2, 4, 1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(16, 2),
    ).double()


def _state(model: nn.Module) -> list[torch.Tensor]:
    """Parameters and buffers (BatchNorm's running statistics), as floats."""
    return [t.detach().clone() for t in model.state_dict().values() if t.is_floating_point()]


OPTIMIZERS: dict[str, Callable[[nn.Module], torch.optim.Optimizer]] = {
    "adam": lambda m: torch.optim.Adam(m.parameters(), lr=1e-2),
    "sgd_momentum": lambda m: torch.optim.SGD(m.parameters(), lr=1e-2, momentum=0.9),
}


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize(
    "faults",
    [{2}, {2, 3, 4}, {2, 3, 4, 5, 6}, {2, 3, 4, 5, 6, 7}, {1, 2, 3, 4, 5, 6, 7, 8, 9}],
    ids=lambda f: f"{len(f)} in a row",
)
def test_an_oom_in_before_step_runs_the_whole_batch_again_and_stays_exact(
    optimizer: str, faults: set[int]
) -> None:
    """Issue 45: a ``torch.OutOfMemoryError()`` (no message) raised by a user's before_step
    is retried, then the whole batch runs again (as after an out-of-memory in the forward
    pass), never split: a BatchNorm CNN ends where the unguarded run does, with Adam and with
    SGD with momentum. When it keeps failing the guard gives up with the step undone (the
    BatchNorm statistics back), so running the batch again is exact too."""
    batches = _batches(4)
    model = _bn_cnn()
    _bare(model, OPTIMIZERS[optimizer](model), batches)
    expected = _state(model)

    model = _bn_cnn()
    calls = 0

    def hook(opt: torch.optim.Optimizer) -> None:
        nonlocal calls
        calls += 1
        if calls in faults:
            raise torch.OutOfMemoryError()

    guard = TrainGuard(OPTIMIZERS[optimizer](model), _loss(model), before_step=hook)
    gave_up = []
    for batch in batches:
        while True:
            try:
                guard(batch)
                break
            except OutOfMemory as exc:
                gave_up.append(str(exc))
    assert _max_diff(_state(model), expected) <= 1e-12
    assert guard.splits == 1 and not any(e.kind == "split" for e in guard.events)
    if len(faults) > 3:
        assert any("running the whole batch again" in e.message for e in guard.events)
    if len(faults) >= 6:  # 3 tries, the whole batch again, 3 more tries
        assert gave_up and "before_step (hook) ran out of memory" in gave_up[0], gave_up
        assert "optimizer.step()" not in gave_up[0]
    else:
        assert not gave_up


# -- 11. chaos tests see the policy the run uses -------------------------------------------------


def test_inject_oom_does_not_change_the_policy() -> None:
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), foreach=True)
    guard = TrainGuard(opt, _loss(model))
    batches = _batches(3)
    guard(batches[0])
    assert guard.last_step_journaled and not guard.last_step_snapshotted
    with inject_oom(0.0):
        guard(batches[1])
    assert guard.last_step_journaled and not guard.last_step_snapshotted


def test_an_unsnapshotted_adam_step_that_fails_halfway_stops_clearly() -> None:
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), foreach=True)
    guard = TrainGuard(opt, _loss(model), snapshot_optimizer="never")
    batches = _batches(3)
    guard(batches[0])
    # Adam's step writes its moments in place, then allocates sqrt(v): fail there.
    with inject_oom(0.0, where=("optimizer",)) as probe:
        guard(batches[1])
    sqrt_index = probe.ops_seen - 1  # the last allocating operation of the step
    with (
        pytest.raises(OutOfMemory, match="could not be undone"),
        inject_oom(0.0, where=("optimizer",), at=[sqrt_index]),
    ):
        guard(batches[2])


def test_an_unsnapshotted_step_that_failed_before_changing_anything_is_retried() -> None:
    model, reference = _mlp(), _mlp()
    batches = _batches(3)
    _bare(reference, torch.optim.Adam(reference.parameters(), foreach=True), batches)
    guard = TrainGuard(
        torch.optim.Adam(model.parameters(), foreach=True),
        _loss(model),
        snapshot_optimizer="never",
    )
    guard(batches[0])
    # Its first operation (counting the steps, in place) fails before it runs.
    with inject_oom(0.0, where=("optimizer",), at=[0], inplace=True) as fault:
        guard(batches[1])
    guard(batches[2])
    assert fault.total_raised == 1
    assert any(e.kind == "restore" and "changed anything" in e.message for e in guard.events)
    assert _max_diff(_params(model), _params(reference)) <= 1e-12


def test_numpy_gaussian_cache_is_put_back_too() -> None:
    """NumPy's legacy normal draws come in pairs: every other call uses the cached one and
    leaves the generator's words as they were; a retry must still see the same cache."""
    calls = {"n": 0}

    def act(obs: np.ndarray) -> np.ndarray:
        noise = np.random.standard_normal()  # one draw: the cache flips every call
        calls["n"] += 1
        if calls["n"] in (2, 3, 6):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")
        return obs + noise

    def run(guarded: bool) -> list[np.ndarray]:
        np.random.seed(1)
        calls["n"] = -100 if not guarded else 0
        fn = RolloutGuard(act) if guarded else act
        return [fn(np.zeros(3)) for _ in range(9)]

    assert all(np.array_equal(a, b) for a, b in zip(run(False), run(True), strict=True))


def test_rng_state_sees_a_consumed_gaussian_although_the_words_did_not_change() -> None:
    from memfit.runtime._rewind import RngState

    rng = RngState()
    np.random.seed(0)
    np.random.standard_normal()  # draws a pair from the words, caches the second
    rng.capture()
    np.random.standard_normal()  # takes the cached one: the words stay as they were
    rng.capture()  # must not reuse the first copy, whose cache is now gone
    expected = np.random.standard_normal()
    rng.restore()
    assert np.random.standard_normal() == expected
