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
  effective batch stays), and resumes from the newest checkpoint in ``output_dir`` when there
  is one. Accelerate's ``find_executable_batch_size`` (``auto_find_batch_size=True``) restarts
  the whole function and leaves the accumulation alone, so its effective batch shrinks.

transformers is imported when these are used, not when this module is imported.
"""

from __future__ import annotations

import functools
import gc
from pathlib import Path
from typing import Any

from memfit.errors import ConfigError, OutOfMemory
from memfit.integrations._batch import batch_size_from_estimate, keep_effective_batch
from memfit.integrations._lazy import require
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
    """
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
    effective = int(args.per_device_train_batch_size) * int(args.gradient_accumulation_steps)
    micro, accumulation = keep_effective_batch(effective, micro_batch)
    args.per_device_train_batch_size = micro
    args.gradient_accumulation_steps = accumulation
    return micro, accumulation


def _latest_checkpoint(output_dir: str | None) -> str | None:
    if not output_dir:
        return None
    found = sorted(
        Path(output_dir).glob("checkpoint-*"),
        key=lambda p: int(p.name.split("-")[-1]) if p.name.split("-")[-1].isdigit() else -1,
    )
    return str(found[-1]) if found else None


def train(
    trainer: Any,
    *,
    max_halvings: int = 6,
    on_event: EventSink | None = None,
    **train_kwargs: Any,
) -> Any:
    """``trainer.train()`` that survives out-of-memory, keeping the effective batch.

    On OOM: leave the ``except`` block, free memory (traceback frames, ``gc``,
    ``empty_cache``), halve ``per_device_train_batch_size`` and double
    ``gradient_accumulation_steps``, and train again, resuming from the newest checkpoint in
    ``args.output_dir`` when there is one (training then goes on from that step).

    Args:
        trainer: A ``transformers.Trainer``.
        max_halvings: Most halvings before giving up.
        on_event: Where the ``oom`` / ``split`` events go (a Recorder's ``on_event``).
        **train_kwargs: Passed to ``trainer.train``.

    Returns:
        What ``trainer.train`` returns.

    Raises:
        OutOfMemory: When a micro-batch of 1 (or ``max_halvings`` halvings) still does not fit.
        ConfigError: When ``max_halvings`` is negative, or ``trainer`` is not a Trainer
            with ``TrainingArguments``.
        BackendUnavailable: When transformers is not installed.
    """
    if isinstance(max_halvings, bool) or not isinstance(max_halvings, int) or max_halvings < 0:
        raise ConfigError(
            f"max_halvings must be a whole number >= 0, not {max_halvings!r}",
            key_path="max_halvings",
        )
    require("transformers")
    if not callable(getattr(trainer, "train", None)):
        raise ConfigError(
            f"trainer must be a transformers.Trainer, not {type(trainer).__name__}",
            key_path="trainer",
            hint="memfit.integrations.transformers.train(Trainer(model=..., args=...))",
        )
    _require_training_args(getattr(trainer, "args", None), "trainer.args")
    from memfit.runtime.guard import memory_figures
    from memfit.runtime.oom import forget_exception, is_oom

    tried: list[str] = []
    args = trainer.args
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
        emit(
            on_event,
            MemoryEvent(
                "oom", None, "transformers.train", message.splitlines()[0], memory_figures()
            ),
        )
        if micro == 1:
            break
        new_micro, accumulation = apply_batch(args, micro // 2)
        tried.append(f"micro-batch {new_micro} x {accumulation}")
        trainer._train_batch_size = args.train_batch_size  # what Trainer's dataloader uses
        checkpoint = _latest_checkpoint(getattr(args, "output_dir", None))
        if checkpoint is not None:
            train_kwargs["resume_from_checkpoint"] = checkpoint
        emit(
            on_event,
            MemoryEvent(
                "split",
                None,
                "transformers.train",
                f"micro-batch {micro} -> {new_micro}, accumulation {accumulation}"
                + (f", resuming from {checkpoint}" if checkpoint else ""),
                {"micro_batch": new_micro, "accumulation": accumulation},
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
