"""Hugging Face Trainer: record memory, survive OOM, choose the batch keeping the effective one.

The Trainer runs its own loop, so a callback can watch but not catch an exception inside a
step. memfit covers what the API allows:

* :func:`MemfitCallback` returns a ``transformers.TrainerCallback`` that records memory after
  every optimiser step (``on_step_end``) with a :class:`memfit.Recorder` and puts the latest
  allocated / peak bytes into the Trainer's logs (``on_log``).
* :func:`apply_batch` sets ``per_device_train_batch_size`` and
  ``gradient_accumulation_steps`` so that their product (the effective batch per device) stays
  what it was: the gradient Trainer computes is unchanged. The micro-batch can come from
  :func:`batch_size_from_estimate` over a :func:`memfit.estimate_torch` trace.
* :func:`train` runs ``trainer.train()``; when it runs out of memory it leaves the ``except``
  block, frees the memory, halves the micro-batch while doubling the accumulation (the
  effective batch stays), and trains again from a state that is exactly right: the newest
  checkpoint this call wrote (weights, optimizer, scheduler, RNG and step, as Trainer saves
  them), or, when there is none, the start: the model's weights, the optimizer and scheduler
  and the random generators as they were when :func:`train` was called (kept in host memory).
  It never goes on from weights the failed attempt had already updated with a fresh
  optimizer. Accelerate's ``find_executable_batch_size`` (``auto_find_batch_size=True``)
  halves the batch and leaves the accumulation alone, so the effective batch silently
  shrinks: :func:`train` refuses it.

transformers is imported when these are used, not when this module is imported.
"""

from __future__ import annotations

import functools
import gc
import time
from pathlib import Path
from typing import Any

from memfit._checks import require_callable, require_choice, require_count, require_positive_int
from memfit._lazy import require
from memfit._plain import plural
from memfit.errors import ConfigError, OutOfMemory
from memfit.integrations._batch import (
    batch_size_from_estimate,
    keep_effective_batch,
    require_recorder,
)
from memfit.runtime.events import EventSink, MemoryEvent, emit

__all__ = [
    "MemfitCallback",
    "apply_batch",
    "batch_size_from_estimate",
    "callback_class",
    "keep_effective_batch",
    "train",
]


@functools.cache
def callback_class() -> type[Any]:
    """The callback class, built on ``transformers.TrainerCallback`` on first use.

    Raises:
        BackendUnavailable: When transformers is not installed.
    """
    tf = require("transformers")

    class _MemfitCallback(tf.TrainerCallback):  # type: ignore[misc, name-defined]
        def __init__(self, recorder: Any | None) -> None:
            self.recorder = recorder
            self.last_sample: dict[str, Any] | None = None

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.recorder is not None:
                sample = self.recorder.step(int(state.global_step))
                if sample is not None:
                    self.last_sample = sample

        def on_log(
            self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any
        ) -> None:
            if logs is None or self.last_sample is None:
                return
            for key in ("allocated_bytes", "peak_allocated_bytes", "reserved_bytes"):
                value = self.last_sample.get(key)
                if value is not None:
                    logs[f"memfit/{key}"] = value

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.recorder is not None:
                self.recorder.close()

    _MemfitCallback.__name__ = _MemfitCallback.__qualname__ = "MemfitCallback"
    return _MemfitCallback


def MemfitCallback(recorder: Any | None = None) -> Any:
    """A Trainer callback that records memory after every optimiser step.

    Args:
        recorder: A :class:`memfit.Recorder` (closed at the end of training).

    Returns:
        The callback (``Trainer(callbacks=[...])``).

    Raises:
        BackendUnavailable: When transformers is not installed.
        ConfigError: When ``recorder`` is not a Recorder.
    """
    require_recorder(recorder)
    return callback_class()(recorder)


def _require_training_args(args: Any, key_path: str) -> None:
    for name in ("per_device_train_batch_size", "gradient_accumulation_steps"):
        if not hasattr(args, name):
            raise ConfigError(
                f"{key_path} has no {name}: expected a transformers.TrainingArguments, "
                f"not {type(args).__name__}",
                key_path=key_path,
                hint="pass trainer.args (a TrainingArguments)",
            )


def apply_batch(args: Any, micro_batch: int) -> tuple[int, int]:
    """Set the micro-batch and adjust gradient accumulation so the effective batch stays.

    The new micro-batch is the largest divisor of the effective batch
    (``per_device_train_batch_size * gradient_accumulation_steps``) not above
    ``micro_batch``.

    Args:
        args: The ``TrainingArguments`` (changed in place).
        micro_batch: The wanted per-device micro-batch.

    Returns:
        ``(per_device_train_batch_size, gradient_accumulation_steps)`` as set.

    Raises:
        ConfigError: When ``micro_batch`` is not a positive integer, or ``args`` has no
            ``per_device_train_batch_size`` / ``gradient_accumulation_steps``.
    """
    _require_training_args(args, "args")
    require_positive_int("micro_batch", micro_batch, hint="the wanted per-device micro-batch")
    effective = int(args.per_device_train_batch_size) * int(args.gradient_accumulation_steps)
    micro, accumulation = keep_effective_batch(effective, micro_batch)
    args.per_device_train_batch_size = micro
    args.gradient_accumulation_steps = accumulation
    return micro, accumulation


def _checkpoints(output_dir: str | None) -> dict[str, float]:
    """``checkpoint-N`` directories of ``output_dir`` and their modification times."""
    if not output_dir or not Path(output_dir).is_dir():
        return {}
    found: dict[str, float] = {}
    for path in Path(output_dir).glob("checkpoint-*"):
        if path.is_dir() and path.name.split("-")[-1].isdigit():
            found[str(path)] = path.stat().st_mtime
    return found


def _newest_since(output_dir: str | None, before: dict[str, float], started: float) -> str | None:
    """The newest checkpoint written since ``started`` (new, or rewritten since)."""
    fresh = [
        path
        for path, mtime in _checkpoints(output_dir).items()
        if path not in before or mtime > before[path] or mtime >= started
    ]
    if not fresh:
        return None
    return max(fresh, key=lambda p: int(p.rsplit("-", 1)[-1]))


class _StartState:
    """What :func:`train` puts back to train again from the start: the model's weights, the
    optimizer and scheduler, and the random generators, as they were at the call."""

    def __init__(self, trainer: Any) -> None:
        import copy

        from memfit.runtime._rewind import RngState

        self.model_state = {
            k: v.detach().to("cpu", copy=True) for k, v in trainer.model.state_dict().items()
        }
        # An optimizer Trainer makes itself is made again; one the user passed is reset.
        self.optimizer_state = (
            copy.deepcopy(trainer.optimizer.state_dict()) if trainer.optimizer is not None else None
        )
        self.scheduler_state = (
            copy.deepcopy(trainer.lr_scheduler.state_dict())
            if trainer.lr_scheduler is not None and hasattr(trainer.lr_scheduler, "state_dict")
            else None
        )
        self.user_scheduler = trainer.lr_scheduler is not None
        self.rng = RngState()
        self.rng.capture()

    def restore(self, trainer: Any) -> None:
        trainer.model.load_state_dict(self.model_state)
        if self.optimizer_state is None:
            trainer.optimizer = None
        else:
            trainer.optimizer.load_state_dict(self.optimizer_state)
        if not self.user_scheduler:
            trainer.lr_scheduler = None
            if hasattr(trainer, "_created_lr_scheduler"):
                trainer._created_lr_scheduler = False
        elif self.scheduler_state is not None:
            trainer.lr_scheduler.load_state_dict(self.scheduler_state)
        self.rng.restore()


def train(
    trainer: Any,
    *,
    max_halvings: int = 6,
    on_event: EventSink | None = None,
    restart: str = "auto",
    **train_kwargs: Any,
) -> Any:
    """``trainer.train()`` that survives out-of-memory, keeping the effective batch.

    On OOM: leave the ``except`` block, free memory (traceback frames, ``gc``,
    ``empty_cache``), halve ``per_device_train_batch_size`` and double
    ``gradient_accumulation_steps``, and train again from an exact state: the newest
    checkpoint this call wrote in ``args.output_dir``, else the start (weights, optimizer,
    scheduler and random generators as they were at the call; the steps since are done
    again, and the ``restart`` event says how many).

    Args:
        trainer: A ``transformers.Trainer``.
        max_halvings: Most halvings before giving up.
        on_event: Where the ``oom`` / ``split`` / ``restart`` events go (a Recorder's
            ``on_event``).
        restart: ``"auto"`` (a checkpoint of this call, else the start), ``"checkpoint"``
            (only from a checkpoint: with none, raise instead of redoing the steps; the
            weights are then not copied to host memory at the start) .
        **train_kwargs: Passed to ``trainer.train``.

    Returns:
        What ``trainer.train`` returns.

    Raises:
        OutOfMemory: When a micro-batch of 1 (or ``max_halvings`` halvings) still does not
            fit, or with ``restart="checkpoint"`` when there is no checkpoint to go on from.
        ConfigError: When ``max_halvings`` is negative, ``restart`` is unknown, ``trainer``
            is not a Trainer with ``TrainingArguments``, or ``auto_find_batch_size`` is on
            (it would shrink the effective batch behind memfit's back).
        BackendUnavailable: When transformers is not installed.
    """
    require_count("max_halvings", max_halvings)
    require_choice("restart", restart, ("auto", "checkpoint"))
    require_callable("on_event", on_event, optional=True)
    require("transformers")
    if not callable(getattr(trainer, "train", None)):
        raise ConfigError(
            f"trainer must be a transformers.Trainer, not {type(trainer).__name__}",
            key_path="trainer",
            hint="memfit.integrations.transformers.train(Trainer(model=..., args=...))",
        )
    _require_training_args(getattr(trainer, "args", None), "trainer.args")
    args = trainer.args
    if getattr(args, "auto_find_batch_size", False):
        raise ConfigError(
            "auto_find_batch_size=True halves the batch on out-of-memory without raising "
            "gradient_accumulation_steps, so the effective batch (and the training) silently "
            "changes; memfit keeps the effective batch itself",
            key_path="trainer.args.auto_find_batch_size",
            hint="set TrainingArguments(auto_find_batch_size=False) and let memfit's train() "
            "halve the micro-batch",
        )
    from memfit.runtime.guard import memory_figures
    from memfit.runtime.oom import first_line, forget_exception, is_oom

    output_dir = getattr(args, "output_dir", None)
    started = time.time()
    before = _checkpoints(output_dir)
    start = _StartState(trainer) if restart == "auto" else None
    user_resume = train_kwargs.get("resume_from_checkpoint")
    tried: list[str] = []
    for _ in range(max_halvings + 1):
        message: str | None = None
        try:
            return trainer.train(**train_kwargs)
        except Exception as exc:
            if not is_oom(exc):
                raise
            message = forget_exception(exc)
        gc.collect()
        torch = require("torch")
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
        micro = int(args.per_device_train_batch_size)
        lost = int(getattr(getattr(trainer, "state", None), "global_step", 0) or 0)
        emit(
            on_event,
            MemoryEvent("oom", None, "transformers.train", first_line(message), memory_figures()),
        )
        if micro == 1:
            break
        new_micro, accumulation = apply_batch(args, micro // 2)
        tried.append(f"micro-batch {new_micro} x {accumulation}")
        trainer._train_batch_size = args.train_batch_size  # what Trainer's dataloader uses
        checkpoint = _newest_since(output_dir, before, started)
        if checkpoint is not None:
            train_kwargs["resume_from_checkpoint"] = checkpoint
            how = f"resuming from {checkpoint}"
        elif start is not None:
            start.restore(trainer)
            train_kwargs["resume_from_checkpoint"] = user_resume
            how = (
                f"restarting from the start ({plural(lost, 'optimizer step')} done again)"
                if user_resume is None
                else f"restarting from {user_resume}"
            )
        else:
            figures = memory_figures()
            raise OutOfMemory(
                "Trainer ran out of memory and this call wrote no checkpoint to go on from "
                f"(restart='checkpoint'); the model is {plural(lost, 'optimizer step')} past its "
                "start",
                peak_bytes=figures["peak_bytes"],
                budget_bytes=figures["budget_bytes"],
                tried=tried,
                hint="save checkpoints (save_strategy='steps', save_steps=...) or use "
                "restart='auto' to train again from the start",
            )
        emit(
            on_event,
            MemoryEvent(
                "split",
                None,
                "transformers.train",
                f"micro-batch {micro} -> {new_micro}, accumulation {accumulation}, {how}",
                {
                    "micro_batch": new_micro,
                    "accumulation": accumulation,
                    "resume_from": checkpoint if checkpoint is not None else user_resume,
                    "steps_redone": 0 if checkpoint is not None else lost,
                },
            ),
        )
    figures = memory_figures()
    raise OutOfMemory(
        "Trainer ran out of memory even after " + (", ".join(tried) or "nothing"),
        peak_bytes=figures["peak_bytes"],
        budget_bytes=figures["budget_bytes"],
        tried=tried,
        hint="a smaller model or sequence length, gradient checkpointing, or a larger GPU",
    )
