"""Survive out-of-memory in the middle of a run, losing nothing: TrainGuard and RolloutGuard.

:class:`TrainGuard` runs one optimisation step per call. When a step runs out of memory it
leaves the ``except`` block, clears the traceback's frames and the chained exceptions (which
pin the failed attempt's tensors), frees memory, puts back what the failed attempt changed
(random number generators, BatchNorm statistics) and climbs the ladder of
:mod:`memfit.core.ladder`: retry at the same number of micro-batches (more often for a size
that ran before: that failure was transient), then 2, 4, ... micro-batches up to
``max_splits``, then raise :class:`memfit.OutOfMemory` with what was tried. After a step
that gave up, the next one starts again from the last completed step's split count. The
gradient stays the full-batch gradient:

* each micro-batch's mean loss is weighted by its share of the batch's items (or of
  ``count_fn``), so the accumulated gradient equals the full batch's;
* the first micro-batch of a step (the whole batch, in the common case) runs a plain
  ``backward()``, as a bare loop does; if it runs out of memory its partial gradients are
  dropped. Every later micro-batch computes its gradients with ``torch.autograd.grad`` and
  adds them to ``.grad`` in one operation only after its backward succeeded, so an
  out-of-memory in forward *or* backward leaves no partial gradient (the addition is the
  micro-step's last operation, after all its allocations), and micro-batches that
  already succeeded are kept, not redone (so hooks that run when ``.grad`` is accumulated,
  such as ``register_post_accumulate_grad_hook``, fire for the first micro-batch only;
  tensor hooks fire for all);
* the loss is read (``.item()``) only at the end of the step, after ``optimizer.step()`` is
  queued, so on a GPU the host does not wait for the device in the middle of the step;
* no optimizer step is left half done. The default,
  ``snapshot_optimizer="auto"``, keeps a journal on the parameters' device
  (:mod:`memfit.runtime._journal`): the built-in per-parameter optimizers of ``torch.optim``
  are stepped in chunks of at most ``max(largest parameter with its state, 64 MiB)``, each
  copied just before it is stepped (any other optimizer is one chunk). An out-of-memory
  inside the step puts the chunk back and steps it again (``foreach`` off after three
  tries), so the step completes exactly; another error or a ``KeyboardInterrupt`` puts the
  chunk back and then undoes the step (one chunk) or completes it (several) before it
  propagates with a note saying which; an error that repeats while completing leaves the
  step divided, and the note names the parameters that took it. The copy costs memory
  bandwidth every step (``docs/benchmarks.md``), and device memory during the step only
  while the device has room for it next to the step; otherwise (or after an out-of-memory
  with the copy on the device) it moves to host memory for good, so the journal never
  makes a step that fits without it run out of memory. ``"always"`` (or ``True``) copies
  everything to host memory before every step instead (undone as a whole on any fault, no
  device memory); ``"never"`` (or ``False``) copies nothing: an out-of-memory inside a step
  is then retried only when the tensors' version counters show the step changed nothing
  yet, and otherwise stops the run with :class:`memfit.OutOfMemory` saying the step could
  not be undone. Optimizers whose state holds anything but tensors and plain numbers cannot
  be snapshotted with ``"always"`` (a :class:`memfit.ConfigError`).

* ``before_step(optimizer)`` runs between the complete gradient and ``optimizer.step()``:
  gradient clipping goes there (:func:`clip_grad_norm`), not in ``loss_fn``.

With ``torch.amp.GradScaler`` the gradients are scaled per micro-batch, and unscaled, checked
for infs and the scale updated once per full step. Under DDP the backward passes run under
``model.no_sync()`` and the gradients are averaged with one all-reduce once every micro-batch
on every rank has succeeded; every rank takes the same decision through one small all-reduce
before the optimizer step and settles the step with another after it
(:mod:`memfit.runtime._distributed`): a rank whose step failed takes the parameters and state
of one whose step succeeded, and an error on one rank stops all of them. After
``grow_back_after`` clean steps the guard halves its number of micro-batches again, so a
transient spike does not slow a run forever (a step is clean when it did not have to split
further; an out-of-memory that a retry cured was transient).

:class:`RolloutGuard` does the same for inference and environment stepping: retry, then run
the call in chunks along the environment dimension and concatenate the results; chunks that
ran are kept, so an environment is never stepped twice.
"""

from __future__ import annotations

from memfit.runtime._batching import batch_size, split_batch
from memfit.runtime._memory import memory_figures
from memfit.runtime._rollout_guard import RolloutGuard
from memfit.runtime._train_guard import TrainGuard, clip_grad_norm
from memfit.runtime.oom import forget_exception

__all__ = [
    "RolloutGuard",
    "TrainGuard",
    "batch_size",
    "clip_grad_norm",
    "forget_exception",
    "memory_figures",
    "split_batch",
]
