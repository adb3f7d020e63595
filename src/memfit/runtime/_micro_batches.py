"""The micro-batches of a TrainGuard step: forward and backward, split on out-of-memory.

The gradient stays the whole batch's: each micro-batch's loss is weighted by its share of
the items, and its gradient is added to ``.grad`` by the micro-step's last operation, so an
out-of-memory anywhere in it leaves no partial gradient (see :mod:`memfit.runtime.guard`).
"""

from __future__ import annotations

import math
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

from memfit.core import ladder
from memfit.errors import ConfigError
from memfit.runtime._batching import batch_size, chunk_bounds, split_batch
from memfit.runtime._memory import free_memory
from memfit.runtime._train_parts import TrainParts
from memfit.runtime.oom import first_line, forget_exception, is_oom

if TYPE_CHECKING:
    import torch

__all__ = ["MicroBatches"]


class MicroBatches(TrainParts):
    """Forward and backward of a step's micro-batches, climbing the ladder on each
    out-of-memory."""

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
