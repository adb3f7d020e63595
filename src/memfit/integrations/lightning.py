"""Lightning: a callback that records memory, sets the batch size, and guards OOM.

* :func:`MemfitCallback` returns a ``lightning.pytorch.Callback`` that records memory after
  every training batch with a :class:`memfit.Recorder`, and, when given ``batch_size`` (a
  number, or a function of the module such as one built on :func:`batch_size_from_estimate`
  over a :func:`memfit.estimate_torch` trace), sets the module's (or datamodule's)
  ``batch_size`` attribute before the dataloaders are built, the way Lightning's own
  ``BatchSizeFinder`` does (``lightning_setattr``), without running trial steps.
* :func:`guard` gives a LightningModule that uses manual optimisation
  (``self.automatic_optimization = False``) a :class:`memfit.TrainGuard` over its optimiser:
  an out-of-memory step is redone in micro-batches with the full-batch gradient. Under DDP the
  guard gets the strategy's wrapped model, so it runs backward under ``no_sync()``,
  averages the gradients once, and every rank takes the same split decision (one small
  all-reduce per step): no rank is left waiting in a collective.

How the guard lives with the rest of Lightning:

* **BatchSizeFinder** (``Trainer(callbacks=[BatchSizeFinder()])`` or ``Tuner``): its trial
  steps run *unguarded* (:meth:`memfit.TrainGuard.run_unguarded`), so the finder sees every
  out-of-memory it is looking for, instead of a guard that hides it by splitting (the finder
  would then pick a batch that only runs split). The guard's split count and events are left
  as they were, and its events go to the :func:`MemfitCallback` recorder that is attached
  when they happen (the finder detaches all callbacks during its trials).
* **Gradient accumulation**: Lightning refuses ``Trainer(accumulate_grad_batches=k)`` with
  manual optimisation. Pass ``accumulate=k`` to :func:`guard` instead: it collects ``k``
  batches and takes one guarded step over all their items (split into micro-batches only
  when they do not fit), at the ``k``-th batch and at the last batch of an epoch.
* **Gradient clipping**: Lightning refuses ``gradient_clip_val`` with manual optimisation;
  pass ``before_step=memfit.clip_grad_norm(max_norm)`` to :func:`guard`.

Lightning is imported when a callback or guard is made, not when this module is imported.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from memfit._checks import require as require_arg
from memfit._checks import require_callable, require_instance, require_object, require_positive_int
from memfit._lazy import require
from memfit.errors import ConfigError
from memfit.integrations._batch import (
    batch_size_from_estimate,
    keep_effective_batch,
    require_recorder,
)

__all__ = [
    "LightningGuard",
    "MemfitCallback",
    "batch_size_from_estimate",
    "callback_class",
    "guard",
    "in_batch_size_trial",
    "keep_effective_batch",
]

_GUARD_ATTR = "_memfit_guard"


def _require_module(pl_module: Any) -> None:
    require_object(
        "pl_module",
        pl_module,
        methods=("optimizers", "parameters"),
        what="a lightning.pytorch.LightningModule",
        hint="call it in training_step as guard(self, self.loss)",
    )


@functools.cache
def callback_class() -> type[Any]:
    """The callback class, built on ``lightning.pytorch.Callback`` on first use.

    Raises:
        BackendUnavailable: When lightning is not installed.
    """
    pl = require("lightning.pytorch")
    parsing = require("lightning.pytorch.utilities.parsing")

    class _MemfitCallback(pl.Callback):  # type: ignore[misc, name-defined]
        def __init__(
            self,
            recorder: Any | None,
            batch_size: int | Callable[[Any], int] | None,
            attribute: str,
            log_metrics: bool = False,
        ) -> None:
            super().__init__()
            self.recorder = recorder
            self.batch_size = batch_size
            self.attribute = attribute
            self.log_metrics = log_metrics
            self.chosen_batch_size: int | None = None

        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            if stage != "fit" or self.batch_size is None:
                return
            value = self.batch_size(pl_module) if callable(self.batch_size) else self.batch_size
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(
                    f"batch_size must be a positive integer, not {value!r}",
                    key_path="MemfitCallback.batch_size",
                )
            if not parsing.lightning_hasattr(pl_module, self.attribute):
                raise ConfigError(
                    f"neither the module nor its datamodule has {self.attribute!r}",
                    key_path="MemfitCallback.attribute",
                    hint="store the batch size as self.batch_size (or in hparams) and read it "
                    "in train_dataloader()",
                )
            parsing.lightning_setattr(pl_module, self.attribute, value)
            self.chosen_batch_size = value

        def on_train_batch_end(
            self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
        ) -> None:
            if self.recorder is not None:
                step = int(trainer.global_step)
                sample = self.recorder.step(step)
                if sample is not None and self.log_metrics:
                    from memfit.monitor.sinks import scalars_of

                    # as Lightning's DeviceStatsMonitor: through every logger of the trainer
                    scalars = scalars_of(sample)
                    if scalars:
                        for logger in trainer.loggers:
                            logger.log_metrics(scalars, step=step)

        def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
            if self.recorder is not None:
                from memfit.runtime.oom import is_oom

                if is_oom(exception):
                    self.recorder.on_oom(exception)

        def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
            if self.recorder is not None and stage == "fit":
                self.recorder.close()

    _MemfitCallback.__name__ = _MemfitCallback.__qualname__ = "MemfitCallback"
    return _MemfitCallback


def MemfitCallback(
    recorder: Any | None = None,
    *,
    batch_size: int | Callable[[Any], int] | None = None,
    attribute: str = "batch_size",
    log_metrics: bool = False,
) -> Any:
    """A Lightning callback that records memory per batch and can set the batch size.

    Args:
        recorder: A :class:`memfit.Recorder` (closed at the end of ``fit``); ``None``: none.
        batch_size: A batch size, or ``fn(pl_module) -> int`` called at ``setup("fit")``.
        attribute: The attribute that holds the batch size (on the module, its ``hparams``
            or its datamodule).
        log_metrics: Also log each sample through the Trainer's loggers
            (``logger.log_metrics``, as Lightning's ``DeviceStatsMonitor`` does):
            ``memory/allocated_mib``, ``memory/reserved_mib``, ... at the global step
            (:func:`memfit.monitor.sinks.scalars_of`).

    Returns:
        The callback (pass it in ``Trainer(callbacks=[...])``).

    Raises:
        BackendUnavailable: When lightning is not installed.
        ConfigError: When an argument is of the wrong type.
    """
    require_recorder(recorder)
    if batch_size is not None and not callable(batch_size):
        require_positive_int("batch_size", batch_size, hint="a batch size, or fn(pl_module)")
    require_arg("attribute", attribute, "str")
    require_arg("log_metrics", log_metrics, "bool")
    return callback_class()(recorder, batch_size, attribute, log_metrics)


@functools.cache
def _trial_code() -> Any:
    """The code object of Lightning's batch-size search (its trials run inside it)."""
    scaling = require("lightning.pytorch.tuner.batch_size_scaling")
    return scaling._scale_batch_size.__code__


def in_batch_size_trial(trainer: Any) -> bool:
    """Whether ``trainer`` is running a trial step of Lightning's batch-size finder.

    The finder detaches every callback for its trials and runs them inside
    ``lightning.pytorch.tuner.batch_size_scaling._scale_batch_size``; the (cheap) first test
    is the empty callback list, the second looks for that function on the call stack.
    """
    if getattr(trainer, "callbacks", None):
        return False
    code = _trial_code()
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


class LightningGuard:
    """The guard :func:`guard` returns: a :class:`memfit.TrainGuard` that knows Lightning.

    Calling it runs one guarded step (or, with ``accumulate`` > 1, collects the batch and
    steps over every ``accumulate`` batches); during a batch-size finder's trials it runs
    the step unguarded. Other attributes (``splits``, ``events``, ``steps``...) are the
    TrainGuard's.
    """

    def __init__(self, pl_module: Any, train_guard: Any, accumulate: int) -> None:
        _require_module(pl_module)
        from memfit.runtime.guard import TrainGuard

        require_instance("train_guard", train_guard, TrainGuard, what="a memfit.TrainGuard")
        require_positive_int("accumulate", accumulate)
        self.pl_module = pl_module
        self.train_guard = train_guard
        self.accumulate = accumulate
        self.pending: list[Any] = []
        self.trial_steps = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["train_guard"], name)

    def __call__(self, batch: Any) -> Any:
        """One step over ``batch`` (or over the batches collected so far).

        Returns:
            The mean loss (a float) when a step ran; ``None`` for a batch that was only
            collected for a later step.
        """
        from memfit.runtime._batching import concat

        trainer = self.pl_module.trainer
        if in_batch_size_trial(trainer):
            self.trial_steps += 1
            return float(self.train_guard.run_unguarded(batch))
        if self.accumulate == 1:
            return self.train_guard(batch)
        self.pending.append(batch)
        if len(self.pending) < self.accumulate and not getattr(trainer, "is_last_batch", False):
            return None
        batches, self.pending = self.pending, []
        return self.train_guard(batches[0] if len(batches) == 1 else concat(batches, 0))


def _recorder_sink(pl_module: Any) -> Any:
    """An event sink that finds the attached :func:`MemfitCallback` recorder when called."""

    def sink(event: Any) -> None:
        trainer = getattr(pl_module, "_trainer", None) or pl_module.trainer
        for cb in getattr(trainer, "callbacks", ()):
            if isinstance(cb, callback_class()) and cb.recorder is not None:
                cb.recorder.on_event(event)
                return

    return sink


def guard(
    pl_module: Any,
    loss_fn: Callable[[Any], Any],
    *,
    count_fn: Callable[[Any], float] | None = None,
    max_splits: int = 64,
    on_event: Any | None = None,
    accumulate: int = 1,
    before_step: Callable[[Any], Any] | None = None,
    **guard_options: Any,
) -> LightningGuard:
    """The guard of a manually optimised LightningModule (made once, then the same object).

    Call it in ``training_step``: ``loss = memfit_lightning.guard(self, self.loss)(batch)``.
    It does forward, backward, ``optimizer.step()`` and ``zero_grad`` itself (micro-batched
    when memory runs out), so the step must not call ``manual_backward`` too.

    Args:
        pl_module: The LightningModule, attached to a trainer, with
            ``automatic_optimization = False``.
        loss_fn: ``loss_fn(batch) -> mean loss over the batch's items``.
        count_fn: What the mean is over (tokens, valid items), per batch.
        max_splits: Most micro-batches per step.
        on_event: Where guard events go; default: the recorder of the
            :func:`MemfitCallback` attached when the event happens.
        accumulate: Batches per optimizer step (what ``accumulate_grad_batches`` does for
            automatic optimisation); the step's loss is the mean over all their items.
        before_step: ``before_step(optimizer)`` between the gradient and the step, e.g.
            ``memfit.clip_grad_norm(1.0)`` (Lightning's ``gradient_clip_val`` is refused
            with manual optimisation).
        **guard_options: More :class:`memfit.TrainGuard` options (``split_stats``,
            ``snapshot_optimizer``, ``grow_back_after``...).

    Returns:
        The :class:`LightningGuard` (the same object on every call for this module).

    Raises:
        ConfigError: When the module uses automatic optimisation, has several optimisers,
            or ``accumulate`` is not a positive integer.
        BackendUnavailable: When lightning is not installed.
    """
    _require_module(pl_module)
    existing = getattr(pl_module, _GUARD_ATTR, None)
    if existing is not None:
        return existing  # type: ignore[no-any-return]
    require("lightning.pytorch")
    from memfit.runtime.guard import TrainGuard

    require_callable("loss_fn", loss_fn, hint="loss_fn(batch) returns the mean loss")
    require_callable("count_fn", count_fn, optional=True)
    require_positive_int("max_splits", max_splits)
    require_callable("on_event", on_event, optional=True)
    require_callable("before_step", before_step, optional=True)
    require_positive_int(
        "accumulate", accumulate, hint="batches per optimizer step, as accumulate_grad_batches"
    )
    if getattr(pl_module, "automatic_optimization", True):
        raise ConfigError(
            "memfit's guard drives the optimiser itself: it needs manual optimisation",
            key_path="automatic_optimization",
            hint="set self.automatic_optimization = False in the module's __init__",
        )
    optimizers = pl_module.optimizers()
    if isinstance(optimizers, list):
        if len(optimizers) != 1:
            raise ConfigError(
                f"guard drives one optimiser, the module has {len(optimizers)}",
                key_path="configure_optimizers",
            )
        optimizers = optimizers[0]
    # The LightningOptimizer itself: its step() goes through the strategy (precision plugin,
    # global_step); it shares param_groups and state with the wrapped optimiser.
    optimizer = optimizers
    trainer = pl_module.trainer
    model = getattr(trainer.strategy, "model", None)
    wrapped = model if model is not None and model is not pl_module else None
    made = TrainGuard(
        optimizer,
        loss_fn,
        model=wrapped if wrapped is not None else pl_module,
        count_fn=count_fn,
        max_splits=max_splits,
        on_event=on_event if on_event is not None else _recorder_sink(pl_module),
        before_step=before_step,
        **guard_options,
    )
    lightning_guard = LightningGuard(pl_module, made, accumulate)
    object.__setattr__(pl_module, _GUARD_ATTR, lightning_guard)
    return lightning_guard
