"""TrainGuard: optimisation steps that survive out-of-memory without changing the result.

See :mod:`memfit.runtime.guard` for the whole story; this module holds the class.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

from memfit._checks import require, require_callable, require_iterable, require_positive_int
from memfit._plain import plural
from memfit.core import ladder
from memfit.errors import ConfigError, MemfitError, OutOfMemory
from memfit.runtime import _distributed as distributed
from memfit.runtime._batching import batch_size, chunk_bounds, split_batch
from memfit.runtime._guard_base import GuardBase
from memfit.runtime._journal import StepFailed, StepJournal, add_note
from memfit.runtime._memory import (
    device_name,
    free_memory,
    memory_figures,
    out_of_memory,
)
from memfit.runtime._rewind import SPLIT_STATS, BufferState, modules_of
from memfit.runtime._rewind import rng_state as _rng_state
from memfit.runtime._snapshot import (
    OptimizerSnapshot,
    step_fingerprint,
    undo_if_untouched,
    versions_trustworthy,
)
from memfit.runtime.events import EventSink
from memfit.runtime.oom import first_line, forget_exception, is_oom, no_alloc_section

if TYPE_CHECKING:
    import torch

__all__ = ["TrainGuard", "clip_grad_norm"]

BeforeStep = Callable[[Any], Any]


def clip_grad_norm(
    max_norm: float, norm_type: float = 2.0, *, error_if_nonfinite: bool = False
) -> BeforeStep:
    """A ``before_step`` hook that clips the gradients' total norm, as
    ``torch.nn.utils.clip_grad_norm_`` does.

    It computes the norm and the clipping factor first (the only allocations) and scales the
    gradients in place last, so an out-of-memory can only strike before any gradient
    changed and TrainGuard can run it again. With a ``GradScaler`` it sees the gradients
    after ``unscale_``, as the AMP recipe wants.

    Args:
        max_norm: The largest total norm allowed.
        norm_type: The norm's order (``2.0``, ``float("inf")``, ...).
        error_if_nonfinite: Raise when the total norm is NaN or infinite.

    Returns:
        ``hook(optimizer) -> total_norm``: pass it as ``TrainGuard(..., before_step=...)``;
        the guard keeps its last result in ``guard.last_before_step``.

    Raises:
        ConfigError: When ``max_norm`` is not a positive number.
    """
    require("norm_type", norm_type, "number")
    require("error_if_nonfinite", error_if_nonfinite, "bool")
    if isinstance(max_norm, bool) or not isinstance(max_norm, (int, float)) or not max_norm > 0:
        raise ConfigError(f"max_norm must be a number > 0, not {max_norm!r}", key_path="max_norm")

    def hook(optimizer: Any) -> Any:
        import torch

        grads = [
            p.grad
            for group in optimizer.param_groups
            for p in group["params"]
            if p.grad is not None
        ]
        if not grads:
            return torch.tensor(0.0)
        total = torch.nn.utils.get_total_norm(
            grads, norm_type, error_if_nonfinite=error_if_nonfinite
        )
        factor = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        by_device: dict[Any, list[torch.Tensor]] = {}
        for g in grads:
            by_device.setdefault(g.device, []).append(g)
        factors = {device: factor.to(device) for device in by_device}
        with torch.no_grad(), no_alloc_section():
            for device, group in by_device.items():
                torch._foreach_mul_(group, factors[device])
        return total

    hook.__name__ = hook.__qualname__ = f"clip_grad_norm({max_norm})"
    return hook


_add_note = add_note


class TrainGuard(GuardBase):
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
            propagates with a note saying which. ``"always"``/``True``: a copy of
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
        if model is not None and not isinstance(model, torch.nn.Module):
            raise ConfigError(
                f"model must be a torch.nn.Module or None, not {type(model).__name__}",
                key_path="model",
            )
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
        self._journal = StepJournal(optimizer, self.journal_bytes) if policy == "auto" else None
        self._divided: str | None = None  # a journalled step that gave up divided
        self._rng = _rng_state(restore_rng, rngs)
        watched = [model] if model is not None else modules_of(loss_fn)
        self._buffers = BufferState(watched, split_stats)

    @property
    def journal_held_bytes(self) -> int:
        """Memory the ``"auto"`` journal holds now (0 under the other policies): its copy of
        the chunk of parameters and optimizer state being stepped, on their device. On CUDA
        or a simulated GPU it is given back after every step; in host memory it is kept."""
        return self._journal.held_bytes if self._journal is not None else 0

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

    def _count(self, batch: Any) -> float:
        if self.count_fn is None:
            return float(batch_size(batch))
        count = float(self.count_fn(batch))
        if not math.isfinite(count) or count < 0:
            raise ConfigError(
                f"count_fn returned {count!r}; it must be a finite count >= 0",
                key_path="count_fn",
            )
        return count

    def _micro_step(
        self, chunk: Any, weight: float, params: list[torch.nn.Parameter], first: bool
    ) -> torch.Tensor:
        """Forward and backward of one micro-batch; add its gradient only if all succeeded.

        ``first``: no gradient has been accumulated in this step yet (every ``.grad`` is
        ``None``). Then ``backward()`` writes the gradients directly, in C++, as a bare loop
        does; an out-of-memory in it leaves a partial gradient that the caller drops
        (:meth:`_drop_grads`). Later micro-batches compute theirs with ``autograd.grad`` and
        add them in one operation, the last of the micro-step: every allocation of the
        micro-step comes before it, so an out-of-memory can never strike after a gradient
        was added (and the micro-batch be added twice when it is run again).

        Returns:
            The micro-batch's weighted loss, a detached tensor (read after the step is
            launched, so the device is not waited for in the middle of the step).
        """
        import torch

        sync: AbstractContextManager[Any] = (
            self.model.no_sync() if self._ddp and self.model is not None else nullcontext()  # type: ignore[operator]
        )
        with sync:
            loss = self.loss_fn(chunk)
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                got = (
                    f"a tensor of shape {tuple(loss.shape)}"
                    if isinstance(loss, torch.Tensor)
                    else f"a {type(loss).__name__}"
                )
                raise ConfigError(
                    f"loss_fn must return the mean loss as a one-element tensor, got {got}",
                    key_path="loss_fn",
                    hint="return loss.mean() (a tensor that requires grad), not loss.item() "
                    "or per-item losses",
                )
            if not loss.requires_grad:
                raise ConfigError(
                    "loss_fn returned a tensor that does not require grad, so there is "
                    "no gradient to step with",
                    key_path="loss_fn",
                    hint="compute the loss from the model's output, outside torch.no_grad()",
                )
            weighted = loss.detach() if weight == 1.0 else loss.detach() * weight
            objective = loss if weight == 1.0 else loss * weight
            if self.scaler is not None:
                objective = self.scaler.scale(objective)
            if objective.dim():
                objective = objective.reshape(())
            if first:
                # Plain backward(), as a bare loop: restricting it with inputs=params makes
                # the engine walk the graph for them first (about 1% of a 5 ms CPU step).
                objective.backward()  # type: ignore[no-untyped-call]
                return weighted
            grads = torch.autograd.grad(objective, params, allow_unused=True)
        # Add to the accumulated gradient in one in-place operation, then fill the empty
        # ones: nothing below allocates, so the micro-batch is added whole or not at all.
        acc_dst: list[torch.Tensor] = []
        acc_src: list[torch.Tensor] = []
        fresh: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
        for p, g in zip(params, grads, strict=True):
            if g is None:
                continue
            if p.grad is None:
                fresh.append((p, g))
            else:
                acc_dst.append(p.grad)
                acc_src.append(g)
        if acc_dst:
            torch._foreach_add_(acc_dst, acc_src)
        for p, g in fresh:
            p.grad = g
        return weighted

    @staticmethod
    def _drop_grads(params: list[torch.nn.Parameter]) -> None:
        """Forget every gradient (a first micro-batch's backward that ran out of memory)."""
        for p in params:
            p.grad = None

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
            ),
        )

    def _backward_all(
        self, batch: Any, n: int, params: list[torch.nn.Parameter], tried: list[str]
    ) -> tuple[list[torch.Tensor | float], bool, tuple[str, int] | None]:
        """All micro-batches of a step.

        Returns:
            The micro-batches' weighted losses (a detached tensor for a whole batch, read
            at the end of the step; numbers for micro-batches), whether the batch had to
            be split further, and when the ladder gave up, the failure message and the
            size of the micro-batch that failed last.
        """
        if ladder.first_splits(self._config, self._ladder, n) == 1:
            # The common case: the whole batch at once, without walking the batch first.
            self._capture()
            message: str | None = None
            try:
                loss = self._micro_step(batch, 1.0, params, True)
            except Exception as exc:
                if not is_oom(exc):
                    raise
                message = forget_exception(exc)
            if message is None:
                self._ladder = ladder.on_fit(self._ladder, n)
                return [loss], False, None
            self._drop_grads(params)
            return self._climb(batch, n, params, tried, message)
        self._capture()
        return self._climb(batch, n, params, tried, None)

    def _climb(
        self,
        batch: Any,
        n: int,
        params: list[torch.nn.Parameter],
        tried: list[str],
        first_failure: str | None,
    ) -> tuple[list[torch.Tensor | float], bool, tuple[str, int] | None]:
        """Micro-batches from the ladder's split count on, climbing on each out-of-memory.

        ``first_failure`` is the message of a whole-batch attempt that already failed; the
        generators and buffers were captured before the first attempt either way.
        """
        config = self._config
        total = self._count(batch)
        splits = ladder.first_splits(config, self._ladder, n)
        first_splits = splits
        done = 0
        failures = 0
        split_here = False
        losses: list[torch.Tensor | float] = []
        pending = first_failure
        policy = self.split_stats
        while done < n:
            start, stop = chunk_bounds(n, done, splits)
            size = stop - start
            whole = start == 0 and stop == n
            message: str | None = pending
            weight = 1.0
            if pending is None:
                try:
                    chunk = batch if whole else split_batch(batch, start, stop)
                    weight = (
                        1.0
                        if whole or self.reduction == "sum"
                        else (self._count(chunk) / total if total else 0.0)
                    )
                    # Read now (the split path is the slow path anyway), so that only the
                    # gradients of the micro-batches that succeeded stay on the device.
                    losses.append(float(self._micro_step(chunk, weight, params, done == 0)))
                except Exception as exc:
                    if not is_oom(exc):
                        raise
                    message = forget_exception(exc)
                chunk = None
                if message is not None and done == 0:
                    self._drop_grads(params)
            pending = None
            if message is None:
                self._ladder = ladder.on_fit(self._ladder, size, failures)
                failures = 0
                split_here = False
                done = stop
                if not whole and self._buffers.active:
                    if policy == "average":
                        self._buffers.add_to_average(size / n)
                        self._buffers.restore()  # the next micro-batch starts from the same
                    elif policy == "first" and start != 0:
                        self._buffers.restore()
                if done < n:
                    # Where the next micro-batch starts: its retry comes back here.
                    self._capture(buffers=policy == "each" or (policy == "first" and start == 0))
                continue
            # Out of the except block: the failed attempt's tensors can go now.
            free_memory()
            failures += 1
            self._rewind()
            action = self._next_rung(
                tried,
                f"out of memory in micro-batch [{start}:{stop}) of {n} items",
                error=first_line(message),
                start=start,
                stop=stop,
                n=n,
                splits=splits,
                size=size,
                failures=failures,
                split_here=split_here,
                unit="micro-batch",
                split_message="splitting the batch into {splits} micro-batches "
                f"({n - done} items left; their losses "
                + (
                    "added: reduction='sum')"
                    if self.reduction == "sum"
                    else "weighted as means: reduction='mean', pass reduction='sum' if "
                    "loss_fn returns a sum)"
                ),
            )
            if isinstance(action, ladder.Split):
                splits = action.splits
                failures = 0
                split_here = True
            elif isinstance(action, ladder.GiveUp):
                self._buffers.discard_average()
                self._ladder = self._ladder._replace(splits=splits)
                return losses, splits > first_splits, (message, action.smallest)
        if splits > 1 and policy == "average" and self._buffers.active:
            self._buffers.commit_average()
        self._ladder = self._ladder._replace(splits=splits)
        return losses, splits > first_splits, None

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

    def _reset_scaler_step(self) -> None:
        if self.scaler is None:
            return
        from torch.amp.grad_scaler import _refresh_per_optimizer_state

        self.scaler._per_optimizer_states[id(self.optimizer)] = _refresh_per_optimizer_state()

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
        try:
            if self._ddp:
                distributed.average_gradients(params)
            failure_message = self._unscale() or self._run_before_step()
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
        if failure_message is not None:
            self._reset_scaler_step()
            self._ladder = ladder.after_give_up(self._ladder)
            if self._journal is not None:
                what = "retrying it from memfit's journal did not help; " + (
                    self._divided or "the step was undone as a whole"
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
