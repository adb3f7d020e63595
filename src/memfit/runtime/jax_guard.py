"""TrainGuard for a jitted JAX step (public as ``memfit.jax.TrainGuard``).

JAX reports an out-of-memory as a runtime error whose message starts with
``RESOURCE_EXHAUSTED`` (when XLA cannot place the step's buffers, at compile or at run time).
JAX has no allocator cache to empty: the memory of a failed call is its live temporaries,
freed when nothing references them. So on ``RESOURCE_EXHAUSTED`` the guard clears the
exception's traceback frames and chained exceptions (which hold the failed call's arrays),
collects young garbage, and climbs the same ladder as the PyTorch guard
(:mod:`memfit.core.ladder`): retry (more often for a chunk size that ran before), then a
micro-batched step with more chunks, up to ``max_splits``, then
:class:`memfit.OutOfMemory`; after a give-up the next step starts from the last completed
step's chunk count.

The micro-batched step is one jitted function per split count: the batch (a pytree of arrays
whose leading dimension is the batch) is reshaped to ``(splits, n // splits, ...)`` and
``jax.lax.scan`` runs ``value_and_grad(loss_fn)`` chunk by chunk, adding each chunk's
gradient weighted by its share of the items (or of ``count_fn``), so the update uses the
full-batch gradient. Split counts are divisors of the batch size (the ladder moves to the
next divisor), so every chunk has the same shape and each split count compiles once.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

from memfit._checks import require_callable
from memfit._plain import plural
from memfit.core import ladder
from memfit.core.ladder import next_divisor
from memfit.errors import ConfigError, OutOfMemory
from memfit.runtime._guard_base import GuardBase
from memfit.runtime.events import EventSink
from memfit.runtime.oom import first_line, forget_exception, is_oom

__all__ = ["TrainGuard", "next_divisor"]

LossFn = Callable[[Any, Any], Any]
UpdateFn = Callable[[Any, Any, Any], tuple[Any, Any]]


def _jax_figures() -> tuple[str | None, int | None, int | None]:
    """The JAX GPU device's name, peak bytes in use and byte limit, ``None`` where unknown
    (read through :func:`memfit.backends.live.active_reader`)."""
    from memfit.backends.live import active_reader

    now = active_reader("auto").read()
    if now.source != "jax":
        return None, None, None
    return now.device, now.peak_allocated_bytes, now.budget_bytes


class TrainGuard(GuardBase):
    """Run jitted JAX training steps that survive ``RESOURCE_EXHAUSTED``.

    Args:
        loss_fn: ``loss_fn(params, batch) -> scalar``: the *mean* loss over the batch.
        update_fn: ``update_fn(params, opt_state, grads) -> (params, opt_state)``, e.g.
            ``optax``'s ``tx.update`` followed by ``optax.apply_updates``. Traced inside the
            step, so it must be jittable.
        count_fn: ``count_fn(batch) -> scalar``: what the mean is over (e.g. tokens);
            default: the leading dimension. Traced inside the step.
        max_splits: Most chunks per step before giving up.
        on_event: Called with every :class:`~memfit.runtime.events.MemoryEvent`.
        grow_back_after: Clean steps after which the number of chunks is halved again.

    Raises:
        ConfigError: When ``max_splits`` or ``grow_back_after`` is not a positive integer,
            or ``loss_fn``, ``update_fn`` or ``count_fn`` is not callable.

    Attributes:
        splits: Chunks per step now.
        events: What happened, in order.
        steps: Steps completed.
        traces: How many times the step was traced (compiled), by split count.
    """

    source = "memfit.jax.TrainGuard"

    def __init__(
        self,
        loss_fn: LossFn,
        update_fn: UpdateFn,
        *,
        count_fn: Callable[[Any], Any] | None = None,
        max_splits: int = 64,
        on_event: EventSink | None = None,
        grow_back_after: int = 50,
    ) -> None:
        for name, fn, optional in (
            ("loss_fn", loss_fn, False),
            ("update_fn", update_fn, False),
            ("count_fn", count_fn, True),
            ("on_event", on_event, True),
        ):
            require_callable(
                name,
                fn,
                optional=optional,
                hint="loss_fn(params, batch) -> scalar; "
                "update_fn(params, opt_state, grads) -> (params, opt_state)",
            )
        self.loss_fn = loss_fn
        self.update_fn = update_fn
        self.count_fn = count_fn
        self._start_ladder(
            max_splits=max_splits, grow_back_after=grow_back_after, divisors=True, on_event=on_event
        )
        self.steps = 0
        self.traces: dict[int, int] = {}
        self._compiled: dict[int, Callable[[Any, Any, Any], tuple[Any, Any, Any]]] = {}

    def _event(self, kind: str, message: str, **data: Any) -> None:
        self._record(kind, message, self.steps, dict(data))

    def step_fn(self, splits: int) -> Callable[[Any, Any, Any], tuple[Any, Any, Any]]:
        """The jitted step for ``splits`` chunks (built and cached on first use).

        Args:
            splits: Chunks per step; must divide the batch size of the batches it gets.

        Returns:
            ``step(params, opt_state, batch) -> (params, opt_state, loss)``.
        """
        cached = self._compiled.get(splits)
        if cached is not None:
            return cached
        import jax
        import jax.numpy as jnp

        loss_fn, update_fn, count_fn = self.loss_fn, self.update_fn, self.count_fn
        value_and_grad = jax.value_and_grad(loss_fn)

        def step(params: Any, opt_state: Any, batch: Any) -> tuple[Any, Any, Any]:
            self.traces[splits] = self.traces.get(splits, 0) + 1  # runs once per trace
            if splits == 1:
                loss, grads = value_and_grad(params, batch)
            else:
                n = jax.tree_util.tree_leaves(batch)[0].shape[0]
                chunks = jax.tree_util.tree_map(
                    lambda x: x.reshape((splits, n // splits, *x.shape[1:])), batch
                )
                total = count_fn(batch) if count_fn is not None else n

                def body(carry: Any, chunk: Any) -> tuple[Any, None]:
                    grad_acc, loss_acc = carry
                    chunk_loss, chunk_grads = value_and_grad(params, chunk)
                    count = count_fn(chunk) if count_fn is not None else n // splits
                    weight = count / total
                    grad_acc = jax.tree_util.tree_map(
                        lambda a, g: a + weight * g, grad_acc, chunk_grads
                    )
                    return (grad_acc, loss_acc + weight * chunk_loss), None

                zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
                init = (zeros, jnp.zeros((), dtype=jnp.result_type(float)))
                (grads, loss), _ = jax.lax.scan(body, init, chunks)
            params, opt_state = update_fn(params, opt_state, grads)
            return params, opt_state, loss

        compiled: Callable[[Any, Any, Any], tuple[Any, Any, Any]] = jax.jit(step)
        self._compiled[splits] = compiled
        return compiled

    def __call__(self, params: Any, opt_state: Any, batch: Any) -> tuple[Any, Any, float]:
        """One step: ``(params, opt_state, batch) -> (params, opt_state, loss)``.

        Args:
            params: The parameters (a pytree of arrays).
            opt_state: The optimizer state.
            batch: A pytree of arrays sharing their leading (batch) dimension.

        Returns:
            New parameters, new optimizer state, and the batch's mean loss.

        Raises:
            OutOfMemory: When ``max_splits`` chunks (or chunks of one item) still exhaust
                the device.
            ConfigError: When the batch has no array or 0 items, its arrays disagree on
                the leading dimension, or ``loss_fn`` does not return a scalar.
        """
        import jax

        leaves = jax.tree_util.tree_leaves(batch)
        sizes = {int(x.shape[0]) for x in leaves if getattr(x, "ndim", 0) >= 1}
        if len(sizes) != 1:
            raise ConfigError(
                "the batch's arrays must share one leading dimension, found "
                f"{sorted(sizes) or 'none'}",
                key_path="batch",
            )
        n = sizes.pop()
        if n == 0:
            raise ConfigError(
                "the batch has 0 items: there is no mean loss to step with",
                key_path="batch",
                hint="skip empty batches",
            )
        config = self._config
        splits = ladder.first_splits(config, self._ladder, n)
        first = splits
        tried: list[str] = []
        failures = 0
        split_here = False
        while True:
            message: str | None = None
            try:
                new_params, new_state, loss = self.step_fn(splits)(params, opt_state, batch)
                loss_value = float(loss)
            except Exception as exc:
                if isinstance(exc, TypeError) and "scalar-output" in str(exc):
                    raise ConfigError(
                        f"loss_fn must return the mean loss as a scalar: {exc}",
                        key_path="loss_fn",
                        hint="return jnp.mean(per_item_losses), not the per-item losses",
                    ) from exc
                if not is_oom(exc):
                    raise
                message = forget_exception(exc)
            if message is None:
                self._ladder = ladder.on_fit(self._ladder, n // splits, failures)
                break
            gc.collect(1)  # out of the except block: the failed call's arrays can go
            failures += 1
            action = self._next_rung(
                tried,
                "RESOURCE_EXHAUSTED in the jitted step",
                error=first_line(message),
                n=n,
                splits=splits,
                size=n // splits,
                failures=failures,
                split_here=split_here,
                unit="chunk",
                split_message="micro-batched step with {splits} chunks",
            )
            if isinstance(action, ladder.Split):
                splits = action.splits
                failures = 0
                split_here = True
            elif isinstance(action, ladder.GiveUp):
                self._gave_up(tried, splits=splits)
                device, peak, limit = _jax_figures()
                raise OutOfMemory(
                    f"RESOURCE_EXHAUSTED at step {self.steps} even after {', '.join(tried)}: "
                    f"{first_line(message)}",
                    device=device,
                    peak_bytes=peak,
                    budget_bytes=limit,
                    tried=tried,
                    hint=f"a chunk of {plural(n // splits, 'item')} does not fit: shrink the "
                    "model or the item, raise max_splits, or use a device with more memory",
                )
        self.steps += 1
        self._end_step(splits=splits, split_further=splits > first, unit="chunk")
        return new_params, new_state, loss_value
