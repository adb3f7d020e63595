"""What the pieces of a TrainGuard step share: its state, its events, and the small
operations every piece uses (run-and-retry, the generators and buffers, the scaler's
per-step bookkeeping).

:class:`memfit.runtime._train_guard.TrainGuard` is made of :class:`TrainParts` (this),
:class:`~memfit.runtime._micro_batches.MicroBatches` (forward and backward of the
micro-batches) and :class:`~memfit.runtime._guarded_step.GuardedStep` (the optimizer step).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from memfit.runtime._guard_base import GuardBase
from memfit.runtime._journal import StepJournal
from memfit.runtime._memory import free_memory, memory_figures
from memfit.runtime._rewind import BufferState
from memfit.runtime._snapshot import OptimizerSnapshot
from memfit.runtime.oom import first_line, forget_exception, is_oom

if TYPE_CHECKING:
    import torch

    from memfit.runtime._rewind import RngState

__all__ = ["TrainParts"]


class TrainParts(GuardBase):
    """The state of a TrainGuard and the operations its pieces share."""

    optimizer: torch.optim.Optimizer
    loss_fn: Callable[[Any], torch.Tensor]
    model: torch.nn.Module | None
    count_fn: Callable[[Any], float] | None
    scaler: torch.amp.GradScaler | None
    snapshot_optimizer: bool | str
    before_step: Callable[[Any], Any] | None
    split_stats: str
    reduction: str
    steps: int
    last_before_step: Any
    last_step_snapshotted: bool
    last_step_journaled: bool
    _ddp: bool
    _snapshot_policy: str
    _snapshot: OptimizerSnapshot | None
    _journal: StepJournal | None
    _divided: str | None
    _rng: RngState | None
    _buffers: BufferState

    # -- events ------------------------------------------------------------------------------
    def _event(self, kind: str, message: str, **data: Any) -> None:
        figures: dict[str, Any] = memory_figures()
        figures.update(data)
        self._record(kind, message, self.steps, figures)

    def _retrying(self, what: str, fn: Callable[[], Any], attempts: int = 3) -> str | None:
        """Run ``fn`` (safe to run again after an out-of-memory); retry ``attempts`` times.

        Returns:
            ``None`` on success, else the last error message.
        """
        message: str | None = None
        for _ in range(attempts):
            message = self._attempt(fn)
            if message is None:
                return None
            self._event("oom", f"out of memory in {what}; trying again", error=first_line(message))
        return message

    @staticmethod
    def _attempt(fn: Callable[[], Any]) -> str | None:
        """Run ``fn`` once; on out-of-memory, leave the ``except`` block, free, and say why.

        Returns:
            ``None`` on success, else the out-of-memory message (the exception, its frames
            and chained exceptions already released, and cached memory freed).
        """
        try:
            fn()
        except Exception as exc:
            if not is_oom(exc):
                raise
            message = forget_exception(exc)
        else:
            return None
        free_memory()
        return message

    def _step_optimizer(self) -> None:
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
        else:
            self.optimizer.step()

    # -- pieces of a step --------------------------------------------------------------------

    def _params(self) -> list[torch.nn.Parameter]:
        return [p for g in self.optimizer.param_groups for p in g["params"] if p.requires_grad]

    def _zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def _capture(self, buffers: bool = True) -> None:
        if self._rng is not None:
            self._rng.capture()
        if buffers:
            self._buffers.capture()

    def _abandon(self) -> None:
        """A step that will not happen: generators and buffers back to the step's start (as
        last captured), best effort (the error that ends the step is the one to report)."""
        with contextlib.suppress(Exception):
            self._buffers.discard_average()
            self._rewind()

    def _rewind(self) -> None:
        if self._rng is not None:
            self._rng.restore()
        self._buffers.restore()

    def _reset_scaler_step(self) -> None:
        if self.scaler is None:
            return
        from torch.amp.grad_scaler import _refresh_per_optimizer_state

        self.scaler._per_optimizer_states[id(self.optimizer)] = _refresh_per_optimizer_state()
