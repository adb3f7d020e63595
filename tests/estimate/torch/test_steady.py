"""The steady state engages with the default three traced steps (issue 32).

The first step also makes what lives on (the optimizer's state, the cuBLAS workspace at the
first matmul); the period check leaves those out of its positions, so an Adam or SGD loop,
as people write it, is replayed on to the allocator's steady state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from memfit.estimate.torch._steady import steady_program

torch = pytest.importorskip("torch")

import memfit  # noqa: E402


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))


OPTIMIZERS = {
    "adam": lambda p: torch.optim.Adam(p),
    "adamw": lambda p: torch.optim.AdamW(p),
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1),
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
}


def _batch(n: int) -> tuple[Any, Any]:
    return torch.randn(n, 64), torch.randint(0, 10, (n,))


def _step_zero_first(model: Any, opt: Any, batch: Any) -> Any:
    x, y = batch
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss


def _step_zero_last(model: Any, opt: Any, batch: Any) -> None:
    x, y = batch
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("step", [_step_zero_first, _step_zero_last], ids=["first", "last"])
def test_an_mlp_loop_reaches_the_steady_state_in_three_steps(optimizer: str, step: Any) -> None:
    def build() -> tuple[Any, Any]:
        model = _mlp()
        return model, OPTIMIZERS[optimizer](model.parameters())

    est = memfit.estimate_torch(build, step, _batch, [8, 16], kernel_scratch=False)
    assert any("replayed on through the allocator model" in d for d in est.deviations)
    assert not any("differ from one another" in d for d in est.deviations)


@dataclass(eq=False)
class _Rec:
    nbytes: int
    target: str = "all"
    free_index: int | None = None


def _events(steps: list[list[tuple[str, int]]]) -> tuple[list[Any], list[int], int]:
    """Build a trace from per-step ops: ``("a", size)`` allocates, ``("f", k)`` frees the
    k-th allocation made so far (any step)."""
    events: list[Any] = []
    made: list[_Rec] = []
    starts = []
    for ops in steps:
        starts.append(len(events))
        for kind, value in ops:
            if kind == "a":
                rec = _Rec(value)
                made.append(rec)
                events.append((rec, True))
            else:
                made[value].free_index = len(events)
                events.append((made[value], False))
    return events, starts, len(events)


def test_what_the_first_step_makes_for_good_is_left_out() -> None:
    # step 0 makes a kept state (100) before its activations; steps free the previous
    # step's gradient (the second allocation of each step)
    state_first = [("a", 8), ("a", 100), ("a", 4), ("f", 0)]
    steps = [state_first, [("a", 8), ("a", 4), ("f", 3), ("f", 2)],
             [("a", 8), ("a", 4), ("f", 5), ("f", 4)]]  # fmt: skip
    events, starts, done = _events(steps)
    program = steady_program(events, starts, done)
    assert program is not None and program.kept_bytes == 0
    assert program.ops == [(8, -1, -1), (4, -1, -1), (0, 0, 0), (0, 1, 1)]
    # a last step that frees something older than the step before is not periodic
    odd = [state_first, [("a", 8), ("a", 4), ("f", 3), ("f", 2)],
           [("a", 8), ("a", 4), ("f", 5), ("f", 1)]]  # fmt: skip
    events, starts, done = _events(odd)
    assert steady_program(events, starts, done) is None
    assert steady_program(events, starts[:2], done) is None  # two steps: no period to see
