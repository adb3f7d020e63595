"""Search cost of ``memfit fit`` against Lightning's and Accelerate's batch-size searches.

The same real PyTorch workloads (an MLP with Adam, a CNN with BatchNorm and SGD momentum, a
small transformer encoder with AdamW) and the same memory budgets are searched by:

* **memfit** ``fit`` with a fake-tensor trace as its prior (``memfit.runtime.fit.trace_prior``),
  at margin 0 (the same target as the others: the largest batch that does not run out) and
  at its default 5% margin; and without a prior;
* **Lightning** ``BatchSizeFinder`` in modes ``power`` and ``binsearch``: where ``lightning``
  imports, the real callback (``lightning.pytorch.callbacks.BatchSizeFinder`` with its
  documented defaults: init_val 2, steps_per_trial 3, max_trials 25, max_val 8192, binsearch
  margin 0.05) in a real ``lightning.Trainer`` on the same device (``trainer.fit``; the
  LightningModule's ``training_step`` runs the workload's own step, manual optimization, so
  it is the same forward, backward, optimizer step as every other method's). The whole
  ``fit`` runs inside the simulated GPU (model and optimizer state counted, as for the other
  methods; Lightning's checkpoint save and restore too). Lightning's ``is_oom_error`` looks
  for ``"CUDA"`` and ``"out of memory"`` in the message, not at the type; the simulated
  GPU's ``torch.OutOfMemoryError`` is worded as the CUDA allocator's ("CUDA out of memory.
  Tried to allocate ... on memfit's simulated GPU"), so Lightning recognises it as it
  recognises a real capped GPU's. After the
  search Lightning trains 2 steps at the size found (``max_steps=2``): those are the "does
  the final value run" check. Where lightning does not import, or with ``--reimplemented``,
  a re-implementation of ``_run_power_scaling`` and ``_run_binsearch_scaling``
  (``lightning/pytorch/tuner/batch_size_scaling.py``, Lightning-AI/pytorch-lightning 7f0c343,
  2026-07, the same code as lightning 2.6.6) runs through the same trials as the other
  methods, labelled "(re-implemented)";
* **Accelerate**: where ``accelerate`` imports, the real
  ``accelerate.utils.find_executable_batch_size`` decorating the trial (start at 128, its
  default, then rerun at ``int(batch * 0.9)`` after each OOM it recognises by message; it never
  grows); a second row starts at 4096, as users do when they expect more. Without accelerate,
  a re-implementation (``accelerate/utils/memory.py``, commit 16cb6eb, 2026-07) labelled so.

**Like with like (issue 23).** Every method is scored at the margin it runs with against the
true maximum at that margin: margin 0 against the largest batch that fits the budget, 5%
against the largest that fits 95% of it. Lightning's binsearch runs twice: at margin 0 (it
then reports the largest size that ran) and at its documented 5% (it takes 5% off the size
it found). The "wall s" column is the whole search's wall clock, memfit's trace of its prior
included (each margin's trace timed on its own).

Every method runs real steps of the real model (``run(value)``) on a simulated GPU
(``memfit.simulate_gpu(budget)``, which raises ``torch.OutOfMemoryError`` past the budget)
on the CPU, or, with ``--cuda`` on a CUDA machine, on the GPU with the caching allocator
capped at the budget. An out-of-memory error in a trial is caught by each method's own rule.

The **true maximum** is found by exhaustive search: on the simulated GPU the peak of one step
at every batch size from 1 up is measured once per workload (peaks are deterministic there),
and the true maximum for a budget is the largest batch whose peak fits it. On CUDA every
batch size within 5% of the bisection boundary is run under the cap.

Columns: margin, trials (probes), steps run, OOMs hit, the final value, its fraction of the
true maximum at its margin, whether the final value is above that maximum (it would run out of
memory, or into the margin, when used), and the wall clock with the trace.

Goal (issue 7): memfit reaches at least 97% of the true maximum, never above it, in at most
3 probes, with no uncaught OOM.

Writes ``bench/out/fit_search.json`` and ``bench/out/fit_search.md`` and prints the table.
Run: ``python bench/fit_search.py`` (a few minutes on 2 CPU cores); ``--quick`` for one budget
per workload; ``--cuda`` on a GPU machine; ``--reimplemented`` to add the re-implemented
Lightning rules beside the real finder (a check that they try the same sizes). The objects
that exist after the imports are frozen out of the garbage collector (``gc.freeze``): the
searches call ``gc.collect`` after each OOM (Lightning before every trial), and with torch and
lightning loaded each full collection otherwise costs about 0.4 s here.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from memfit.errors import InfeasiblePlan
from memfit.estimate import TorchStep
from memfit.runtime import fit as fit_mod
from memfit.runtime.fit import fit, trace_prior
from memfit.runtime.oom import is_oom
from memfit.runtime.simulate import simulate_gpu
from memfit.units import MiB, format_bytes

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import utc_minute, write_results  # noqa: E402

LIGHTNING_REIMPLEMENTED = (
    "re-implementation of lightning/pytorch/tuner/batch_size_scaling.py "
    "(Lightning-AI/pytorch-lightning 7f0c3436, 2026-07)"
)
ACCELERATE_REIMPLEMENTED = (
    "re-implementation of accelerate/utils/memory.py find_executable_batch_size "
    "(huggingface/accelerate 16cb6eb8, 2026-07)"
)


def accelerate_version() -> str | None:
    """The installed Accelerate's version, or ``None`` when ``accelerate`` does not import."""
    try:
        import accelerate
    except ImportError:
        return None
    return str(accelerate.__version__)


ACCELERATE_SOURCE = (
    f"the real accelerate.utils.find_executable_batch_size (accelerate {accelerate_version()}, "
    "its default x0.9 per OOM)"
    if accelerate_version()
    else f"{ACCELERATE_REIMPLEMENTED}; accelerate is not installed here"
)


# -- workloads -------------------------------------------------------------------------------------


def _mlp_build() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
    )
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def _mlp_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 64), torch.randint(0, 10, (n,))


def _cnn_build() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 10),
    )
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def _cnn_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 3, 8, 8), torch.randint(0, 10, (n,))


class _TinyTransformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(100, 32)
        self.layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.head = nn.Linear(32, 100)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.layer(self.embed(tokens)))


def _transformer_build() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = _TinyTransformer()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def _transformer_batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randint(0, 100, (n, 16)), torch.randint(0, 100, (n, 16))


def _step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: Any) -> None:
    x, y = batch
    logits = model(x)
    loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


@dataclass(frozen=True)
class Workload:
    name: str
    step: TorchStep
    budgets: tuple[int, ...]  # simulated budgets, bytes


WORKLOADS = (
    Workload("mlp-adam", TorchStep(_mlp_build, _step, _mlp_batch), (3 * MiB, 4 * MiB, 6 * MiB)),
    Workload("cnn-bn-sgd", TorchStep(_cnn_build, _step, _cnn_batch), (4 * MiB, 8 * MiB, 12 * MiB)),
    Workload(
        "transformer-adamw",
        TorchStep(_transformer_build, _step, _transformer_batch),
        (6 * MiB, 10 * MiB, 16 * MiB),
    ),
)
HIGH = 8192  # the largest batch any method may try (Lightning's max_val)


# -- the device ------------------------------------------------------------------------------------


@dataclass
class Counter:
    """What one method cost: trials, steps started, OOMs caught."""

    trials: int = 0
    steps: int = 0
    ooms: int = 0
    values: list[int] = field(default_factory=list)


class Trial:
    """Runs ``steps`` real steps at a batch size on the budgeted device, counting the cost."""

    def __init__(self, model: Any, optimizer: Any, step: TorchStep, device: torch.device) -> None:
        self.model = model
        self.optimizer = optimizer
        self.step = step
        self.device = device
        self.counter = Counter()

    def run(self, value: int, steps: int) -> None:
        """Raise the framework's out-of-memory error as the step does."""
        self.counter.trials += 1
        self.counter.values.append(value)
        self.model.zero_grad(set_to_none=True)
        with torch.device(self.device):
            for _ in range(steps):
                self.counter.steps += 1
                self.step.step(self.model, self.optimizer, self.step.make_batch(value))

    def ok(self, value: int, steps: int) -> bool:
        """Run a trial; ``False`` (memory freed, outside the except block) on OOM."""
        failed = False
        try:
            self.run(value, steps)
        except Exception as exc:
            if not is_oom(exc):
                raise
            failed = True
            exc.__traceback__ = None
        if failed:
            self.counter.ooms += 1
            self.model.zero_grad(set_to_none=True)
            gc.collect()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        return not failed


# -- the rules compared ----------------------------------------------------------------------------


def lightning_power(
    trial: Trial, *, init_val: int = 2, max_trials: int = 25, max_val: int = 8192, steps: int = 3
) -> int:
    """Lightning's ``_run_power_scaling``: double until OOM, then halve and stop."""
    new_size = init_val
    any_success = False
    last_successful_size = new_size
    for i in range(max_trials):
        if new_size >= max_val:
            break
        if trial.ok(new_size, steps):
            last_successful_size = new_size
            if i + 1 >= max_trials:
                new_size = last_successful_size
                break
            doubled = min(int(new_size * 2.0), max_val)
            changed = doubled != new_size
            new_size = doubled
            if not changed:
                break
            any_success = True
        else:
            new_size = min(int(new_size * 0.5), max_val)
            if any_success:
                break
    return new_size


def lightning_binsearch(
    trial: Trial,
    *,
    init_val: int = 2,
    max_trials: int = 25,
    max_val: int = 8192,
    margin: float = 0.05,
    steps: int = 3,
) -> int:
    """Lightning's ``_run_binsearch_scaling``: double until OOM, bisect, then apply the margin."""
    low = 1
    high: int | None = None
    count = 0
    new_size = init_val
    last_successful_size = new_size
    while True:
        if new_size >= max_val:
            break
        if trial.ok(new_size, steps):
            last_successful_size = new_size
            count += 1
            if count >= max_trials:
                new_size = last_successful_size
                break
            low = new_size
            if high:
                if high - low <= 1:
                    break
                nxt = min((high + low) // 2, max_val)
            else:
                nxt = min(int(new_size * 2.0), max_val)
            changed = nxt != new_size
            new_size = nxt
            if not changed:
                break
        else:
            high = new_size
            new_size = min((high + low) // 2, max_val)
            if high - low <= 1:
                break
    if margin > 0:
        new_size = max(1, int(new_size * (1 - margin)))
    return new_size


def accelerate_shrink(trial: Trial, *, starting_batch_size: int = 128, steps: int = 3) -> int:
    """Accelerate's ``find_executable_batch_size``: rerun, ``int(batch * 0.9)`` per OOM."""
    batch_size = starting_batch_size
    while True:
        if batch_size == 0:
            return 0  # Accelerate raises "No executable batch size found, reached zero."
        if trial.ok(batch_size, steps):
            return batch_size
        batch_size = int(batch_size * 0.9)


def accelerate_real(trial: Trial, *, starting_batch_size: int = 128, steps: int = 3) -> int:
    """The installed ``accelerate.utils.find_executable_batch_size`` decorating a trial: it
    catches the OOM by its message (inside its ``except`` block), clears the device cache
    and reruns at ``int(batch * 0.9)``."""
    from accelerate.utils import find_executable_batch_size

    @find_executable_batch_size(starting_batch_size=starting_batch_size)  # type: ignore[misc]
    def inner(batch_size: int) -> int:
        try:
            trial.run(batch_size, steps)
        except Exception as exc:
            if is_oom(exc):
                trial.counter.ooms += 1
            raise
        return batch_size

    try:
        return int(inner())
    except RuntimeError as exc:
        if "No executable batch size found" in str(exc):
            return 0
        raise


# -- the real Lightning BatchSizeFinder ------------------------------------------------------------


def lightning_version() -> str | None:
    """The installed Lightning's version, or ``None`` when ``lightning`` does not import."""
    try:
        import lightning
    except ImportError:
        return None
    return str(lightning.__version__)


class _IndexCount(torch.utils.data.Dataset[int]):
    """``HIGH * 3`` items; the loader's collate gives only the batch size (an int, no tensor).

    The step builds its batch itself (``make_batch(n)``, inside the step, on the budgeted
    device), as every other method's trial does, so the loader adds no memory of its own. The
    length lets three full batches of ``max_val`` run and keeps Lightning's "batch size >= the
    dataset's length" stop from firing.
    """

    def __len__(self) -> int:
        return 3 * HIGH

    def __getitem__(self, index: int) -> int:
        return index


def _lightning_search(
    mode: str, margin: float = 0.05
) -> Callable[[Workload, int, bool], dict[str, Any]]:
    """Lightning's own ``BatchSizeFinder(mode, margin=margin)`` in a ``lightning.Trainer``."""

    def search(workload: Workload, budget: int, cuda: bool) -> dict[str, Any]:
        return _run_lightning(mode, workload, budget, cuda, margin)

    return search


def _run_lightning(
    mode: str, workload: Workload, budget: int, cuda: bool, margin: float = 0.05
) -> dict[str, Any]:
    import logging
    import tempfile
    import warnings

    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import BatchSizeFinder

    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    counter = Counter()
    state = {"searching": True, "final_ran": 0}

    class FinderModule(pl.LightningModule):
        """The workload's model and step; Lightning drives it (manual optimization, so the
        step is the same function every other method runs: forward, backward, step, zero)."""

        def __init__(self, net: nn.Module, optimizer: torch.optim.Optimizer) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.net = net
            self.raw_optimizer = optimizer
            self.batch_size = 2  # BatchSizeFinder sets it (init_val first)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return self.raw_optimizer

        def train_dataloader(self) -> torch.utils.data.DataLoader[int]:
            return torch.utils.data.DataLoader(
                _IndexCount(), batch_size=self.batch_size, collate_fn=len
            )

        def on_train_start(self) -> None:  # once per trial (each trial reruns the fit loop)
            if state["searching"]:
                counter.trials += 1
                counter.values.append(self.batch_size)

        def training_step(self, batch: int, batch_idx: int) -> None:
            if state["searching"]:
                counter.steps += 1
            opt = self.optimizers()
            self.net.zero_grad(set_to_none=True)  # as Trial.run does before a trial
            try:
                with torch.device(self.device):
                    workload.step.step(self.net, opt, workload.step.make_batch(batch))
            except torch.OutOfMemoryError:
                if state["searching"]:
                    counter.ooms += 1
                raise
            if not state["searching"]:
                state["final_ran"] += 1  # a training step after the search that completed

    class SearchDone(pl.Callback):
        """Listed after the finder: its ``on_fit_start`` runs when the search has returned."""

        def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            state["searching"] = False

    start = time.perf_counter()
    finder = BatchSizeFinder(mode=mode, steps_per_trial=3, init_val=2, max_trials=25, margin=margin)
    with _device_context(budget, cuda) as device, tempfile.TemporaryDirectory() as root:
        with torch.device(device):
            model, optimizer = workload.step.build()
        Trial(model, optimizer, workload.step, device).run(1, 1)  # warm, as run_method does
        trainer = pl.Trainer(
            accelerator="gpu" if cuda else "cpu",
            devices=[device.index] if cuda else 1,
            callbacks=[finder, SearchDone()],
            max_steps=2,  # after the search, train 2 steps at the size found
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            default_root_dir=root,
        )
        uncaught = 0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                trainer.fit(FinderModule(model, optimizer))
            except Exception as exc:
                if not is_oom(exc):
                    raise
                if state["searching"]:
                    uncaught = 1
        value = int(finder.optimal_batch_size or 0) if not uncaught else 0
        # The 2 training steps Lightning runs after the search are the "does it run" check.
        used_ok = value > 0 and not state["searching"] and state["final_ran"] == 2
        del trainer, model, optimizer
        gc.collect()
    return {
        "trials": counter.trials,
        "steps": counter.steps,
        "ooms": counter.ooms,
        "uncaught_ooms": uncaught,
        "value": value,
        "final_runs": used_ok,
        "tried": counter.values,
        "seconds": round(time.perf_counter() - start, 2),
    }


# -- truth -----------------------------------------------------------------------------------------


class SimulatedCurve:
    """Peaks of one step at given batch sizes on the simulated GPU, measured on demand.

    Peaks there are deterministic (the simulated GPU counts the bytes of live storages), so
    one measurement per batch size serves every budget and every method.
    """

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self.peaks: dict[int, int] = {}

    def peak(self, value: int) -> int:
        return self.measure([value])[value]

    def measure(self, values: list[int]) -> dict[int, int]:
        """Peaks at ``values`` (one fresh model for all the ones not measured yet)."""
        missing = [v for v in values if v not in self.peaks]
        if missing:
            with simulate_gpu(1 << 40) as gpu:
                model, optimizer = self.workload.step.build()
                trial = Trial(model, optimizer, self.workload.step, torch.device("cpu"))
                trial.run(1, 1)  # optimizer state exists, as in every method's probes
                for value in missing:
                    model.zero_grad(set_to_none=True)
                    gc.collect()
                    gpu.reset_peak()
                    trial.run(value, 1)
                    self.peaks[value] = int(gpu.peak_allocated_bytes)
        return {v: self.peaks[v] for v in values}

    def true_max(self, limit: float) -> tuple[int, dict[str, Any]]:
        """The largest batch whose peak fits ``limit``, and how it was established.

        Bisection over 1..HIGH finds the boundary; then every batch size within 5% of it is
        measured (exhaustive there), and batch sizes 1.1, 1.25, 1.5 and 2 times the boundary
        are checked not to fit (the curve does not come back under the limit above it).
        """
        lo, hi = 0, HIGH
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.peak(mid) <= limit:
                lo = mid
            else:
                hi = mid - 1
        window = range(max(1, int(lo * 0.95)), min(HIGH, int(lo * 1.05) + 1) + 1)
        spots = [v for v in (int(lo * f) for f in (1.1, 1.25, 1.5, 2.0)) if lo < v <= HIGH]
        peaks = self.measure([*window, *spots])
        best = max([v for v in window if peaks[v] <= limit], default=lo)
        above_fits = [v for v in spots if peaks[v] <= limit]
        return best, {
            "bisection_boundary": lo,
            "window": [window.start, window.stop - 1],
            "spot_checks_above": spots,
            "spot_checks_that_fit": above_fits,
        }


# -- one comparison --------------------------------------------------------------------------------


@contextmanager
def _device_context(budget: int, cuda: bool) -> Iterator[torch.device]:
    if not cuda:
        with simulate_gpu(budget):
            yield torch.device("cpu")
        return
    from memfit.runtime.simulate import cuda_allocator_cap

    index = torch.cuda.current_device()
    gc.collect()
    try:
        with cuda_allocator_cap(index, budget):
            yield torch.device(f"cuda:{index}")
    finally:
        gc.collect()
        torch.cuda.empty_cache()


#: Batch sizes whose uncapped peak becomes a CUDA budget: the simulated budgets above are
#: smaller than the CUDA allocator's segments and Hopper's 32 MiB cuBLAS workspace, so on a
#: GPU each budget is what the step reserves at one of these sizes on that GPU.
CUDA_BUDGET_AT = (768, 2304, 6144)


def cuda_budgets(workload: Workload, quick: bool) -> tuple[int, ...]:
    """Budgets for ``--cuda``: the reserved peak of two uncapped steps at each size."""
    sizes = CUDA_BUDGET_AT[1:2] if quick else CUDA_BUDGET_AT
    budgets = []
    index = torch.cuda.current_device()
    for value in sizes:
        gc.collect()
        torch.cuda.empty_cache()
        with torch.device(f"cuda:{index}"):
            model, optimizer = workload.step.build()
            torch.cuda.reset_peak_memory_stats(index)
            for _ in range(2):
                workload.step.step(model, optimizer, workload.step.make_batch(value))
        torch.cuda.synchronize(index)
        budgets.append(int(torch.cuda.max_memory_reserved(index)))
        del model, optimizer
    gc.collect()
    torch.cuda.empty_cache()
    return tuple(budgets)


def run_method(
    name: str,
    workload: Workload,
    budget: int,
    cuda: bool,
    search: Callable[[Trial], int],
) -> dict[str, Any]:
    start = time.perf_counter()
    with _device_context(budget, cuda) as device:
        with torch.device(device):
            model, optimizer = workload.step.build()
        trial = Trial(model, optimizer, workload.step, device)
        trial.run(1, 1)  # warm: optimizer state exists (not counted)
        trial.counter = Counter()
        uncaught = 0
        try:
            value = search(trial)
        except Exception as exc:
            if not is_oom(exc):
                raise
            uncaught, value = 1, 0
        # Does the final value run? (an OOM here is one the method would hit in training)
        used_ok = value > 0 and _runs(trial, value)
    return {
        "method": name,
        "workload": workload.name,
        "budget_bytes": budget,
        "trials": trial.counter.trials,
        "steps": trial.counter.steps,
        "ooms": trial.counter.ooms,
        "uncaught_ooms": uncaught,
        "value": value,
        "final_runs": used_ok,
        "tried": trial.counter.values,
        "seconds": round(time.perf_counter() - start, 2),
    }


def _runs(trial: Trial, value: int) -> bool:
    saved = trial.counter
    trial.counter = Counter()
    try:
        return trial.ok(value, 2)
    finally:
        trial.counter = saved


def _memfit(margin: float, prior: Any, steps: int = 2) -> Callable[[Trial], int]:
    def search(trial: Trial) -> int:
        try:
            result = fit(
                lambda v: trial.run(v, steps),
                low=1,
                high=HIGH,
                margin=margin,
                prior=prior,
                device="cpu" if trial.device.type == "cpu" else str(trial.device),
            )
        except InfeasiblePlan:
            return 0  # not even a batch of 1 fits the budget less the margin: a result
        trial.counter.ooms = result.oom_count
        return result.value

    return search


def compare(
    workload: Workload,
    budget: int,
    cuda: bool,
    curve: SimulatedCurve | None,
    lightning: tuple[str, ...] = ("real",),
) -> list[dict[str, Any]]:
    """Every method on one workload and budget; ``lightning`` picks the Lightning rows
    (``"real"``: the installed ``BatchSizeFinder``; ``"reimplemented"``: the rule above)."""
    device = "cuda" if cuda else "cpu"
    t0 = time.perf_counter()
    prior0 = trace_prior(workload.step, low=1, high=HIGH, budget=budget, margin=0.0, device=device)
    t1 = time.perf_counter()
    prior5 = trace_prior(workload.step, low=1, high=HIGH, budget=budget, margin=0.05, device=device)
    traces = {0.0: round(t1 - t0, 2), 0.05: round(time.perf_counter() - t1, 2)}
    Search = Callable[[Trial], int] | Callable[[Workload, int, bool], dict[str, Any]]
    # Each method at the margin it is run with, scored against the true maximum at that
    # margin: margin 0 against the largest batch that fits the budget; 5% against the largest
    # that fits 95% of it (memfit keeps 5% of the memory; Lightning's binsearch takes 5% off
    # the batch it found, which lands at or under that maximum).
    methods: list[tuple[str, Search, float]] = [
        ("memfit (traced prior, margin 0)", _memfit(0.0, prior0), 0.0),
        ("memfit (traced prior, margin 5%)", _memfit(0.05, prior5), 0.05),
        ("memfit (no prior, margin 0)", _memfit(0.0, None), 0.0),
    ]
    if "real" in lightning:
        methods += [
            ("Lightning BatchSizeFinder power", _lightning_search("power"), 0.0),
            ("Lightning BatchSizeFinder binsearch, margin 0", _lightning_search("binsearch", 0.0),
             0.0),
            ("Lightning BatchSizeFinder binsearch, margin 5%",
             _lightning_search("binsearch", 0.05), 0.05),
        ]  # fmt: skip
    if "reimplemented" in lightning:
        methods += [
            ("Lightning power (re-implemented)", lightning_power, 0.0),
            ("Lightning binsearch, margin 0 (re-implemented)",
             lambda t: lightning_binsearch(t, margin=0.0), 0.0),
            ("Lightning binsearch, margin 5% (re-implemented)", lightning_binsearch, 0.05),
        ]  # fmt: skip
    if accelerate_version():
        methods += [
            ("Accelerate find_executable_batch_size from 128", accelerate_real, 0.0),
            ("Accelerate find_executable_batch_size from 4096",
             lambda t: accelerate_real(t, starting_batch_size=4096), 0.0),
        ]  # fmt: skip
    else:
        methods += [
            ("Accelerate x0.9 from 128 (re-implemented)", accelerate_shrink, 0.0),
            ("Accelerate x0.9 from 4096 (re-implemented)",
             lambda t: accelerate_shrink(t, starting_batch_size=4096), 0.0),
        ]  # fmt: skip
    rows = []
    for name, search, margin in methods:
        if name.startswith("Lightning BatchSizeFinder"):
            row = {"method": name, "workload": workload.name, "budget_bytes": budget}
            row.update(search(workload, budget, cuda))  # type: ignore[call-arg]
        else:
            row = run_method(name, workload, budget, cuda, search)  # type: ignore[arg-type]
        row["margin"] = margin
        # wall clock of the whole search: a traced prior's trace is part of memfit's cost
        row["wall_seconds"] = row["seconds"]
        if name.startswith("memfit (traced"):
            row["trace_seconds"] = traces[margin]
            row["wall_seconds"] = round(row["seconds"] + traces[margin], 2)
        if curve is not None:
            row["true_max"], row["truth_how"] = curve.true_max(budget * (1 - margin))
            row["true_max_at_budget"] = curve.true_max(budget)[0]
        else:
            row["true_max"] = row["true_max_at_budget"] = cuda_true_max(workload, budget, margin)
        truth = row["true_max"]
        row["fraction"] = round(row["value"] / truth, 4) if truth else None
        row["above_max"] = bool(truth) and row["value"] > truth
        rows.append(row)
    return rows


def bisect_fits(fits: Callable[[int], bool]) -> int:
    """The largest batch in ``[0, HIGH]`` that a bisection finds to fit (0: none does). ``fits``
    need not be monotone: the callers scan above the result."""
    lo, hi = 0, HIGH
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def cuda_true_max(workload: Workload, budget: int, margin: float) -> int:
    """On CUDA: bisect the OOM boundary under the cap, then run every batch within 5% of it."""
    target = budget * (1 - margin)
    with _device_context(budget, True) as device:
        with torch.device(device):
            model, optimizer = workload.step.build()
        trial = Trial(model, optimizer, workload.step, device)
        trial.run(1, 1)

        def fits(value: int) -> bool:
            torch.cuda.reset_peak_memory_stats(device)
            if not trial.ok(value, 2):
                return False
            return torch.cuda.max_memory_reserved(device) <= target

        lo = bisect_fits(fits)
        best = lo
        for value in range(max(1, int(lo * 0.95)), min(HIGH, int(lo * 1.05) + 1) + 1):
            if fits(value):
                best = max(best, value)
    return best


# -- output ----------------------------------------------------------------------------------------


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        f"# memfit fit: search cost ({meta['mode']})",
        "",
        f"{meta['date']}, {meta['machine']}, torch {meta['torch']}. Command: `{meta['command']}`.",
        "",
        f"Lightning: {meta['lightning']}. Accelerate: {ACCELERATE_SOURCE}.",
        "",
        "| workload | budget | method | margin | trials | steps | OOMs | value | true max at "
        "margin | fraction | above max | wall s (trace incl.) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in rows:
        fraction = f"{r['fraction']:.1%}" if r["fraction"] is not None else "-"
        lines.append(
            f"| {r['workload']} | {format_bytes(r['budget_bytes'])} | {r['method']} | "
            f"{r['margin']:.0%} | {r['trials']} | {r['steps']} | {r['ooms']}"
            f"{' +' + str(r['uncaught_ooms']) + ' uncaught' if r['uncaught_ooms'] else ''} | "
            f"{r['value']} | {r['true_max']} | {fraction} | {'YES' if r['above_max'] else 'no'} "
            f"| {r['wall_seconds']:.1f} |"
        )
    lines += ["", *summary(rows)]
    return "\n".join(lines) + "\n"


def summary(rows: list[dict[str, Any]]) -> list[str]:
    out = [
        "| method | cases | mean trials | mean steps | OOMs | min fraction | above max "
        "| mean wall s (trace incl.) |"
    ]
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|")
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == method]
        fractions = [r["fraction"] for r in mine if r["fraction"] is not None]
        out.append(
            f"| {method} | {len(mine)} | {sum(r['trials'] for r in mine) / len(mine):.1f} | "
            f"{sum(r['steps'] for r in mine) / len(mine):.1f} | "
            f"{sum(r['ooms'] for r in mine)} | "
            f"{min(fractions):.1%} | {sum(r['above_max'] for r in mine)} | "
            f"{sum(r['wall_seconds'] for r in mine) / len(mine):.1f} |"
            if fractions
            else f"| {method} | {len(mine)} | - | - | - | - | - | - |"
        )
    memfit = [r for r in rows if r["method"].startswith("memfit (traced")]
    goal = all(
        r["fraction"] is not None
        and r["fraction"] >= 0.97
        and not r["above_max"]
        and r["trials"] <= 3
        and not r["uncaught_ooms"]
        for r in memfit
    )
    out += [
        "",
        "Goal (memfit with a traced prior: >= 97% of the true max, never above, <= 3 probes, "
        f"no uncaught OOM): {'met' if goal else 'NOT met'} in {len(memfit)} cases.",
    ]
    for mode in ("power", "binsearch, margin 0", "binsearch, margin 5%"):
        real = {
            (r["workload"], r["budget_bytes"]): r
            for r in rows
            if r["method"] == f"Lightning BatchSizeFinder {mode}"
        }
        again = [r for r in rows if r["method"] == f"Lightning {mode} (re-implemented)"]
        pairs = [(real.get((r["workload"], r["budget_bytes"])), r) for r in again]
        pairs = [(a, b) for a, b in pairs if a is not None]
        if pairs:
            same = sum(
                a["tried"] == b["tried"] and a["value"] == b["value"] and a["ooms"] == b["ooms"]
                for a, b in pairs
            )
            out.append(
                f"Re-implemented Lightning {mode} rule: the same sizes tried, OOMs and result as "
                f"the real BatchSizeFinder in {same} of {len(pairs)} cases."
            )
    return out


# -- the CUDA allocator replayed on the CPU (--replayed) ------------------------------------------
#
# On a GPU a probe's reserved memory is a step function of the batch (20 MiB segments, cached
# blocks given back at the cap). Without a GPU, the "device" here is the caching allocator
# model (memfit.allocator.model) replaying a step's allocations under the same cap that
# set_per_process_memory_fraction puts on the real allocator, with what a fake-tensor trace
# does not see on a real GPU added on purpose. memfit.fit runs unchanged against it (its CUDA
# meter replaced by one that replays), with a prior traced on the CPU; the rule of the H100
# run (an affine line through reserved peaks) runs beside it on the same device.

#: Perturbations of the traced sequence: what the real GPU adds that the trace cannot see.
PERTURBATIONS = {
    "exact": "the trace's own allocations",
    "mild": "activations 3% larger, a kernel workspace (0.5 MiB + 64 B per item) around every "
    "tenth allocation",
    "unknown-ws": "mild, and an 8.125 MiB workspace the trace knows nothing of, all run long",
}
REPLAYED_AT = (768, 2304, 6144)


def perturbed(traced: Any, kind: str) -> Any:
    """The traced :class:`~memfit.estimate.torch._sequence.SequenceModel` as a real GPU runs it."""
    from memfit.estimate.torch._sequence import SequenceModel

    if kind == "exact":
        return traced
    allocs: list[bool] = []
    records: list[int] = []
    intercepts: list[float] = []
    slopes: list[float] = []
    extra = max(traced.records) + 1
    if kind == "unknown-ws":
        allocs.append(True)
        records.append(extra)
        intercepts.append(8.125 * MiB)
        slopes.append(0.0)
        extra += 1
    count = 0
    for is_alloc, record, a, b in zip(
        traced.allocs, traced.records, traced.intercepts, traced.slopes, strict=True
    ):
        allocs.append(is_alloc)
        records.append(record)
        intercepts.append(a)
        slopes.append(b * 1.03)
        if is_alloc:
            count += 1
            if count % 10 == 0:
                for flag in (True, False):
                    allocs.append(flag)
                    records.append(extra)
                    intercepts.append(0.5 * MiB)
                    slopes.append(64.0)
                extra += 1
    return SequenceModel(tuple(allocs), tuple(records), tuple(intercepts), tuple(slopes))


class ReplayedCuda(fit_mod._CudaMeter):
    """memfit.fit's CUDA meter, with the allocator model under the cap as the GPU."""

    def __init__(self, gpu: Any, budget: int) -> None:
        super().__init__(0)
        self.name = "cuda:replayed"
        self.gpu = gpu
        self.budget = budget
        self.cap: int | None = None
        self.peaks = (0, 0)

    def default_budget(self) -> int:
        return self.budget

    @contextmanager
    def capped(self, budget: int) -> Iterator[None]:
        self.cap = budget
        try:
            yield
        finally:
            self.cap = None

    def before_probe(self) -> None:
        self.peaks = (0, 0)

    def after_probe(self) -> int | None:
        self.last_reserved = self.peaks[1]
        return self.peaks[0]

    def release(self) -> None:
        pass

    def run(self, value: int) -> None:
        got = self.gpu.replay(value, limit_bytes=self.cap)
        self.peaks = (got.allocated_peak, got.reserved_peak)
        if not got.fits:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB")


def replayed_true_max(gpu: Any, budget: int, margin: float) -> int:
    """The largest batch that runs under the cap with its reserved peak within the margin:
    a bisection, then every batch up to 35% above it: a step function need not be monotone
    (a batch can run where a smaller one broke the margin, its segments packed otherwise)."""
    target = int(budget * (1 - margin))

    def fits(v: int) -> bool:
        return bool(gpu.replay(v, limit_bytes=budget, target_bytes=target).fits)

    lo = bisect_fits(fits)
    best = lo
    for v in range(lo + 1, min(HIGH, int(lo * 1.35) + 1) + 1):
        if fits(v):
            best = v
    return best


def reserved_line_search(gpu: Any, budget: int, margin: float, prior: Any) -> tuple[int, int]:
    """The H100 run's rule: the affine search over reserved peaks with the reserved-level
    prior, under the cap; returns (value, probes)."""
    from memfit.core.search import Probe, best_probe, next_probe

    search_prior = fit_mod.prior_from(prior, reserved=True)
    history: list[Any] = []
    while len(history) < 16:
        value = next_probe(
            history, low=1, high=HIGH, budget=budget, margin=margin, prior=search_prior
        )
        if value is None:
            break
        got = gpu.replay(value, limit_bytes=budget)
        history.append(Probe(value, got.reserved_peak, got.fits))
    best = best_probe(history, budget=budget, margin=margin)
    return (best.value if best is not None else 0), len(history)


def replayed_case(workload: Workload, kind: str, at: int, margin: float) -> dict[str, Any]:
    """One workload, perturbation, budget and margin on the replayed allocator."""
    from memfit.estimate.torch.trace import estimate_torch

    step = workload.step
    base = estimate_torch(
        step.build, step.step, step.make_batch, [1024, 4096], kernel_scratch=False
    )
    assert base.sequence is not None
    gpu = perturbed(base.sequence, kind)
    # the budget at which ``at`` just keeps the margin (rounded up: rounded down, ``at``
    # itself would break the margin by a byte and sit on the edge of a segment step)
    reserved = gpu.replay(at).reserved_peak
    budget = math.ceil(reserved / (1 - margin))
    while math.floor(budget * (1 - margin)) < reserved:
        budget += 1
    truth = replayed_true_max(gpu, budget, margin)
    prior = trace_prior(step, low=1, high=HIGH, budget=budget, margin=margin, device="cuda")
    meter = ReplayedCuda(gpu, budget)
    chooser = fit_mod._choose_meter
    fit_mod._choose_meter = lambda device: meter  # type: ignore[assignment]
    try:
        result = fit(meter.run, low=1, high=HIGH, budget=budget, margin=margin, prior=prior)
        value, probes, ooms = result.value, len(result.probes), result.oom_count
    except InfeasiblePlan:
        value, probes, ooms = 0, 0, 0
    finally:
        fit_mod._choose_meter = chooser  # type: ignore[assignment]
    old_value, old_probes = reserved_line_search(gpu, budget, margin, prior)
    return {
        "workload": workload.name,
        "perturbation": kind,
        "budget_at": at,
        "budget_bytes": budget,
        "margin": margin,
        "true_max": truth,
        "value": value,
        "probes": probes,
        "ooms": ooms,
        "fraction": round(value / truth, 4) if truth else None,
        "above_max": value > truth,
        "reserved_line_value": old_value,
        "reserved_line_probes": old_probes,
        "reserved_line_fraction": round(old_value / truth, 4) if truth else None,
    }


def replayed_markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        f"{meta['date']}, {meta['machine']}, torch {meta['torch']}: `{meta['command']}`",
        "",
        "| workload | device adds | budget (reserved at) | margin | true max | memfit: value "
        "(fraction) | probes | OOMs | reserved-line rule: value (fraction) | probes |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        frac = "n/a" if r["fraction"] is None else f"{100 * r['fraction']:.1f}%"
        old = (
            "n/a"
            if r["reserved_line_fraction"] is None
            else (f"{100 * r['reserved_line_fraction']:.1f}%")
        )
        lines.append(
            f"| {r['workload']} | {r['perturbation']} | {r['budget_bytes'] / MiB:.1f} MiB "
            f"({r['budget_at']}) | {r['margin']:.0%} | {r['true_max']} | {r['value']} ({frac}) "
            f"| {r['probes']} | {r['ooms']} | {r['reserved_line_value']} ({old}) | "
            f"{r['reserved_line_probes']} |"
        )
    lines.append("")
    for kind in PERTURBATIONS:
        part = [r for r in rows if r["perturbation"] == kind and r["fraction"] is not None]
        if not part:
            continue
        goal = sum(1 for r in part if r["fraction"] >= 0.97 and r["probes"] <= 3)
        lines.append(
            f"{kind} ({PERTURBATIONS[kind]}): {len(part)} cases; memfit min "
            f"{100 * min(r['fraction'] for r in part):.1f}%, mean probes "
            f"{sum(r['probes'] for r in part) / len(part):.1f}, >= 97% in <= 3 probes: "
            f"{goal}/{len(part)}, above max: {sum(r['above_max'] for r in part)}; "
            f"reserved-line rule min "
            f"{100 * min(r['reserved_line_fraction'] for r in part):.1f}%, mean probes "
            f"{sum(r['reserved_line_probes'] for r in part) / len(part):.1f}"
        )
    return "\n".join(lines) + "\n"


def main_replayed() -> int:
    rows = []
    for workload in WORKLOADS:
        for kind in PERTURBATIONS:
            for at in REPLAYED_AT:
                for margin in (0.0, 0.05):
                    rows.append(replayed_case(workload, kind, at, margin))
                    print(rows[-1], file=sys.stderr, flush=True)
    meta = {
        "date": utc_minute(),
        "machine": f"{platform.node()} ({os.cpu_count()} CPU cores, {platform.system()})",
        "torch": torch.__version__,
        "command": "python bench/fit_search.py --replayed",
    }
    text = replayed_markdown(rows, meta)
    write_results("fit_search_replayed", {"meta": meta, "rows": rows}, text)
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one budget per workload")
    parser.add_argument("--cuda", action="store_true", help="run on the CUDA GPU")
    parser.add_argument(
        "--replayed",
        action="store_true",
        help="memfit's CUDA search on the caching allocator model replayed on the CPU",
    )
    parser.add_argument(
        "--reimplemented",
        action="store_true",
        help="also run the re-implemented Lightning rules beside the real BatchSizeFinder",
    )
    args = parser.parse_args(argv)
    if args.replayed:
        return main_replayed()
    if args.cuda and not torch.cuda.is_available():
        print("--cuda: torch sees no CUDA device here", file=sys.stderr)
        return 2
    version = lightning_version()
    lightning: tuple[str, ...] = ("real",) if version else ("reimplemented",)
    if version and args.reimplemented:
        lightning = ("real", "reimplemented")
    real_note = (
        f"the real lightning.pytorch.callbacks.BatchSizeFinder (lightning {version}, defaults:"
        " init_val 2, steps_per_trial 3, max_trials 25, max_val 8192, binsearch margin 5%) in"
        " a lightning.Trainer; the simulated GPU's OOM is worded as CUDA's, which is what"
        " Lightning's is_oom_error matches"
    )
    lightning_note = {
        ("real",): real_note,
        ("reimplemented",): f"{LIGHTNING_REIMPLEMENTED}; lightning is not installed here",
        ("real", "reimplemented"): f"{real_note}; and a {LIGHTNING_REIMPLEMENTED}",
    }[lightning]
    gc.collect()
    gc.freeze()  # torch and lightning's objects: keep every later gc.collect short
    rows: list[dict[str, Any]] = []
    for workload in WORKLOADS:
        if args.cuda:
            budgets = cuda_budgets(workload, args.quick)
        else:
            budgets = workload.budgets[1:2] if args.quick else workload.budgets
        curve = None if args.cuda else SimulatedCurve(workload)
        for budget in budgets:
            print(f"{workload.name} at {format_bytes(budget)} ...", file=sys.stderr, flush=True)
            rows.extend(compare(workload, budget, args.cuda, curve, lightning))
    mode = "CUDA" if args.cuda else "CPU, simulated GPU"
    cores = f"{os.cpu_count()} CPU cores"
    machine = f"{torch.cuda.get_device_name()}, {cores}" if args.cuda else cores
    meta = {
        "mode": mode,
        "date": utc_minute(),
        "machine": f"{platform.node()} ({machine}, {platform.system()})",
        "torch": torch.__version__,
        "command": "python bench/fit_search.py"
        + (" --cuda" if args.cuda else "")
        + (" --quick" if args.quick else "")
        + (" --reimplemented" if args.reimplemented else ""),
        "lightning": lightning_note,
        "accelerate": ACCELERATE_SOURCE,
    }
    suffix = "_cuda" if args.cuda else ""
    text = markdown(rows, meta)
    write_results(f"fit_search{suffix}", {"meta": meta, "rows": rows}, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
