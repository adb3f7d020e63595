"""TrainGuard: the result equals an out-of-memory-free run, and the ladder behaves."""

from __future__ import annotations

import contextlib
import dataclasses
from collections import namedtuple
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn

import memfit
from memfit.errors import ConfigError, OutOfMemory
from memfit.runtime.events import MemoryEvent
from memfit.runtime.guard import TrainGuard, batch_size, split_batch
from memfit.runtime.simulate import simulate_gpu
from memfit.testing import inject_oom

STEPS = 200
BATCH = 64


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 4))


def _optimizer(name: str, model: nn.Module) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, foreach=True)
    return torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True)


def _data(steps: int = STEPS) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    return [
        (torch.randn(BATCH, 16, generator=gen), torch.randn(BATCH, 4, generator=gen))
        for _ in range(steps)
    ]


def _bare_run(name: str, data: list[tuple[torch.Tensor, torch.Tensor]]) -> nn.Module:
    """The plain loop practitioners write, with no out-of-memory: the reference."""
    model = _model()
    opt = _optimizer(name, model)
    for x, y in data:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return model


def _guarded_run(
    name: str,
    data: list[tuple[torch.Tensor, torch.Tensor]],
    context: contextlib.AbstractContextManager[Any],
    **kwargs: Any,
) -> tuple[nn.Module, TrainGuard, Any]:
    model = _model()
    opt = _optimizer(name, model)

    def loss_fn(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(model(x), y)

    guard = TrainGuard(opt, loss_fn, **kwargs)
    with context as ctx:
        for batch in data:
            guard(batch)
    return model, guard, ctx


def _max_relative_error(a: nn.Module, b: nn.Module) -> float:
    pairs = zip(a.parameters(), b.parameters(), strict=True)
    return max(float((p - q).detach().norm() / q.detach().norm()) for p, q in pairs)


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """Tiny tensors: intra-op threads only add contention on a shared machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    return _data()


@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_inject_oom_run_equals_oom_free_run(
    name: str, data: list[tuple[torch.Tensor, torch.Tensor]]
) -> None:
    reference = _bare_run(name, data)
    # About 15 allocating operations per micro-batch: rate 0.01 fails one micro-batch in
    # seven, which gives the guard retries, splits and grow-backs to go through in 200
    # steps. Faults in the optimizer phase need the snapshot to be undone exactly.
    model, guard, chaos = _guarded_run(
        name, data, inject_oom(0.01, seed=5), grow_back_after=10, snapshot_optimizer="always"
    )
    assert chaos.total_raised >= 20
    # SGD's step writes in place only: no allocation there for a fault to strike.
    phases = {"forward", "backward"} | ({"optimizer"} if name == "adam" else set())
    assert {k for k, v in chaos.raised.items() if v} == phases
    ooms = [e for e in guard.events if e.kind == "oom"]
    assert len(ooms) == chaos.total_raised  # every injected error was seen and survived
    assert guard.steps == STEPS
    assert _max_relative_error(model, reference) <= 1e-5


@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_default_policy_is_exact_under_forward_and_backward_faults(
    name: str, data: list[tuple[torch.Tensor, torch.Tensor]]
) -> None:
    reference = _bare_run(name, data)
    fault = inject_oom(0.01, seed=5, where=("forward", "backward"))
    model, guard, chaos = _guarded_run(name, data, fault, grow_back_after=10)
    assert chaos.total_raised >= 20 and guard.steps == STEPS
    assert _max_relative_error(model, reference) <= 1e-5


@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_simulated_small_gpu_run_equals_full_batch_run(
    name: str, data: list[tuple[torch.Tensor, torch.Tensor]]
) -> None:
    short = data[:60]
    reference = _bare_run(name, short)
    # 48 KiB: the full batch of 64 needs more than this under both optimizers, 32 items fit.
    model, guard, gpu = _guarded_run(name, short, simulate_gpu("48KiB"), grow_back_after=20)
    kinds = [e.kind for e in guard.events]
    assert "split" in kinds and "grow_back" in kinds
    assert gpu.peak_allocated_bytes <= 48 * 1024
    assert guard.steps == len(short)
    assert _max_relative_error(model, reference) <= 1e-5


def test_guard_without_oom_is_the_plain_loop(data: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    short = data[:20]
    reference = _bare_run("adam", short)
    model, guard, _ = _guarded_run("adam", short, contextlib.nullcontext())
    assert guard.events == [] and guard.splits == 1
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p, q)


def test_the_ladder_retries_then_splits_then_gives_up() -> None:
    model = _model()
    opt = _optimizer("sgd", model)
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    sizes: list[int] = []

    def loss_fn(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        sizes.append(int(batch[0].shape[0]))
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")

    before = [p.detach().clone() for p in model.parameters()]
    guard = TrainGuard(opt, loss_fn, max_splits=4)
    with pytest.raises(OutOfMemory, match="even after retry x1, split x2, split x4") as info:
        guard((x, y))
    assert sizes == [8, 8, 4, 2]
    assert info.value.tried == ["retry x1", "split x2", "split x4"]
    assert info.value.hint is not None and "2 items" in info.value.hint
    assert [e.kind for e in guard.events][-1] == "give_up"
    for p, q in zip(model.parameters(), before, strict=True):
        assert torch.equal(p, q) and p.grad is None


def test_give_up_reports_peak_and_budget_of_the_simulated_gpu() -> None:
    model = _model()
    opt = _optimizer("sgd", model)
    guard = TrainGuard(opt, lambda b: nn.functional.mse_loss(model(b[0]), b[1]), max_splits=2)
    batch = (torch.randn(64, 16), torch.randn(64, 4))
    with simulate_gpu("12KiB"), pytest.raises(OutOfMemory) as info:
        guard(batch)
    assert info.value.budget_bytes == 12 * 1024
    assert info.value.peak_bytes is not None and 0 < info.value.peak_bytes <= 12 * 1024
    assert info.value.device is not None and "simulated" in info.value.device


def test_micro_batches_that_succeeded_are_not_redone() -> None:
    model = _model()
    opt = _optimizer("sgd", model)
    seen: list[tuple[int, int]] = []
    fail_on = {(16, 8)}  # the chunk at item 16 of size 8 fails four times
    failures = [4]

    def loss_fn(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        first = int(batch["i"][0])
        n = int(batch["i"].shape[0])
        seen.append((first, n))
        if (first, n) in fail_on and failures[0] > 0:
            failures[0] -= 1
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB")
        return nn.functional.mse_loss(model(batch["x"]), batch["y"])

    guard = TrainGuard(opt, loss_fn)
    guard.splits = 4  # 32 items in micro-batches of 8
    batch = {"i": torch.arange(32), "x": torch.randn(32, 16), "y": torch.randn(32, 4)}
    guard(batch)
    # 0 and 8 succeed once, so 8 items are known to fit: 16 is retried three times (a
    # transient failure, by the evidence), fails a fourth time, and only then 16..32 runs in
    # chunks of 4. Nothing that succeeded runs again.
    assert seen == [
        (0, 8),
        (8, 8),
        (16, 8),
        (16, 8),
        (16, 8),
        (16, 8),
        (16, 4),
        (20, 4),
        (24, 4),
        (28, 4),
    ]
    assert guard.splits == 8


def test_count_fn_weights_micro_batches_by_tokens() -> None:
    """Loss is a mean over tokens; items carry different numbers of tokens."""
    torch.manual_seed(3)
    x = torch.randn(12, 5, 16)
    y = torch.randn(12, 5, 4)
    mask = (torch.rand(12, 5) < 0.6).float()
    mask[:, 0] = 1

    def run(splits: int) -> list[torch.Tensor]:
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def loss_fn(b: dict[str, torch.Tensor]) -> torch.Tensor:
            err = ((model(b["x"]) - b["y"]) ** 2).mean(-1)
            return (err * b["mask"]).sum() / b["mask"].sum()

        guard = TrainGuard(opt, loss_fn, count_fn=lambda b: float(b["mask"].sum()))
        guard.splits = splits
        guard({"x": x, "y": y, "mask": mask})
        return [p.detach().clone() for p in model.parameters()]

    whole, split = run(1), run(3)
    for a, b in zip(whole, split, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


Pair = namedtuple("Pair", ["x", "y"])


@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    y: torch.Tensor
    name: str = "batch"


@pytest.mark.parametrize(
    "make",
    [
        lambda x, y: (x, y),
        lambda x, y: [x, y],
        lambda x, y: {"inputs": {"x": x}, "y": y, "tag": "keep"},
        lambda x, y: Pair(x, y),
        lambda x, y: Batch(x, y),
    ],
)
def test_batch_pytrees_are_split_along_dim_0(make: Callable[[Any, Any], Any]) -> None:
    x, y = torch.arange(10.0).reshape(10, 1), torch.arange(10.0)
    part = split_batch(make(x, y), 2, 5)
    assert type(part) is type(make(x, y))
    leaves = [v for v in _leaves(part) if isinstance(v, torch.Tensor)]
    assert [t.shape[0] for t in leaves] == [3, 3]
    assert batch_size(make(x, y)) == 10
    non_tensors = [v for v in _leaves(part) if isinstance(v, str)]
    assert non_tensors in ([], ["keep"], ["batch"])


def _leaves(tree: Any) -> Iterator[Any]:
    if isinstance(tree, dict):
        for v in tree.values():
            yield from _leaves(v)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            yield from _leaves(v)
    elif dataclasses.is_dataclass(tree):
        for f in dataclasses.fields(tree):
            yield from _leaves(getattr(tree, f.name))
    else:
        yield tree


def test_batches_whose_tensors_disagree_are_refused() -> None:
    disagree = r"batch\[1\] has 3 items along dim 0 but batch\[0\] has 4"
    with pytest.raises(ConfigError, match=disagree):
        batch_size((torch.zeros(4), torch.zeros(3)))
    with pytest.raises(ConfigError, match="no tensor"):
        batch_size({"a": 1})


def test_oom_inside_optimizer_step_restores_params_and_state() -> None:
    data = _data(40)
    reference = _bare_run("adam", data)
    model, guard, chaos = _guarded_run(
        "adam",
        data,
        inject_oom(0.05, seed=1, where=("optimizer",)),
        snapshot_optimizer="always",
    )
    assert chaos.raised["optimizer"] >= 5
    assert sum(e.kind == "restore" for e in guard.events) == chaos.raised["optimizer"]
    assert _max_relative_error(model, reference) <= 1e-6


def test_oom_in_optimizer_without_snapshot_stops_clearly() -> None:
    model = _model()
    opt = _optimizer("sgd", model)
    guard = TrainGuard(
        opt, lambda b: nn.functional.mse_loss(model(b[0]), b[1]), snapshot_optimizer="never"
    )
    with (
        inject_oom(1.0, seed=0, where=("optimizer",)),
        pytest.raises(OutOfMemory, match=r"could not be undone \(snapshot_optimizer='never'\)"),
    ):
        guard((torch.randn(4, 16), torch.randn(4, 4)))


def test_optimizers_that_cannot_be_guarded_are_refused() -> None:
    model = _model()
    with pytest.raises(ConfigError, match="LBFGS"):
        TrainGuard(torch.optim.LBFGS(model.parameters()), lambda b: b)
    with pytest.raises(ConfigError, match="max_splits"):
        TrainGuard(_optimizer("sgd", model), lambda b: b, max_splits=0)


class _OddOptimizer(torch.optim.SGD):
    """An optimizer whose state holds a Python list: memfit cannot snapshot it."""

    def step(self, closure: Any = None) -> Any:
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["history"] = [1.0]
        return super().step(closure)


def test_state_memfit_cannot_copy_is_refused_with_a_hint() -> None:
    model = _model()
    opt = _OddOptimizer(model.parameters(), lr=0.1)
    guard = TrainGuard(
        opt, lambda b: nn.functional.mse_loss(model(b[0]), b[1]), snapshot_optimizer="always"
    )
    batch = (torch.randn(4, 16), torch.randn(4, 4))
    guard(batch)  # first step: no state yet
    with pytest.raises(ConfigError, match="cannot snapshot") as info:
        guard(batch)
    assert info.value.hint is not None and "snapshot_optimizer='never'" in info.value.hint


def test_grad_scaler_updates_once_per_full_step() -> None:
    data = _data(30)

    def run(context: contextlib.AbstractContextManager[Any]) -> tuple[nn.Module, Any, int]:
        model = _model()
        opt = _optimizer("adam", model)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=5)
        updates = [0]
        original = scaler.update

        def counting_update(new_scale: Any = None) -> None:
            updates[0] += 1
            original(new_scale)

        scaler.update = counting_update  # type: ignore[method-assign]
        guard = TrainGuard(opt, lambda b: nn.functional.mse_loss(model(b[0]), b[1]), scaler=scaler)
        with context:
            for batch in data:
                guard(batch)
        return model, scaler, updates[0]

    ref_model, ref_scaler, ref_updates = run(contextlib.nullcontext())
    model, scaler, updates = run(inject_oom(0.01, seed=5, where=("forward", "backward")))
    assert updates == ref_updates == len(data)
    assert scaler.get_scale() == ref_scaler.get_scale() == 2.0**10 * 2**6
    assert _max_relative_error(model, ref_model) <= 1e-5


def test_events_carry_figures_and_reach_the_sink() -> None:
    received: list[MemoryEvent] = []
    model = _model()
    opt = _optimizer("sgd", model)
    guard = memfit.TrainGuard(
        opt, lambda b: nn.functional.mse_loss(model(b[0]), b[1]), on_event=received.append
    )
    batch = (torch.randn(64, 16), torch.randn(64, 4))
    with simulate_gpu("40KiB"):
        guard(batch)
    assert received == guard.events and received
    first = received[0]
    assert first.kind == "oom" and first.source == "TrainGuard" and first.step == 0
    assert first.data["budget_bytes"] == 40 * 1024
    assert isinstance(first.data["allocated_bytes"], int)
    assert first.to_dict()["data"]["splits"] == 1


class _FlakyAdam(torch.optim.Adam):
    """Adam whose step half-updates the parameters, then runs out of memory, on call 3."""

    calls = 0

    def step(self, closure: Any = None) -> Any:
        type(self).calls += 1
        if type(self).calls == 3:
            with torch.no_grad():
                for p in self.param_groups[0]["params"][:1]:
                    p.add_(1.0)  # a partial update
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 MiB")
        return super().step(closure)


def test_snapshot_policies() -> None:
    model = _model()
    opt = _optimizer("adam", model)
    guard = TrainGuard(opt, lambda b: nn.functional.mse_loss(model(b[0]), b[1]))
    batch = (torch.randn(8, 16), torch.randn(8, 4))
    for budget in (None, "1GiB"):
        with simulate_gpu(budget) if budget else contextlib.nullcontext():
            guard(batch)
        # "auto" journals every step on the device, never a host copy
        assert guard.last_step_journaled and not guard.last_step_snapshotted
    always = TrainGuard(
        opt, lambda b: nn.functional.mse_loss(model(b[0]), b[1]), snapshot_optimizer="always"
    )
    always(batch)
    assert always.last_step_snapshotted and not always.last_step_journaled
    never = TrainGuard(
        opt, lambda b: nn.functional.mse_loss(model(b[0]), b[1]), snapshot_optimizer=False
    )
    never(batch)
    assert not never.last_step_snapshotted and not never.last_step_journaled
    with pytest.raises(ConfigError, match="snapshot_optimizer"):
        TrainGuard(opt, lambda b: b, snapshot_optimizer="sometimes")


def test_a_custom_step_that_fails_halfway_is_exact_by_default() -> None:
    torch.manual_seed(3)
    batch = (torch.randn(8, 16), torch.randn(8, 4))
    reference = _model()
    ref_opt = torch.optim.Adam(reference.parameters(), lr=1e-3)
    for _ in range(3):
        ref_opt.zero_grad()
        nn.functional.mse_loss(reference(batch[0]), batch[1]).backward()
        ref_opt.step()
    model = _model()
    _FlakyAdam.calls = 0
    opt = _FlakyAdam(model.parameters(), lr=1e-3)
    guard = TrainGuard(opt, lambda b: nn.functional.mse_loss(model(b[0]), b[1]))
    for _ in range(3):
        guard(batch)  # the third fails after a partial update: undone and retried
    assert any(e.kind == "oom" and "journal" in e.message for e in guard.events)
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p, q)
        assert torch.equal(opt.state[p]["exp_avg_sq"], ref_opt.state[q]["exp_avg_sq"])
        assert torch.equal(opt.state[p]["step"], ref_opt.state[q]["step"])


def test_step_without_snapshot_that_fails_says_so() -> None:
    model = _model()
    _FlakyAdam.calls = 0
    opt = _FlakyAdam(model.parameters(), lr=1e-3)
    guard = TrainGuard(
        opt, lambda b: nn.functional.mse_loss(model(b[0]), b[1]), snapshot_optimizer="never"
    )
    batch = (torch.randn(8, 16), torch.randn(8, 4))
    guard(batch)
    guard(batch)
    with pytest.raises(OutOfMemory, match="could not be undone"):
        guard(batch)  # fails after a partial update: memfit must not pretend otherwise


class _ScalarReads(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts reads of a tensor's value to the host (``item()``, ``float()``)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func._opname == "_local_scalar_dense":
            self.reads += 1
        return func(*args, **(kwargs or {}))


def test_step_returns_the_loss_as_a_tensor_without_reading_it() -> None:
    data = _data(4)
    runs = []
    for mode in ("bare", "call", "step"):
        model = _model()
        opt = _optimizer("adam", model)
        guard = TrainGuard(opt, lambda b, m=model: nn.functional.mse_loss(m(b[0]), b[1]))
        reads = _ScalarReads()
        losses: list[Any] = []
        with reads:
            for b in data:
                if mode == "bare":  # Adam reads its step counts (CPU tensors) itself
                    opt.zero_grad()
                    nn.functional.mse_loss(model(b[0]), b[1]).backward()
                    opt.step()
                else:
                    losses.append(guard.step(b) if mode == "step" else guard(b))
        runs.append((losses, [p.detach().clone() for p in model.parameters()], reads.reads))
    (_, params_bare, reads_bare), (floats, _, reads_call), (tensors, params_step, reads_step) = runs
    assert reads_step == reads_bare  # the loss itself was never read to the host
    assert reads_call == reads_bare + len(data)  # one read per step, at its end
    assert all(isinstance(t, torch.Tensor) and not t.requires_grad for t in tensors)
    assert [float(t) for t in tensors] == floats
    for p, q in zip(params_bare, params_step, strict=True):
        assert torch.equal(p, q)


def test_step_in_micro_batches_returns_the_weighted_loss_on_the_cpu() -> None:
    model = _model()
    opt = _optimizer("sgd", model)
    guard = TrainGuard(opt, lambda b: nn.functional.mse_loss(model(b[0]), b[1]))
    guard.splits = 4
    x, y = _data(1)[0]
    with torch.no_grad():
        expected = float(nn.functional.mse_loss(model(x), y))
    loss = guard.step((x, y))
    assert loss.dtype == torch.float64 and loss.device.type == "cpu"
    assert float(loss) == pytest.approx(expected, rel=1e-6)


def test_retry_message_counts_in_words() -> None:
    """Issue 22: "retrying with 1 micro-batch", not "1 micro-batch(s)"."""
    model = _model()
    opt = _optimizer("sgd", model)
    failures = [1]

    def loss_fn(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        if failures[0]:
            failures[0] -= 1
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")
        return nn.functional.mse_loss(model(batch[0]), batch[1])

    guard = TrainGuard(opt, loss_fn)
    guard((torch.randn(8, 16), torch.randn(8, 4)))
    [retry] = [e.message for e in guard.events if e.kind == "retry"]
    assert "(s)" not in retry and retry.startswith("retrying with 1 ")
