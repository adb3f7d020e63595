"""The default guard leaves no half-done optimizer step (issue 21): a fault at every operation
of ``optimizer.step()`` (an out-of-memory, a ``RuntimeError``, a ``KeyboardInterrupt``), for
SGD, SGD with momentum, Adam and AdamW (foreach and for-loop), in one chunk and in one chunk
per parameter, leaves parameters and optimizer state bit for bit equal to a run without the
fault: the step done (an out-of-memory, retried; an error in a chunked step, completed) or
not done at all (an error in a one-chunk step, undone).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from memfit.runtime.guard import TrainGuard
from memfit.runtime.oom import in_no_alloc_section
from memfit.testing import inject_oom

Batch = tuple[torch.Tensor, torch.Tensor]

OPTIMIZERS: dict[str, Callable[[Any, bool], torch.optim.Optimizer]] = {
    "sgd": lambda ps, fe: torch.optim.SGD(ps, lr=0.1, foreach=fe),
    "sgd_momentum": lambda ps, fe: torch.optim.SGD(ps, lr=0.1, momentum=0.9, foreach=fe),
    "adam": lambda ps, fe: torch.optim.Adam(ps, lr=1e-2, foreach=fe),
    "adamw": lambda ps, fe: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, foreach=fe),
}


class _PerParameter(TrainGuard):
    """A guard whose journal holds one parameter at a time (a model "larger" than the cap)."""

    journal_bytes = 1


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class _RaiseAt(TorchDispatchMode):
    """Raise ``error`` at the ``at``-th operation inside ``optimizer.step()`` (in-place ones
    included); count the operations when ``at`` is ``None``."""

    def __init__(self, error: BaseException | None, at: int | None) -> None:
        super().__init__()
        self.error, self.at, self.seen, self.raised = error, at, 0, 0
        self.inside = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        counted = not (
            in_no_alloc_section()
            or func.is_view
            or func.namespace == "profiler"  # as inject_oom counts them
            or func._opname == "_local_scalar_dense"
        )
        if self.inside and counted:
            index = self.seen
            self.seen += 1
            if index == self.at and self.error is not None:
                self.raised += 1
                self.inside = 0
                raise self.error
        return func(*args, **(kwargs or {}))


def _raising(error: BaseException | None, at: int | None) -> Any:
    from contextlib import contextmanager

    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    @contextmanager
    def ctx() -> Iterator[_RaiseAt]:
        mode = _RaiseAt(error, at)

        def pre(*_: Any) -> None:
            mode.inside += 1

        def post(*_: Any) -> None:
            mode.inside = max(0, mode.inside - 1)

        h1, h2 = register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post)
        try:
            with mode:
                yield mode
        finally:
            h1.remove()
            h2.remove()

    return ctx()


def _setup(name: str, foreach: bool, cls: type[TrainGuard]) -> tuple[TrainGuard, nn.Module]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 2))
    opt = OPTIMIZERS[name](model.parameters(), foreach)

    def loss_fn(b: Batch) -> torch.Tensor:
        return nn.functional.mse_loss(model(b[0]), b[1])

    return cls(opt, loss_fn, model=model), model


def _batches() -> list[Batch]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 6, generator=g), torch.randn(8, 2, generator=g)) for _ in range(3)]


def _state(guard: TrainGuard, model: nn.Module) -> list[torch.Tensor]:
    out = [p.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        st = guard.optimizer.state.get(p, {})
        out += [v.clone() for _, v in sorted(st.items()) if isinstance(v, torch.Tensor)]
    return out


def _equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _reference(name: str, foreach: bool) -> list[list[torch.Tensor]]:
    guard, model = _setup(name, foreach, TrainGuard)
    states = [_state(guard, model)]
    for b in _batches():
        guard(b)
        states.append(_state(guard, model))
    return states


def _fault(kind: str, at: int) -> Any:
    if kind == "oom":
        return inject_oom(0.0, where=("optimizer",), at=[at], inplace=True)
    error = RuntimeError("injected") if kind == "error" else KeyboardInterrupt()
    return _raising(error, at)


@pytest.mark.parametrize("chunked", [False, True], ids=["one_chunk", "per_parameter"])
@pytest.mark.parametrize(
    "foreach",
    [
        # the per-parameter loop has many more operations to fault at: the slow suite's
        pytest.param(False, id="forloop", marks=pytest.mark.slow),
        pytest.param(True, id="foreach"),
    ],
)
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_a_fault_at_every_operation_of_the_step_leaves_no_half_step(
    name: str, foreach: bool, chunked: bool
) -> None:
    cls = _PerParameter if chunked else TrainGuard
    expected = _reference(name, foreach)
    batches = _batches()
    # Operations inside the steps: the second step (state exists) and the first (creates it).
    for fault_step in (1, 0):
        guard, model = _setup(name, foreach, cls)
        for b in batches[:fault_step]:
            guard(b)
        with _raising(None, None) as counter:
            guard(batches[fault_step])
        ops = counter.seen
        assert ops > 0
        for kind in ("oom", "error", "interrupt"):
            for at in range(ops):
                guard, model = _setup(name, foreach, cls)
                for b in batches[:fault_step]:
                    guard(b)
                where = f"{kind} at op {at} of {ops}, step {fault_step}"
                if kind == "oom":
                    with _fault(kind, at) as fault:
                        guard(batches[fault_step])
                    assert fault.total_raised == 1, where
                    assert _equal(_state(guard, model), expected[fault_step + 1]), where
                else:
                    error = RuntimeError if kind == "error" else KeyboardInterrupt
                    with pytest.raises(error) as info, _fault(kind, at):
                        guard(batches[fault_step])
                    notes = " ".join(getattr(info.value, "__notes__", []))
                    done = "completed" in notes
                    assert done or "undone" in notes, where
                    assert done == chunked, where  # one chunk: undone; several: completed
                    after = expected[fault_step + (1 if done else 0)]
                    assert _equal(_state(guard, model), after), where
                    assert all(p.grad is None for p in model.parameters()), where
                    if not done:
                        guard(batches[fault_step])  # the caller runs the batch again
                # and the run goes on exactly
                guard(batches[fault_step + 1])
                assert _equal(_state(guard, model), expected[fault_step + 2]), where


def test_per_parameter_chunks_step_like_the_whole_step() -> None:
    for name in OPTIMIZERS:
        for foreach in (False, True):
            expected = _reference(name, foreach)
            guard, model = _setup(name, foreach, _PerParameter)
            for i, b in enumerate(_batches()):
                guard(b)
                assert _equal(_state(guard, model), expected[i + 1]), (name, foreach, i)
            assert guard._journal is not None and guard._journal.chunks > 2


def test_a_persistent_error_in_a_chunked_step_says_which_parameters_took_it() -> None:
    guard, model = _setup("adam", False, _PerParameter)
    batches = _batches()
    guard(batches[0])
    before = _state(guard, model)

    calls = {"n": 0}
    real = torch.optim.Adam.step

    def failing(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] >= 3:  # the third chunk fails, and again when it is retried
            raise RuntimeError("a persistent bug")
        return real(self, *args, **kwargs)

    torch.optim.Adam.step = failing  # type: ignore[method-assign]
    try:
        with pytest.raises(RuntimeError, match="persistent") as info:
            guard(batches[1])
    finally:
        torch.optim.Adam.step = real  # type: ignore[method-assign]
    notes = " ".join(info.value.__notes__)
    after = _state(guard, model)
    params = list(model.parameters())
    moved = [not torch.equal(after[i], before[i]) for i in range(len(params))]
    done = sum(moved)
    assert 0 < done < len(params)
    assert moved == [True] * done + [False] * (len(params) - done)  # in the optimizer's order
    assert f"the first {done} of {len(params)} parameters" in notes
    # every parameter's state matches its values: step counts 2 where it moved, else 1
    for p, m in zip(params, moved, strict=True):
        assert int(guard.optimizer.state[p]["step"]) == (2 if m else 1)


@pytest.mark.parametrize("text", ["", "\n", "CUDA out of memory"])
def test_an_out_of_memory_with_any_text_in_a_hook_is_retried(text: str) -> None:
    calls = {"n": 0}

    def hook(optimizer: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise torch.OutOfMemoryError(text)

    guard, _ = _setup("adam", False, TrainGuard)
    guard.before_step = hook
    guard(_batches()[0])
    assert calls["n"] == 2 and guard.steps == 1
    oom = [e for e in guard.events if e.kind == "oom"]
    assert oom and oom[0].data["error"] == (text.strip() or "no message")


def _sum_setup(reduction: str) -> tuple[TrainGuard, nn.Module]:
    torch.manual_seed(0)
    model = nn.Linear(6, 2).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def loss_fn(b: Batch) -> torch.Tensor:  # a sum over the items, not a mean
        return nn.functional.mse_loss(model(b[0]), b[1], reduction="sum")

    return TrainGuard(opt, loss_fn, model=model, reduction=reduction), model


def _double_batches() -> list[Batch]:
    return [(x.double(), y.double()) for x, y in _batches()]


def test_a_split_says_how_it_weights_the_losses() -> None:
    for reduction, says in (("mean", "reduction='sum' if"), ("sum", "added")):
        guard, _ = _sum_setup(reduction)
        batch = _double_batches()[0]
        with inject_oom(0.0, where=("forward",), at=[0, 1]):  # the batch, then its retry
            guard(batch)
        splits = [e.message for e in guard.events if e.kind == "split"]
        assert splits and all(says in m for m in splits), splits


def test_reduction_sum_splits_like_the_whole_batch() -> None:
    batches = _double_batches()
    whole, whole_model = _sum_setup("sum")
    split, split_model = _sum_setup("sum")
    for b in batches:
        whole(b)
        split.splits = 4
        split(b)
    for p, q in zip(whole_model.parameters(), split_model.parameters(), strict=True):
        assert float((p - q).abs().max()) <= 1e-12
    with pytest.raises(Exception, match="reduction"):
        _sum_setup("total")


def test_a_fault_anywhere_in_a_step_with_a_hook_and_a_grow_back_leaves_the_exact_run() -> None:
    """Forward, backward, the before_step hook, the optimizer step and the step that grows
    back to the whole batch: an out-of-memory at any operation (in-place ones too) ends the
    run where the fault-free run ends (float64; a split sums in another order: 1e-12)."""
    from memfit.runtime.guard import clip_grad_norm

    def make() -> tuple[TrainGuard, nn.Module]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 2)).double()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2, foreach=False)
        guard = TrainGuard(
            opt,
            lambda b: nn.functional.mse_loss(model(b[0]), b[1]),
            model=model,
            before_step=clip_grad_norm(0.5),
            grow_back_after=1,
        )
        guard.splits = 2  # the first step runs split, the second grows back to whole
        return guard, model

    batches = [(x.double(), y.double()) for x, y in _batches()[:2]]
    guard, model = make()
    with inject_oom(0.0, inplace=True) as probe:
        for b in batches:
            guard(b)
    assert any(e.kind == "grow_back" for e in guard.events)
    expected = _state(guard, model)
    for at in range(probe.ops_seen):
        guard, model = make()
        with inject_oom(0.0, at=[at], inplace=True) as fault:
            for b in batches:
                guard(b)
        assert fault.total_raised == 1, at
        got = _state(guard, model)
        assert len(got) == len(expected)
        assert (
            max(float((a - b).abs().max()) for a, b in zip(got, expected, strict=True)) <= 1e-12
        ), at


@pytest.mark.parametrize("where", ["loss_fn", "before_step"])
@pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError])
def test_an_error_before_the_optimizer_step_leaves_generators_and_statistics_as_before(
    where: str, error: type[BaseException]
) -> None:
    """Dropout draws and BatchNorm statistics of a step that an error ends are put back, so
    running the batch again gives the run without the error, bit for bit."""

    def run(fault_at: int | None) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = nn.Sequential(
            nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Dropout(0.3), nn.Linear(8, 2)
        ).double()
        state = {"armed": False}

        def loss_fn(b: Batch) -> torch.Tensor:
            loss = nn.functional.mse_loss(model(b[0]), b[1])
            if state["armed"] and where == "loss_fn":
                raise error("stop")
            return loss

        def hook(optimizer: Any) -> None:
            if state["armed"] and where == "before_step":
                raise error("stop")

        guard = TrainGuard(
            torch.optim.Adam(model.parameters(), lr=1e-2), loss_fn, model=model, before_step=hook
        )
        torch.manual_seed(123)
        for i, b in enumerate(_double_batches()):
            if i == fault_at:
                state["armed"] = True
                with pytest.raises(error):
                    guard(b)
                state["armed"] = False
            guard(b)
        return [t.detach().clone() for t in [*model.parameters(), *model.buffers()]]

    expected = run(None)
    assert _equal(run(1), expected)


@pytest.mark.parametrize("chunked", [False, True], ids=["one_chunk", "per_parameter"])
def test_with_a_grad_scaler_an_oom_inside_the_step_is_exact(chunked: bool) -> None:
    """``scaler.step(optimizer)`` calls the journalled step (the optimizer's ``step`` is
    replaced for the call): a fault at any operation of the step leaves the fault-free run."""
    cls = _PerParameter if chunked else TrainGuard

    def make() -> tuple[TrainGuard, nn.Module]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 2))
        opt = torch.optim.Adam(model.parameters(), lr=1e-2, foreach=False)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
        guard = cls(
            opt, lambda b: nn.functional.mse_loss(model(b[0]), b[1]), model=model, scaler=scaler
        )
        return guard, model

    batches = _batches()
    guard, model = make()
    for b in batches[:2]:
        guard(b)
    with _raising(None, None) as counter:
        guard(batches[2])
    expected = _state(guard, model)
    assert counter.seen > 0
    for at in range(counter.seen):
        guard, model = make()
        for b in batches[:2]:
            guard(b)
        with inject_oom(0.0, where=("optimizer",), at=[at], inplace=True) as fault:
            guard(batches[2])
        assert fault.total_raised == 1, at
        assert _equal(_state(guard, model), expected), at
