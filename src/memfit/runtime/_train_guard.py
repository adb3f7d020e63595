"""TrainGuard: optimisation steps that survive out-of-memory without changing the result.

See :mod:`memfit.runtime.guard` for the whole story. The class is made of three pieces, one
job each: :mod:`memfit.runtime._train_parts` (state, events, shared operations),
:mod:`memfit.runtime._micro_batches` (forward and backward of the micro-batches) and
:mod:`memfit.runtime._guarded_step` (the optimizer step); this module holds the arguments
and the order of a step. Gradient clipping as a hook is :mod:`memfit.runtime._clip`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from memfit._checks import (
    require_callable,
    require_instance,
    require_iterable,
    require_positive_int,
)
from memfit._plain import plural
from memfit.core import ladder
from memfit.errors import ConfigError, MemfitError, OutOfMemory
from memfit.runtime import _distributed as distributed
from memfit.runtime._batching import batch_size
from memfit.runtime._clip import BeforeStep, clip_grad_norm
from memfit.runtime._guarded_step import GuardedStep
from memfit.runtime._journal import StepJournal, add_note
from memfit.runtime._memory import free_memory, out_of_memory
from memfit.runtime._micro_batches import MicroBatches
from memfit.runtime._rewind import SPLIT_STATS, BufferState, modules_of
from memfit.runtime._rewind import rng_state as _rng_state
from memfit.runtime._snapshot import OptimizerSnapshot
from memfit.runtime.events import EventSink
from memfit.runtime.oom import first_line

if TYPE_CHECKING:
    import torch

__all__ = ["TrainGuard", "clip_grad_norm"]

_add_note = add_note


class TrainGuard(MicroBatches, GuardedStep):
    """Run optimisation steps that survive out-of-memory without changing the result.

    Args:
        optimizer: The optimizer over the model's parameters.
        loss_fn: ``loss_fn(batch) -> loss``: the *mean* loss over the batch's items (a
            scalar tensor). TrainGuard calls it on the whole batch or on micro-batches.
        model: The model. Under DDP (a ``DistributedDataParallel`` module) TrainGuard runs
            backward under its ``no_sync()`` and averages the gradients itself, once per
            step. Its buffers that change during a step (BatchNorm statistics) are put back
            on retry; without ``model``, the modules ``loss_fn`` refers to are watched.
        count_fn: ``count_fn(batch) -> number``: what the mean in ``loss_fn`` is over (e.g.
            tokens); default: the batch's size along dim 0.
        max_splits: Most micro-batches per step before giving up.
        scaler: A ``torch.amp.GradScaler``: scale per micro-batch, unscale and update once
            per step.
        on_event: Called with every :class:`~memfit.runtime.events.MemoryEvent`.
        grow_back_after: Clean steps (steps that did not have to split further) after
            which the micro-batch count is halved again.
        snapshot_optimizer: How a fault inside ``optimizer.step()`` (an out-of-memory,
            another error, an interrupt) is kept from leaving a half-done step. ``"auto"``
            (default): a journal on the parameters' device (see
            :mod:`memfit.runtime._journal`): the built-in per-parameter optimizers are
            stepped in chunks of at most ``max(largest parameter with its state, 64 MiB)``
            and only the chunk being stepped is copied; an out-of-memory is retried from
            the chunk that failed, so the step completes exactly; another error or an
            interrupt undoes the step when it is one chunk (models whose parameters and
            state take up to 64 MiB) and completes it first when it is several, then
            propagates with a note saying which. The copy is on the device only while the
            device has room for it next to the step, else in host memory (pinned on
            CUDA): it never makes a step that fits without it run out of memory
            (:attr:`journal_on_host`). ``"always"``/``True``: a copy of
            everything in host memory before every step (undone as a whole on any fault;
            no device memory). ``"never"``/``False``: nothing (an out-of-memory that
            changed something stops the run).
        before_step: ``before_step(optimizer)``, run once per step after the gradients are
            complete (accumulated, averaged across ranks, unscaled) and before
            ``optimizer.step()``: gradient clipping (:func:`clip_grad_norm`), logging
            gradient norms. Run again after an out-of-memory inside it, so it must change
            gradients only after its last allocation.
        restore_rng: Put random number generators back before a retry, so a retried
            micro-batch draws the same dropout masks (torch CPU and CUDA, NumPy's global
            generator, Python's ``random``, and ``rngs``): about 30 us a step on a 2-core
            VM, most of it NumPy's; ``"torch"`` puts back only torch's (under 1 us), for
            steps that draw nothing from NumPy or ``random``; ``False`` none.
        rngs: More generators to put back (``torch.Generator``, NumPy ``Generator`` /
            ``RandomState``, ``random.Random``).
        split_stats: What micro-batches do to BatchNorm statistics: ``"average"`` (the
            step leaves the item-weighted average of the micro-batches' updates),
            ``"first"`` (only the first micro-batch updates them) or ``"each"`` (each
            does, as a gradient-accumulation loop).
        reduction: What ``loss_fn`` returns: ``"mean"`` (default) over the batch's items
            (micro-batch losses are weighted by their share of ``count_fn``), or ``"sum"``
            over them (micro-batch losses are added as they are). A sum passed as a mean
            changes the update when the batch is split (each ``"split"`` event says which
            weighting the guard uses).
        transient_retries: Retries of a micro-batch size that ran before (a transient
            failure) before the batch is split further.

    Raises:
        ConfigError: When an argument is out of range or not callable, the optimizer needs
            a closure (``LBFGS``), or the DDP model broadcasts buffers in forward (a
            collective whose count would differ between ranks).

    Attributes:
        splits: Micro-batches per step now.
        events: What happened, in order.
        steps: Steps completed.
        last_before_step: What ``before_step`` returned in the last step.
    """

    source = "TrainGuard"
    #: Bytes of parameters and optimizer state one chunk of the ``"auto"`` journal may hold
    #: beyond the largest parameter's own (the journal's device memory).
    journal_bytes = 64 * 2**20

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        loss_fn: Callable[[Any], torch.Tensor],
        *,
        model: torch.nn.Module | None = None,
        count_fn: Callable[[Any], float] | None = None,
        max_splits: int = 64,
        scaler: torch.amp.GradScaler | None = None,
        on_event: EventSink | None = None,
        grow_back_after: int = 50,
        snapshot_optimizer: bool | str = "auto",
        before_step: BeforeStep | None = None,
        restore_rng: bool | str = True,
        rngs: Iterable[Any] = (),
        split_stats: str = "average",
        transient_retries: int = 3,
        reduction: str = "mean",
    ) -> None:
        import torch

        require_positive_int("max_splits", max_splits, hint="use a power of two such as 64")
        require_positive_int("grow_back_after", grow_back_after)
        require_instance("model", model, torch.nn.Module, what="a torch.nn.Module", optional=True)
        if scaler is not None and not all(
            callable(getattr(scaler, a, None)) for a in ("scale", "unscale_", "step", "update")
        ):
            raise ConfigError(
                f"scaler must be a torch.amp.GradScaler or None, not {type(scaler).__name__}",
                key_path="scaler",
                hint="TrainGuard(..., scaler=torch.amp.GradScaler('cuda'))",
            )
        rngs = require_iterable("rngs", rngs)
        if not all(hasattr(optimizer, a) for a in ("param_groups", "step", "zero_grad", "state")):
            raise ConfigError(
                f"optimizer must be a torch.optim.Optimizer, not {type(optimizer).__name__}",
                key_path="optimizer",
                hint="TrainGuard(torch.optim.AdamW(model.parameters()), loss_fn)",
            )
        for name, fn in (
            ("loss_fn", loss_fn),
            ("count_fn", count_fn),
            ("on_event", on_event),
            ("before_step", before_step),
        ):
            require_callable(
                name,
                fn,
                optional=name != "loss_fn",
                hint="loss_fn(batch) returns the mean loss over the batch as a tensor"
                if name == "loss_fn"
                else None,
            )
        if split_stats not in SPLIT_STATS:
            raise ConfigError(
                f"split_stats must be one of {', '.join(SPLIT_STATS)}, not {split_stats!r}",
                key_path="split_stats",
            )
        if isinstance(optimizer, torch.optim.LBFGS):
            raise ConfigError(
                "TrainGuard cannot drive LBFGS: its step re-evaluates the loss through a closure",
                key_path="optimizer",
                hint="use a first-order optimizer (SGD, Adam, ...) or guard the closure yourself",
            )
        self._ddp = model is not None and distributed.is_ddp(model)
        if self._ddp and model is not None:
            will_sync = getattr(model, "will_sync_module_buffers", None)
            if callable(will_sync) and will_sync():
                raise ConfigError(
                    "the DDP model broadcasts its buffers in every forward; with micro-batches "
                    "the number of forwards can differ between ranks and they would hang",
                    key_path="model",
                    hint="wrap the model with DistributedDataParallel(..., "
                    "broadcast_buffers=False)",
                )
        if snapshot_optimizer is True:
            policy = "always"
        elif snapshot_optimizer is False:
            policy = "never"
        elif snapshot_optimizer in ("auto", "always", "never"):
            policy = str(snapshot_optimizer)
        else:
            raise ConfigError(
                "snapshot_optimizer must be 'auto', 'always' or 'never', "
                f"not {snapshot_optimizer!r}",
                key_path="snapshot_optimizer",
            )
        self._start_ladder(
            max_splits=max_splits,
            grow_back_after=grow_back_after,
            transient_retries=transient_retries,
            on_event=on_event,
        )
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.model = model
        self.count_fn = count_fn
        self.scaler = scaler
        self.snapshot_optimizer = snapshot_optimizer
        self.before_step = before_step
        self.split_stats = split_stats
        if reduction not in ("mean", "sum"):
            raise ConfigError(
                f"reduction must be 'mean' or 'sum', not {reduction!r}",
                key_path="reduction",
                hint="what loss_fn returns over the batch's items: their mean or their sum",
            )
        self.reduction = reduction
        self.steps = 0
        self.last_before_step: Any = None
        self.last_step_snapshotted = False
        self.last_step_journaled = False
        self._snapshot_policy: str = policy
        self._snapshot = OptimizerSnapshot(optimizer) if policy == "always" else None
        self._journal = (
            StepJournal(optimizer, self.journal_bytes, on_move=self._journal_moved)
            if policy == "auto"
            else None
        )
        self._divided: str | None = None  # a journalled step that gave up divided
        self._rng = _rng_state(restore_rng, rngs)
        watched = [model] if model is not None else modules_of(loss_fn)
        self._buffers = BufferState(watched, split_stats)

    @property
    def journal_held_bytes(self) -> int:
        """Memory the ``"auto"`` journal holds now (0 under the other policies): its copy of
        the chunk of parameters and optimizer state being stepped, on their device, or in
        host memory where the device had no room for it (:attr:`journal_on_host`). On CUDA
        or a simulated GPU device memory is given back after every step; host memory is
        kept."""
        return self._journal.held_bytes if self._journal is not None else 0

    @property
    def journal_on_host(self) -> bool:
        """Whether the ``"auto"`` journal keeps its copy in host memory (it moves there, for
        good, when the device has no room for it next to the step)."""
        return self._journal is not None and self._journal.on_host

    def _journal_moved(self, message: str, data: dict[str, Any]) -> None:
        self._event("journal", message, **data)

    def _give_up(self, message: str, tried: list[str], smallest: int) -> OutOfMemory:
        self._zero_grad()
        self._event("give_up", message, tried=list(tried), splits=self.splits)
        return out_of_memory(
            f"out of memory at step {self.steps}"
            + (f" even after {', '.join(tried)}" if tried else "")
            + f": {first_line(message)}",
            tried=tried,
            hint=(
                f"a micro-batch of {plural(smallest, 'item')} does not fit: shrink the model or "
                "the item (sequence length, image size), use activation checkpointing or lower "
                "precision, raise max_splits, or use a larger GPU (memfit plan tells how much)"
                if smallest
                else "the optimizer step itself does not fit next to the model: use an "
                "optimizer with less state (SGD, Adafactor, 8-bit Adam), foreach=False, "
                "or a larger GPU"
                + (
                    "; memfit's journal (snapshot_optimizer='auto') moves its copy to host "
                    "memory when the device has no room for it, and "
                    "snapshot_optimizer='never' takes no copy at all"
                    if self._journal is not None
                    else ""
                )
            ),
        )

    def _peer_stopped(self) -> MemfitError:
        self._zero_grad()
        self._reset_scaler_step()
        return MemfitError(
            f"another rank stopped with an error at step {self.steps}; this rank stops too, "
            "so that no rank waits in a collective for one that is gone",
            hint="the other rank's traceback says what went wrong",
        )

    # -- one step ------------------------------------------------------------------------------
    def __call__(self, batch: Any) -> float:
        """Run one optimisation step over ``batch``; return the batch's mean loss.

        Reading the loss as a number waits for the device to finish the step (as
        ``loss.item()`` does in a bare loop); :meth:`step` runs the same step and returns
        the loss as a tensor without waiting. Arguments and errors are :meth:`step`'s.

        >>> import torch
        >>> model = torch.nn.Linear(3, 1)
        >>> guard = TrainGuard(
        ...     torch.optim.SGD(model.parameters(), lr=0.1),
        ...     lambda b: torch.nn.functional.mse_loss(model(b[0]), b[1]),
        ... )
        >>> isinstance(guard((torch.ones(4, 3), torch.zeros(4, 1))), float)
        True
        """
        return math.fsum(float(t) for t in self._run(batch))

    def step(self, batch: Any) -> torch.Tensor:
        """Run one optimisation step over ``batch``; return the mean loss as a tensor.

        The same step as calling the guard, without reading the loss to the host: on a GPU
        the host goes on queueing the next step while the device works, as a bare loop
        that does not call ``loss.item()`` does.

        Args:
            batch: Tensors in dicts, lists, tuples, namedtuples or dataclasses, split along
                dim 0 when needed (non-tensor leaves are passed to every micro-batch).

        Returns:
            The batch's mean loss, detached: a 0-dim tensor on the loss's device when the
            batch ran whole, or a float64 CPU tensor when it ran in micro-batches (their
            losses were read as they finished).

        Raises:
            OutOfMemory: When even ``max_splits`` micro-batches (or micro-batches of one
                item) do not fit, or ``optimizer.step()`` runs out of memory and cannot be
                undone; on every rank at once under ``torch.distributed``.
            ConfigError: When the batch has no tensor to split, has 0 items or its tensors
                disagree on their batch size (checked before the step), or ``loss_fn`` does
                not return a one-element tensor that requires grad.
            MemfitError: Under ``torch.distributed``, when another rank stopped with an
                error that is not an out-of-memory (every rank stops together).

        Any error that is not an out-of-memory propagates with the gradients cleared; the
        parameters are as they were unless it came from inside an ``optimizer.step()``
        that had no snapshot (the error then carries a note saying so).
        """
        import torch

        losses = self._run(batch)
        if len(losses) == 1 and isinstance(losses[0], torch.Tensor):
            return losses[0]
        return torch.tensor(math.fsum(float(t) for t in losses), dtype=torch.float64)

    def run_unguarded(self, batch: Any) -> torch.Tensor:
        """One plain step, with no retry and no split: an out-of-memory propagates.

        For callers that must see the out-of-memory themselves (a batch-size finder's trial
        steps). The guard's state (splits, counts, events) is left alone.

        Returns:
            The batch's mean loss, detached.
        """
        self._zero_grad()
        try:
            loss = self.loss_fn(batch)
            objective = self.scaler.scale(loss) if self.scaler is not None else loss
            objective.backward()  # type: ignore[no-untyped-call]
            if self.scaler is not None:
                self.scaler.unscale_(self.optimizer)
            if self.before_step is not None:
                self.last_before_step = self.before_step(self.optimizer)
            self._step_optimizer()
            if self.scaler is not None:
                self.scaler.update()
        finally:
            self._zero_grad()
        return loss.detach()

    def _whole_batch_again(self, losses: list[Any]) -> bool:
        """Whether a step whose ``before_step`` (or unscale) ran out of memory can run its
        whole batch again exactly: it ran as one batch (the generators and buffers were
        captured at its start, not between micro-batches) on one process (other ranks
        would wait in their collectives)."""
        import torch

        return not self._ddp and len(losses) == 1 and isinstance(losses[0], torch.Tensor)

    def _run_whole_batch_again(
        self,
        batch: Any,
        n: int,
        params: list[Any],
        tried: list[str],
        message: str,
        stage: str | None,
    ) -> tuple[list[Any], str | None, str | None]:
        """Run the step's whole batch again after an out-of-memory in ``stage`` (what an
        out-of-memory in the forward pass gets first): the gradients are dropped, the
        generators and buffers (BatchNorm statistics) put back to the step's start, so the
        step stays exact. Splitting would not help: the gradients ``before_step`` reads are
        the same size whatever the micro-batches.

        Returns:
            The losses, and the out-of-memory message and stage if it failed again.
        """
        self._event(
            "oom",
            f"out of memory in {stage}; running the whole batch again",
            error=first_line(message),
        )
        tried.append("the whole batch again")
        self._zero_grad()
        self._drop_grads(params)
        self._reset_scaler_step()
        self._rewind()
        free_memory()
        losses, _, failure = self._backward_all(batch, n, params, tried)
        if failure is not None:
            return losses, failure[0], stage
        again, again_stage = self._before_optimizer_step()
        return losses, again, again_stage

    def _run(self, batch: Any) -> list[torch.Tensor | float]:
        """One step; the micro-batches' weighted losses (see :meth:`_backward_all`)."""
        # Checked before the step, so that a batch the ladder could not split fails at the
        # first step, not at the first out-of-memory hours later.
        n = batch_size(batch)
        if self.steps == 0 and self.count_fn is not None:
            self._count(batch)  # a count_fn that cannot count fails now, not at a split
        if n == 0:
            raise ConfigError(
                "the batch has 0 items: there is no mean loss to step with",
                key_path="batch",
                hint="skip empty batches (drop_last=True in the DataLoader)",
            )
        params = self._params()
        tried: list[str] = []
        for p in params:  # start from no gradient (cheaper than optimizer.zero_grad here)
            p.grad = None
        splits_before = self.splits
        try:
            losses, split, failure = self._backward_all(batch, n, params, tried)
        except BaseException:
            # Not an out-of-memory (loss_fn raised, a bad batch, an interrupt): leave no
            # partial gradient behind for an optimizer.step() the caller might still make, the
            # generators and buffers (BatchNorm statistics) as before the step, so that running
            # the batch again is the step without the fault, and no rank waiting.
            self._zero_grad()
            self._reset_scaler_step()
            self._abandon()
            distributed.try_abort(during_step=False)
            raise
        decision = distributed.agree(
            gave_up=failure is not None,
            splits=self.splits,
            split=split,
            snapshot=failure is None and self._snapshot_wanted(),
        )
        if decision.aborted:
            self._abandon()
            raise self._peer_stopped()
        if decision.gave_up:
            self._reset_scaler_step()
            self._ladder = ladder.after_give_up(self._ladder)
            message, smallest = failure or ("another rank ran out of memory", 0)
            raise self._give_up(message, tried, smallest)
        self.splits = decision.splits
        stage: str | None = None  # what ran out of memory before optimizer.step(), if any
        try:
            if self._ddp:
                distributed.average_gradients(params)
            failure_message, stage = self._before_optimizer_step()
            if failure_message is not None and self._whole_batch_again(losses):
                losses, failure_message, stage = self._run_whole_batch_again(
                    batch, n, params, tried, failure_message, stage
                )
            if failure_message is None:
                failure_message = self._optimizer_step(tried, decision.snapshot)
        except BaseException:
            self._zero_grad()
            self._reset_scaler_step()
            if self._journal is None or not self._journal.completed:
                self._abandon()  # the step did not happen (or was undone): nor did its forward
            distributed.try_abort(during_step=True)
            raise
        settled = distributed.settle(failed=failure_message is not None)
        if settled.aborted:
            # Another rank stopped inside its step (and undid it where it could): undo ours
            # too, so that every rank stops at the same step.
            undone = False
            if self.last_step_snapshotted and self._snapshot is not None:
                undone = (
                    self._retrying(
                        "restoring the optimizer snapshot", self._snapshot.restore, attempts=10
                    )
                    is None
                )
            elif self._journal is not None and failure_message is None:
                undone = self._journal.undo()
            if undone:
                self._abandon()
            error = self._peer_stopped()
            if not undone and self._journal is not None and self._journal.chunks > 1:
                _add_note(
                    error,
                    "memfit: this rank's optimizer step is complete (the step runs in "
                    f"{self._journal.chunks} chunks and is completed rather than undone, on "
                    "the rank that stopped too)",
                )
            elif not undone:
                _add_note(
                    error,
                    "memfit: this rank's optimizer step had no snapshot to undo "
                    "it, so it is one step ahead of the rank that stopped",
                )
            raise error
        if self._journal is not None:
            self._journal.release()
        if settled.failed and not settled.all_failed and settled.source is not None:
            # Some ranks could not step: they take the parameters and state of one that did.
            distributed.repair_optimizer(self.optimizer, settled.source)
            if failure_message is not None:
                self._event(
                    "restore",
                    f"optimizer.step() failed on this rank: parameters and state copied "
                    f"from rank {settled.source}",
                    source=settled.source,
                )
            failure_message = None
        elif settled.failed and failure_message is None:
            failure_message = "optimizer.step() ran out of memory on every other rank"
        if failure_message is not None and stage is not None:
            # optimizer.step() never ran: the step did not happen, nor did its forward (the
            # buffers and generators go back, so running the batch again is exact).
            self._reset_scaler_step()
            self._abandon()
            raise self._give_up(
                f"{stage} ran out of memory, also after running the whole batch again"
                + (f": {failure_message}" if failure_message.strip() else ""),
                tried,
                0,
            )
        if failure_message is not None:
            self._reset_scaler_step()
            self._ladder = ladder.after_give_up(self._ladder)
            if self._journal is not None:
                what = (
                    "retrying it from memfit's journal did not help ("
                    + self._journal.cost()
                    + "); "
                    + (self._divided or "the step was undone as a whole")
                )
            elif self._snapshot is None:
                what = "it could not be undone (snapshot_optimizer='never')"
            else:
                what = "restoring and retrying did not help"
            raise self._give_up(
                f"optimizer.step() ran out of memory and {what}: {failure_message}", tried, 0
            )
        if self.scaler is not None:
            scaler = self.scaler
            update_failure = self._retrying("GradScaler.update", scaler.update)
            if update_failure is not None:
                raise self._give_up(
                    f"GradScaler.update() ran out of memory: {update_failure}", tried, 0
                )
        self._zero_grad()
        if self.steps == 0:
            self._buffers.first_step_done()
        self.steps += 1
        # A step is clean when it did not have to split further: an out-of-memory that a
        # retry cured was transient and says nothing about the size that fits.
        grew = self._end_step(
            splits=decision.splits, split_further=decision.split, unit="micro-batch"
        )
        if not grew and self.splits != splits_before and not split:
            self._event(
                "split",
                f"following the other ranks: {self.splits} micro-batches",
                splits=self.splits,
            )
        # Read by the caller, last: everything of the step is queued on the device by then,
        # so waiting for the loss costs only the step's tail, not a stall in its middle.
        return losses

    def __repr__(self) -> str:
        return (
            f"TrainGuard(splits={self.splits}, steps={self.steps}, "
            f"events={len(self.events)}, max_splits={self.max_splits})"
        )
