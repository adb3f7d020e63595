"""The guard's journal never causes the out-of-memory it guards against (issue 34).

With the default ``snapshot_optimizer="auto"`` the journal copies the chunk of parameters
and optimizer state being stepped. On a budget just above what the step needs without
the guard, that copy must go to host memory rather than push the step over the budget; the
run is then the bare loop's, bit for bit.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the guard needs torch")

import memfit  # noqa: E402
from memfit import TrainGuard  # noqa: E402
from memfit.errors import OutOfMemory  # noqa: E402
from memfit.runtime import _journal  # noqa: E402

BIG = 2**30
#: What the guard itself may hold beyond a bare loop (the step's detached loss).
GUARD_OVERHEAD = 4096


def _build(name: str, foreach: bool, width: int = 256) -> tuple[Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, width), torch.nn.ReLU(), torch.nn.Linear(width, 10)
    )
    kwargs: dict[str, Any] = {"lr": 1e-2, "foreach": foreach}
    if name == "SGD":
        kwargs["momentum"] = 0.9
    return model, getattr(torch.optim, name)(model.parameters(), **kwargs)


def _data(steps: int = 3) -> list[tuple[Any, Any]]:
    gen = torch.Generator().manual_seed(1)
    return [
        (torch.randn(32, 64, generator=gen), torch.randint(0, 10, (32,), generator=gen))
        for _ in range(steps)
    ]


def _bare(name: str, foreach: bool) -> tuple[int, list[Any]]:
    with memfit.simulate_gpu(BIG) as gpu:
        model, opt = _build(name, foreach)
        for x, y in _data():
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        return gpu.peak_allocated_bytes, [p.detach().clone() for p in model.parameters()]


def _guarded(name: str, foreach: bool, budget: int, policy: str = "auto") -> tuple[int, Any, Any]:
    with memfit.simulate_gpu(budget) as gpu:
        model, opt = _build(name, foreach)
        guard = TrainGuard(
            opt,
            lambda b: torch.nn.functional.cross_entropy(model(b[0]), b[1]),
            model=model,
            snapshot_optimizer=policy,
        )
        for batch in _data():
            guard(batch)
        return gpu.peak_allocated_bytes, guard, [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("foreach", [True, False], ids=["foreach", "for-loop"])
@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW"])
def test_on_a_budget_just_above_the_bare_peak_the_default_guard_fits(
    name: str, foreach: bool
) -> None:
    peak, reference = _bare(name, foreach)
    never_peak, _, _ = _guarded(name, foreach, BIG, "never")
    assert never_peak - peak <= GUARD_OVERHEAD  # the guard's own cost, the journal apart
    budget = peak + GUARD_OVERHEAD
    used, guard, params = _guarded(name, foreach, budget)
    assert used <= budget
    assert guard.splits == 1 and not [e for e in guard.events if e.kind == "give_up"]
    assert guard.journal_on_host and guard.last_step_journaled
    assert all(torch.equal(a, b) for a, b in zip(params, reference, strict=True))
    moved = [e for e in guard.events if e.kind == "journal"]
    assert len(moved) == 1 and "host memory" in moved[0].message


@pytest.mark.parametrize("name", ["SGD", "Adam"])
def test_with_room_the_journal_stays_on_the_device(name: str) -> None:
    peak, reference = _bare(name, True)
    used, guard, params = _guarded(name, True, BIG)
    assert not guard.journal_on_host and used > peak  # the copy was on the (simulated) GPU
    assert all(torch.equal(a, b) for a, b in zip(params, reference, strict=True))


@pytest.mark.parametrize("name", ["Adam", "AdamW"])
def test_when_the_sizing_guesses_wrong_an_oom_moves_the_copy_and_the_step_completes(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sizing is a bound from measurements; what guarantees the promise is the move on an
    out-of-memory: with the sizing told the step needs nothing, the copy goes on the device,
    the step runs out of memory, and the copy moves to host memory before the chunk is
    stepped again (not counted as a retry)."""
    monkeypatch.setattr(_journal, "step_headroom", lambda params, stateless: 0)
    peak, reference = _bare(name, True)
    used, guard, params = _guarded(name, True, peak + GUARD_OVERHEAD)
    assert used <= peak + GUARD_OVERHEAD and guard.journal_on_host
    assert all(torch.equal(a, b) for a, b in zip(params, reference, strict=True))
    moved = [e for e in guard.events if e.kind == "journal"]
    assert moved and "ran out of memory with the copy" in moved[0].message


def test_the_issue_mlp_fits_100_mib_under_every_policy() -> None:
    """A 1024-4096-10 MLP with Adam at batch 256 on a simulated 100 MiB card."""

    def run(policy: str) -> int:
        torch.manual_seed(0)
        with memfit.simulate_gpu("100MiB") as gpu:
            model = torch.nn.Sequential(
                torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 10)
            )
            opt = torch.optim.Adam(model.parameters(), lr=1e-3)
            x, y = torch.randn(256, 1024), torch.randint(0, 10, (256,))
            guard = TrainGuard(
                opt,
                lambda b: torch.nn.functional.cross_entropy(model(b[0]), b[1]),
                model=model,
                snapshot_optimizer=policy,
            )
            for _ in range(2):
                guard((x, y))
            return gpu.peak_allocated_bytes

    assert run("auto") == run("never") == run("always")


def test_a_step_that_does_not_fit_says_what_the_journal_cost_and_how_to_avoid_it() -> None:
    peak, _ = _bare("Adam", True)
    with pytest.raises(OutOfMemory) as info:
        _guarded("Adam", True, peak - 1024)
    assert "memfit's journal kept its copy" in info.value.message
    assert "snapshot_optimizer='never'" in (info.value.hint or "")


def test_step_headroom_bounds_the_measured_temporaries_of_every_builtin_optimizer() -> None:
    """The sizing's figures hold for each per-parameter optimizer of torch.optim: what a
    step allocates beyond what was allocated before it stays under ``step_headroom``."""
    for name in _journal._PER_PARAMETER:
        for foreach in (True, False):
            with memfit.simulate_gpu(BIG) as gpu:
                model, _ = _build("Adam", foreach)
                cls = getattr(torch.optim, name)
                opt = cls(model.parameters(), lr=1e-3, foreach=foreach)
                params = sum(p.numel() * p.element_size() for p in model.parameters())
                for step in range(2):
                    model(torch.randn(8, 64)).sum().backward()
                    before = gpu.allocated_bytes
                    gpu.reset_peak()
                    opt.step()
                    extra = gpu.peak_allocated_bytes - before
                    bound = _journal.step_headroom(params, params if step == 0 else 0)
                    assert extra <= bound, (name, foreach, step, extra, bound)
                    opt.zero_grad(set_to_none=True)


@pytest.mark.skipif(sys.platform == "win32", reason="gloo ranks are spawned processes")
def test_under_ddp_the_default_guard_fits_where_the_unjournaled_one_does(tmp_path: Path) -> None:
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available():
        pytest.skip("torch.distributed missing")
    sys.path.insert(0, str(Path(__file__).parent))
    import _memfit_journal_ddp_worker as worker
    from _ddp_launch import free_port, launch

    launch(worker.worker, (2, free_port(), str(tmp_path)), 2)
    for rank in range(2):
        result = torch.load(tmp_path / f"rank{rank}.pt")
        for name, got in result.items():
            assert got["error"] is None, (rank, name, got["error"])
            assert got["on_host"], (rank, name)
            assert got["peak"] <= got["budget"]
            assert all(torch.equal(a, b) for a, b in zip(got["auto"], got["never"], strict=True))
