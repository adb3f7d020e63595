"""Chaos testing for training loops: ``memfit.testing.inject_oom``.

Under :func:`inject_oom` each PyTorch operation dispatched in a chosen phase raises
``torch.OutOfMemoryError`` with probability ``rate``, drawn from a seeded generator, so a run
is reproducible. The error is raised *before* the operation runs, so the operation has no
effect, as when the caching allocator refuses the operation's first allocation.

The phase of an operation is found this way:

* ``"optimizer"``: between the global ``Optimizer.step`` pre-hook and post-hook
  (``torch.optim.optimizer.register_optimizer_step_pre_hook`` / ``..._post_hook``). A step
  that raises never reaches its post-hook; the phase then ends when memfit raises the
  injected error itself, or at the next operation run with gradients enabled (an optimizer
  step runs with gradients disabled).
* ``"backward"``: while the autograd engine runs a graph task
  (``torch._C._current_graph_task_id() != -1``), i.e. inside ``backward()`` or
  ``torch.autograd.grad``.
* ``"forward"``: everything else.

Three kinds of operation never fail, because they take no memory from the allocator: views
(``slice``, ``view``, ``t``...), reads of a scalar to the host (``tensor.item()``), and
operations inside :func:`memfit.runtime.oom.no_alloc_section` (memfit's own commit steps,
which only write into existing memory).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from memfit.errors import ConfigError
from memfit.runtime.oom import in_no_alloc_section

__all__ = ["PHASES", "InjectedOom", "chaos_active", "inject_oom"]

_ACTIVE = [0]


def chaos_active() -> bool:
    """Whether an :func:`inject_oom` context is active (TrainGuard then always snapshots)."""
    return _ACTIVE[0] > 0


# Operator namespaces that never allocate tensor memory (profiler bookkeeping).
_NEVER = frozenset({"profiler"})
# Operators that return a Python number, not a tensor (``tensor.item()``, ``float(tensor)``):
# they copy one value to the host and take nothing from the device's allocator.
_SCALAR_READS = frozenset({"_local_scalar_dense"})

#: The phases ``inject_oom`` can target.
PHASES: tuple[str, ...] = ("forward", "backward", "optimizer")


@dataclass
class InjectedOom:
    """What one :func:`inject_oom` context did.

    Attributes:
        rate: Probability per operation.
        seed: Seed of the generator.
        where: The phases targeted.
        ops_seen: Operations dispatched in a targeted phase.
        raised: Errors raised, by phase.
        limit: At most this many errors are raised (``None``: no limit).
    """

    rate: float
    seed: int
    where: tuple[str, ...]
    limit: int | None = None
    ops_seen: int = 0
    raised: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PHASES, 0))

    @property
    def total_raised(self) -> int:
        """Errors raised in all phases."""
        return sum(self.raised.values())


def _check(rate: float, where: Sequence[str], limit: int | None) -> tuple[str, ...]:
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate <= 1:
        raise ConfigError(
            f"rate must be a probability in [0, 1], not {rate!r}",
            key_path="rate",
            hint="use a small rate such as 0.01 (one operation in a hundred)",
        )
    if isinstance(where, str):
        where = (where,)
    phases = tuple(where)
    unknown = [p for p in phases if p not in PHASES]
    if unknown or not phases:
        raise ConfigError(
            f"unknown phase(s) {unknown or list(phases)!r}",
            key_path="where",
            hint=f"choose among {', '.join(PHASES)}",
        )
    if limit is not None and limit < 0:
        raise ConfigError(f"limit must be >= 0, not {limit}", key_path="limit")
    return phases


@contextmanager
def inject_oom(
    rate: float,
    seed: int = 0,
    where: Sequence[str] = PHASES,
    *,
    limit: int | None = None,
) -> Iterator[InjectedOom]:
    """Make PyTorch operations fail with ``torch.OutOfMemoryError`` at random.

    Args:
        rate: Probability that one operation in a targeted phase fails.
        seed: Seed; the same seed and the same program give the same failures.
        where: Phases to target: any of ``"forward"``, ``"backward"``, ``"optimizer"``.
        limit: Raise at most this many errors (``None``: no limit).

    Yields:
        An :class:`InjectedOom` with the counts, updated as the block runs.

    Raises:
        ConfigError: When ``rate`` is not in ``[0, 1]``, a phase is unknown, or ``limit``
            is negative.

    >>> import torch
    >>> with inject_oom(1.0, seed=0, where=("forward",)) as chaos:
    ...     try:
    ...         torch.ones(3) + 1
    ...     except torch.OutOfMemoryError:
    ...         pass
    >>> chaos.raised["forward"]
    1
    """
    phases = _check(rate, where, limit)
    import torch
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )
    from torch.utils._python_dispatch import TorchDispatchMode

    record = InjectedOom(rate=float(rate), seed=seed, where=phases, limit=limit)
    rng = random.Random(seed)
    state = {"optimizer": 0}

    def _pre(optimizer: Any, args: Any, kwargs: Any) -> None:
        state["optimizer"] += 1

    def _post(optimizer: Any, args: Any, kwargs: Any) -> None:
        state["optimizer"] = max(0, state["optimizer"] - 1)

    def _phase() -> str:
        if state["optimizer"]:
            if torch.is_grad_enabled():
                state["optimizer"] = 0  # a step that raised never reached its post-hook
            else:
                return "optimizer"
        if torch._C._current_graph_task_id() != -1:
            return "backward"
        return "forward"

    current: Callable[[], str] = _phase

    class _InjectMode(TorchDispatchMode):  # type: ignore[no-untyped-call]
        def __torch_dispatch__(
            self,
            func: Any,
            types: Any,
            args: tuple[Any, ...] = (),
            kwargs: dict[str, Any] | None = None,
        ) -> Any:
            if (
                in_no_alloc_section()
                or func.is_view
                or func.namespace in _NEVER
                or func._opname in _SCALAR_READS
            ):
                return func(*args, **(kwargs or {}))
            phase = current()
            if phase in phases:
                record.ops_seen += 1
                under_limit = record.limit is None or record.total_raised < record.limit
                if rng.random() < record.rate and under_limit:
                    record.raised[phase] += 1
                    if phase == "optimizer":
                        state["optimizer"] = 0
                    raise torch.OutOfMemoryError(
                        f"CUDA out of memory. Tried to allocate 2.00 MiB (injected by "
                        f"memfit.testing.inject_oom in {phase}, {func}; seed {seed})"
                    )
            return func(*args, **(kwargs or {}))

    pre_handle = register_optimizer_step_pre_hook(_pre)
    post_handle = register_optimizer_step_post_hook(_post)
    _ACTIVE[0] += 1
    try:
        with _InjectMode():  # type: ignore[no-untyped-call]
            yield record
    finally:
        _ACTIVE[0] -= 1
        pre_handle.remove()
        post_handle.remove()
