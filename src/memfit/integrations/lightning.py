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

Lightning is imported when a callback or guard is made, not when this module is imported.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from memfit.errors import ConfigError
from memfit.integrations._batch import batch_size_from_estimate, keep_effective_batch
from memfit.integrations._lazy import require

__all__ = [
    "MemfitCallback",
    "batch_size_from_estimate",
    "callback_class",
    "guard",
    "keep_effective_batch",
]

_GUARD_ATTR = "_memfit_guard"


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
        ) -> None:
            super().__init__()
            self.recorder = recorder
            self.batch_size = batch_size
            self.attribute = attribute
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
                self.recorder.step(int(trainer.global_step))

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
) -> Any:
    """A Lightning callback that records memory per batch and can set the batch size.

    Args:
        recorder: A :class:`memfit.Recorder` (closed at the end of ``fit``); ``None``: none.
        batch_size: A batch size, or ``fn(pl_module) -> int`` called at ``setup("fit")``.
        attribute: The attribute that holds the batch size (on the module, its ``hparams``
            or its datamodule).

    Returns:
        The callback (pass it in ``Trainer(callbacks=[...])``).

    Raises:
        BackendUnavailable: When lightning is not installed.
    """
    return callback_class()(recorder, batch_size, attribute)


def guard(
    pl_module: Any,
    loss_fn: Callable[[Any], Any],
    *,
    count_fn: Callable[[Any], float] | None = None,
    max_splits: int = 64,
    on_event: Any | None = None,
) -> Any:
    """The :class:`memfit.TrainGuard` of a manually optimised LightningModule (made once).

    Call it in ``training_step``: ``loss = memfit_lightning.guard(self, self.loss)(batch)``.
    It does forward, backward, ``optimizer.step()`` and ``zero_grad`` itself (micro-batched
    when memory runs out), so the step must not call ``manual_backward`` too.

    Args:
        pl_module: The LightningModule, attached to a trainer, with
            ``automatic_optimization = False``.
        loss_fn: ``loss_fn(batch) -> mean loss over the batch's items``.
        count_fn: What the mean is over (tokens, valid items), per batch.
        max_splits: Most micro-batches per step.
        on_event: Where guard events go; default: the :func:`MemfitCallback` recorder's.

    Returns:
        The guard (the same object on every call for this module).

    Raises:
        ConfigError: When the module uses automatic optimisation or has several optimisers.
        BackendUnavailable: When lightning is not installed.
    """
    existing = getattr(pl_module, _GUARD_ATTR, None)
    if existing is not None:
        return existing
    require("lightning.pytorch")
    from memfit.runtime.guard import TrainGuard

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
    if on_event is None:
        for cb in trainer.callbacks:
            if isinstance(cb, callback_class()) and cb.recorder is not None:
                on_event = cb.recorder.on_event
                break
    model = getattr(trainer.strategy, "model", None)
    wrapped = model if model is not None and model is not pl_module else None
    made = TrainGuard(
        optimizer,
        loss_fn,
        model=wrapped,
        count_fn=count_fn,
        max_splits=max_splits,
        on_event=on_event,
    )
    object.__setattr__(pl_module, _GUARD_ATTR, made)
    return made
