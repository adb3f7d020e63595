"""The optimizer step of a TrainGuard: unscale, ``before_step``, then ``optimizer.step()``
made exact by the journal (``"auto"``), a host snapshot (``"always"``) or nothing
(``"never"``), retried on out-of-memory."""

from __future__ import annotations

from typing import Any

from memfit.errors import OutOfMemory
from memfit.runtime._journal import StepFailed, add_note
from memfit.runtime._memory import device_name, free_memory
from memfit.runtime._snapshot import (
    OptimizerSnapshot,
    step_fingerprint,
    undo_if_untouched,
    versions_trustworthy,
)
from memfit.runtime._train_parts import TrainParts
from memfit.runtime.oom import first_line, forget_exception, is_oom

__all__ = ["GuardedStep"]

_add_note = add_note


class GuardedStep(TrainParts):
    """``optimizer.step()`` and what runs just before it, undone or completed on a fault."""

    def _unscale(self) -> str | None:
        """``scaler.unscale_`` once per full step; retried only where it is atomic."""
        scaler = self.scaler
        if scaler is None:
            return None
        groups = {
            (p.grad.device, p.grad.dtype)
            for g in self.optimizer.param_groups
            for p in g["params"]
            if p.grad is not None
        }

        def unscale() -> None:
            # An out-of-memory before the (single, in-place) unscale op leaves the gradients
            # as they were; forget the scaler's half-done bookkeeping and do it again.
            self._reset_scaler_step()
            scaler.unscale_(self.optimizer)

        return self._retrying("GradScaler.unscale_", unscale, attempts=3 if len(groups) <= 1 else 1)

    def _run_before_step(self) -> str | None:
        hook = self.before_step
        if hook is None:
            return None

        def call() -> None:
            self.last_before_step = hook(self.optimizer)

        return self._retrying(f"before_step ({getattr(hook, '__name__', 'hook')})", call)

    def _before_optimizer_step(self) -> tuple[str | None, str | None]:
        """``scaler.unscale_`` and ``before_step``, each retried on out-of-memory.

        Returns:
            ``(None, None)``, or the last out-of-memory message and what raised it.
        """
        message = self._unscale()
        if message is not None:
            return message, "GradScaler.unscale_"
        message = self._run_before_step()
        if message is not None:
            hook = getattr(self.before_step, "__name__", "hook")
            return message, f"before_step ({hook})"
        return None, None

    def _snapshot_wanted(self) -> bool:
        """Whether this step's ``optimizer.step()`` takes the host snapshot (``"always"``;
        ``"auto"`` journals every step instead, ``"never"`` does neither)."""
        return self._snapshot is not None

    def _restore_or_raise(self, snapshot: OptimizerSnapshot, tried: list[str], what: str) -> None:
        failure = self._retrying("restoring the optimizer snapshot", snapshot.restore, attempts=10)
        if failure is not None:
            raise OutOfMemory(
                "could not restore the parameters after an out-of-memory inside "
                f"optimizer.step(): {failure}",
                device=device_name(),
                tried=[*tried, what],
                hint="the model is in an undefined state; reload the last checkpoint",
            )

    def _optimizer_step(self, tried: list[str], wanted: bool) -> str | None:
        """``optimizer.step()`` (through the scaler), undone and retried on out-of-memory.

        Any other error inside it puts the parameters and optimizer state back when a
        snapshot was taken (else the error says they may be partly updated) and propagates.
        """
        self._divided = None
        journal = self._journal
        self.last_step_journaled = journal is not None
        if journal is not None:
            self.last_step_snapshotted = False

            def retried(message: str, what: str) -> None:
                self._event(
                    "oom",
                    "out of memory inside optimizer.step(): put back from the journal and "
                    "stepped again",
                    error=first_line(message),
                    attempt=what,
                )

            try:
                journal.run(self._step_optimizer, retried)
            except StepFailed as failed:
                self._divided = failed.divided
                tried.append("optimizer.step() retried from the journal")
                return failed.message
            return None
        snapshot = self._snapshot if wanted and self._snapshot is not None else None
        if snapshot is not None:
            failure = self._retrying("the optimizer snapshot", snapshot.take)
            if failure is not None:
                return failure
        self.last_step_snapshotted = snapshot is not None
        # Without a snapshot: whether a failed step changed anything (version counters).
        before = (
            step_fingerprint(self.optimizer)
            if snapshot is None and versions_trustworthy()
            else None
        )
        saved_foreach: list[Any] | None = None
        # Retries are cheap (a copy back from host memory); a step that fails the same way
        # three times is retried without foreach, which needs fewer temporaries.
        attempts = [
            "step",
            "retry step",
            "retry step",
            "step foreach=False",
            "retry step foreach=False",
            "retry step foreach=False",
        ]
        message: str | None = None
        try:
            for attempt in attempts:
                if attempt == "step foreach=False":
                    if not any("foreach" in g for g in self.optimizer.param_groups):
                        break
                    saved_foreach = [g.get("foreach") for g in self.optimizer.param_groups]
                    for g in self.optimizer.param_groups:
                        if "foreach" in g:
                            g["foreach"] = False
                try:
                    self._step_optimizer()
                except BaseException as exc:
                    if not isinstance(exc, Exception) or not is_oom(exc):
                        self._undo_after_error(exc, snapshot, tried, attempt)
                        raise
                    message = forget_exception(exc)
                else:
                    return None
                free_memory()
                self._event(
                    "oom", "out of memory inside optimizer.step()", error=first_line(message)
                )
                if snapshot is not None:
                    self._restore_or_raise(snapshot, tried, attempt)
                    self._event(
                        "restore",
                        "parameters and optimizer state restored to their pre-step values",
                        attempt=attempt,
                    )
                elif before is not None and undo_if_untouched(self.optimizer, before):
                    self._event(
                        "restore",
                        "optimizer.step() failed before it changed anything: running it again",
                        attempt=attempt,
                    )
                else:
                    return message
                tried.append(attempt)
            return message
        finally:
            if saved_foreach is not None:
                for g, value in zip(self.optimizer.param_groups, saved_foreach, strict=True):
                    if "foreach" in g:
                        g["foreach"] = value

    def _undo_after_error(
        self,
        exc: BaseException,
        snapshot: OptimizerSnapshot | None,
        tried: list[str],
        attempt: str,
    ) -> None:
        """A non-OOM error (or KeyboardInterrupt) inside ``optimizer.step()``: put back what
        can be put back before it propagates."""
        if snapshot is not None:
            try:
                self._restore_or_raise(snapshot, tried, attempt)
            except OutOfMemory:
                _add_note(
                    exc,
                    "memfit: the parameters could not be restored (out of memory); "
                    "reload the last checkpoint",
                )
            else:
                _add_note(
                    exc,
                    "memfit: parameters and optimizer state were restored to their "
                    "values before this optimizer.step()",
                )
        else:
            _add_note(
                exc,
                "memfit: no snapshot was taken for this optimizer.step(), so the parameters "
                "may be partly updated; use snapshot_optimizer='always' to make every step "
                "undoable",
            )
