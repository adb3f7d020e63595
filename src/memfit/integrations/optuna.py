"""Optuna: suggest only configurations that fit, and prune the trials that still run out.

Optuna drives most reinforcement-learning hyperparameter searches (rl-zoo3's among them).
Two pieces make a study memory-aware without changing its sampler or its storage:

* :func:`suggest` asks the trial for a value of every knob of a workload (through
  ``trial.suggest_int``, so any sampler, pruner and storage work unchanged) and returns only
  configurations that keep the workload's rules and fit the GPU by memfit's plan
  (:func:`memfit.planning.feasible`). Knobs in ``fixed`` stay as given.
* :func:`pruned_on_oom` (a context manager) and :func:`objective` (a decorator) report a
  trial whose run still dies of out-of-memory, or whose guard gives up
  (:class:`memfit.OutOfMemory`), as *pruned*, with the reason in the trial's user
  attributes, never as a silent failure.

How the knobs reach the sampler. Optuna refuses a categorical parameter whose choices change
from trial to trial, and the values that fit depend on the knobs chosen before (a larger
replay buffer leaves room for a smaller batch only). So each knob is one integer parameter
``memfit.<knob>`` with a fixed range, ``0 .. len(declared values) - 1``: its position in the
knob's declared domain. The position is mapped, in proportion, onto the values that still
fit given the knobs before it (in the workload's priority order), so every feasible
configuration is reachable, a larger position never gives a smaller value, and the
distribution never changes: relative samplers (TPE multivariate, CMA-ES, GP) see one fixed
space, and workers with different GPUs can share one study (each maps a position onto what
fits its own card). The knob values themselves are in the trial's user attribute
``memfit`` (:func:`knobs` reads them back, from a live or a finished trial).

Scaling out is Optuna's own: give every worker the same RDB storage
(``optuna.create_study(storage="sqlite:///study.db", study_name=..., load_if_exists=True)``
or a PostgreSQL/MySQL URL) and run the same objective on each; nothing here is per process
but a cache of the feasible space.

Optuna is imported when a function here is called, not when this module is imported.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from memfit._checks import require as require_arg
from memfit._checks import require_callable, require_object, require_positive_int
from memfit._lazy import require
from memfit.allocator.xla_fraction import DEFAULT_MARGIN
from memfit.core.workload import Workload
from memfit.errors import ConfigError, OutOfMemory
from memfit.hardware.catalog import GpuSpec
from memfit.integrations._feasible import space
from memfit.runtime.oom import forget_exception, is_oom

__all__ = [
    "ATTR",
    "PARAM_PREFIX",
    "PRUNED_ATTR",
    "knobs",
    "objective",
    "position_to_index",
    "pruned_on_oom",
    "space",
    "suggest",
]

#: Prefix of the Optuna parameter that holds a knob's position (``memfit.buffer_size``).
PARAM_PREFIX = "memfit."
#: User attribute with the knobs :func:`suggest` chose and the plan's figures for them.
ATTR = "memfit"
#: User attribute that says why a trial was pruned (``reason``, ``message``).
PRUNED_ATTR = "memfit_pruned"

R = TypeVar("R")

_TRIAL_HINT = "pass the optuna.Trial your objective receives (study.optimize(objective))"


def _require_trial(trial: Any, *, suggests: bool = True) -> None:
    """An Optuna trial: what :func:`suggest` and :func:`pruned_on_oom` call on it."""
    require_object(
        "trial",
        trial,
        methods=("suggest_int", "set_user_attr") if suggests else ("set_user_attr",),
        what="an optuna.Trial",
        hint=_TRIAL_HINT,
    )


def _require_position(position: Any, positions: int, *, key_path: str) -> int:
    """A position ``0 .. positions - 1`` (an Optuna sampler's answer, checked: a trial
    whose ``suggest_int`` returns anything else is not one memfit can map)."""
    require_arg(key_path, position, "any_int", hint=_TRIAL_HINT)
    if not 0 <= position < positions:
        raise ConfigError(
            f"{key_path} {position if abs(position) < 10**18 else 'of many digits'} is not "
            f"one of 0 .. {positions - 1}",
            key_path=key_path,
            hint="the trial's suggest_int must return a value in the range it was asked for",
        )
    return int(position)


def position_to_index(position: int, positions: int, options: int) -> int:
    """Map a position ``0 .. positions - 1`` onto ``0 .. options - 1`` in proportion
    (rounded), so every option is reached when ``options <= positions`` and a larger position
    never gives a smaller index.

    >>> [position_to_index(p, 5, 3) for p in range(5)]
    [0, 1, 1, 2, 2]

    Raises:
        ConfigError: When ``positions`` or ``options`` is not a positive integer, or
            ``position`` is not one of ``0 .. positions - 1``.
    """
    require_positive_int("positions", positions)
    require_positive_int("options", options)
    _require_position(position, positions, key_path="position")
    if options <= 1 or positions <= 1:
        return 0
    return (2 * position * (options - 1) + (positions - 1)) // (2 * (positions - 1))


def suggest(
    trial: Any,
    workload: Workload | str | Path,
    *,
    gpu: str | int | GpuSpec = "local",
    fixed: Mapping[str, int] | None = None,
    margin: float | str = DEFAULT_MARGIN,
    host_memory_bytes: int | None = None,
    device_index: int = 0,
) -> dict[str, int | str]:
    """Suggest a value for every knob of ``workload``, from the configurations that keep its
    rules and fit ``gpu``.

    Args:
        trial: An ``optuna.Trial`` (or anything with ``suggest_int`` and ``set_user_attr``).
        workload: A workload, a path to one, or a bundled name.
        gpu: The GPU to fit, as :func:`memfit.plan` takes it (``"local"``: this machine's).
        fixed: Knob values (or settings) that stay as given.
        margin: Safety margin, a fraction of the GPU's total.
        host_memory_bytes: Host RAM for a host-placed replay buffer.
        device_index: Which local GPU, for ``gpu="local"``.

    Returns:
        The knob values (as :attr:`memfit.Plan.knobs` names them: every knob of the
        workload, a derived accumulation knob and the planner's placement knob included).
        They are also stored in the trial's user attribute :data:`ATTR` with the plan's
        ``predicted_bytes``, ``budget_bytes`` and the GPU.

    Raises:
        ConfigError: On a bad trial, workload, GPU, pinned value or size, or a trial whose
            ``suggest_int`` returns a position outside the range asked.
        InfeasiblePlan: When nothing fits the GPU (no trial can run).
    """
    _require_trial(trial)
    feasible_space = space(
        workload,
        gpu=gpu,
        fixed=fixed,
        margin=margin,
        host_memory_bytes=host_memory_bytes,
        device_index=device_index,
    )
    pinned = dict(fixed or {})
    given: dict[str, int | str] = {}
    for name in feasible_space.order:
        options = feasible_space.values(name, given)
        if not options:  # cannot happen: every prefix taken comes from a feasible configuration
            raise ConfigError(f"no feasible value of {name} after {given}", key_path=name)
        if name in pinned:
            given[name] = options[0]
            continue
        positions = len(feasible_space.domains[name])
        position = _require_position(
            trial.suggest_int(PARAM_PREFIX + name, 0, positions - 1),
            positions,
            key_path="trial",
        )
        given[name] = options[position_to_index(position, positions, len(options))]
    index = feasible_space.index(given)
    if index is None:  # pragma: no cover - every step above kept a feasible prefix
        raise ConfigError(f"{given} is not a feasible configuration", key_path="knobs")
    chosen = dict(feasible_space.configs[index])
    trial.set_user_attr(
        ATTR,
        {
            "knobs": chosen,
            "gpu": feasible_space.gpu,
            "predicted_bytes": feasible_space.predicted_bytes[index],
            "used_bytes": feasible_space.used_bytes[index],
            "budget_bytes": feasible_space.budget_bytes,
            "feasible_configurations": len(feasible_space),
        },
    )
    return chosen


def knobs(trial: Any) -> dict[str, int | str] | None:
    """The knob values :func:`suggest` chose for a trial (live or finished: ``study.trials``,
    ``study.best_trial``), or ``None`` when it did not run on this trial.

    Raises:
        ConfigError: When ``trial`` is not an Optuna trial (it has no ``user_attrs``).
    """
    attrs = getattr(trial, "user_attrs", None)
    if not isinstance(attrs, Mapping):
        raise ConfigError(
            f"trial must be an optuna.Trial or FrozenTrial, not {type(trial).__name__} "
            "(it has no user_attrs)",
            key_path="trial",
            hint="pass a trial of the study (study.trials, study.best_trial)",
        )
    record = attrs.get(ATTR)
    if not isinstance(record, dict) or not isinstance(record.get("knobs"), dict):
        return None
    return dict(record["knobs"])


def _free_memory() -> None:
    """Collect the failed attempt's garbage and return cached CUDA blocks."""
    gc.collect(1)
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


@contextlib.contextmanager
def pruned_on_oom(trial: Any) -> Iterator[None]:
    """Report an out-of-memory inside the block as a pruned trial, with the reason.

    ``with pruned_on_oom(trial): run(knobs)``: an out-of-memory error
    (:func:`memfit.is_oom`: ``torch.OutOfMemoryError``, JAX's ``RESOURCE_EXHAUSTED``, host
    ``MemoryError``) sets the user attribute :data:`PRUNED_ATTR` to ``{"reason":
    "out_of_memory", "message": ...}``, and a guard that gave up (:class:`memfit.OutOfMemory`)
    to ``{"reason": "guard_gave_up", "message", "tried", "peak_bytes", "budget_bytes"}``;
    then ``optuna.TrialPruned`` is raised. The failed attempt's frames are cleared and its
    memory freed first (the next trial in this process starts clean). Any other error passes
    through unchanged (Optuna records it as a failure).

    Raises:
        optuna.TrialPruned: After an out-of-memory inside the block.
        ConfigError: When ``trial`` is not an Optuna trial (checked on entering).
    """
    _require_trial(trial, suggests=False)
    optuna = require("optuna")
    record: dict[str, Any] | None = None
    try:
        yield
    except BaseException as exc:
        if not is_oom(exc):
            raise
        if isinstance(exc, OutOfMemory):
            record = {
                "reason": "guard_gave_up",
                "tried": list(exc.tried),
                "peak_bytes": exc.peak_bytes,
                "budget_bytes": exc.budget_bytes,
            }
        else:
            record = {"reason": "out_of_memory", "type": type(exc).__name__}
        record["message"] = forget_exception(exc)[:2000]
    _free_memory()
    if record is None:
        return
    trial.set_user_attr(PRUNED_ATTR, json.loads(json.dumps(record, default=str)))
    chosen = knobs(trial)
    where = f" with {chosen}" if chosen else ""
    raise optuna.TrialPruned(f"memfit: {record['reason']}{where}: {record['message'][:200]}")


def objective(fn: Callable[[Any], R]) -> Callable[[Any], R]:
    """Decorate an Optuna objective so out-of-memory prunes the trial
    (:func:`pruned_on_oom` around the whole objective).

    Raises:
        ConfigError: When ``fn`` is not callable.
    """
    require_callable("fn", fn, hint="decorate the objective: @objective def f(trial): ...")

    @functools.wraps(fn)
    def wrapped(trial: Any) -> R:
        with pruned_on_oom(trial):
            result = fn(trial)
        return result

    return wrapped
