"""From a workload file's ``estimator: torch|jax`` + ``factory: module:function`` to measured terms.

The planner (``memfit.planning``) calls :func:`measure` for a workload that names a factory:
the factory is imported, its step traced at a few values of its batch knob spanning the knob's
range, and the affine fit handed back as :class:`memfit.core.measured.MeasuredTerms`, the plain
data the pure planner takes in place of its analytic parameter and activation terms.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from memfit.core.measured import MeasuredTerms
from memfit.errors import ConfigError, MemfitError
from memfit.estimate import JaxStep, TorchStep

if TYPE_CHECKING:  # pragma: no cover
    from memfit.core.workload import Workload

__all__ = ["knob_trace_values", "load_factory", "make_step", "measure"]

_FACTORY_HINT = (
    "write factory: module:function (or path/to/file.py:function), where module is importable "
    "from the current directory (or PYTHONPATH) and function() returns "
    "memfit.estimate.TorchStep or JaxStep"
)


def _import_file(path_text: str, key_path: str) -> Any:
    """Import the Python file at ``path_text`` (``est/cnn84.py``) as a module of its own; its
    folder goes first on ``sys.path`` so that it can import its neighbours."""
    import hashlib
    import importlib.util

    path = os.path.abspath(path_text)
    if not os.path.isfile(path):
        raise ConfigError(
            f"no such Python file: {path_text!r}", key_path=key_path, hint=_FACTORY_HINT
        )
    folder = os.path.dirname(path)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    stem = os.path.splitext(os.path.basename(path))[0]
    digest = hashlib.sha1(path.encode("utf-8")).hexdigest()[:10]
    name = f"_memfit_factory_{digest}_{stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(
            f"cannot load {path_text!r} as Python", key_path=key_path, hint=_FACTORY_HINT
        )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _is_file_spec(module_name: str) -> bool:
    """``est/cnn84.py`` or ``cnn84.py``: a file, not a dotted module name."""
    return module_name.endswith(".py") or "/" in module_name or os.sep in module_name


def load_factory(spec: str, *, key_path: str = "factory") -> Callable[[], Any]:
    """Import ``module:function`` (the current directory first on ``sys.path``), or
    ``path/to/file.py:function``.

    Raises:
        ConfigError: When ``spec`` is not ``module:function``, the module cannot be imported,
            or it has no callable of that name.
    """
    module_name, sep, func_name = spec.rpartition(":")
    if not sep or not module_name or not func_name:
        raise ConfigError(f"not module:function: {spec!r}", key_path=key_path, hint=_FACTORY_HINT)
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        if _is_file_spec(module_name):
            module = _import_file(module_name, key_path)
        else:
            module = importlib.import_module(module_name)
    except MemfitError:
        raise
    except ImportError as exc:
        raise ConfigError(
            f"cannot import module {module_name!r}: {exc}", key_path=key_path, hint=_FACTORY_HINT
        ) from exc
    except Exception as exc:  # the user's module fails while it loads (SyntaxError, ...)
        raise ConfigError(
            f"importing module {module_name!r} failed: {type(exc).__name__}: {exc}",
            key_path=key_path,
            hint="fix the module so `python -c 'import "
            f"{module_name}'` works; rerun with --debug for the traceback",
        ) from exc
    func: Any = module
    for part in func_name.split("."):
        func = getattr(func, part, None)
        if func is None:
            raise ConfigError(
                f"module {module_name!r} has no {func_name!r}",
                key_path=key_path,
                hint=_FACTORY_HINT,
            )
    if not callable(func):
        raise ConfigError(f"{spec!r} is not callable", key_path=key_path, hint=_FACTORY_HINT)
    factory: Callable[[], Any] = func
    return factory


def make_step(spec: str, *, key_path: str = "factory") -> TorchStep | JaxStep:
    """Call the factory named by ``spec`` and check it returns a :class:`TorchStep` or
    :class:`JaxStep`.

    Raises:
        ConfigError: When the factory cannot be loaded, raises, or returns something else.
    """
    factory = load_factory(spec, key_path=key_path)
    try:
        step = factory()
    except MemfitError:
        raise
    except Exception as exc:  # the user's factory fails: their bug, not memfit's
        raise ConfigError(
            f"{spec}() failed: {type(exc).__name__}: {exc}",
            key_path=key_path,
            hint="the factory is called with no arguments and returns a TorchStep or JaxStep; "
            "rerun with --debug for the traceback",
        ) from exc
    if not isinstance(step, (TorchStep, JaxStep)):
        raise ConfigError(
            f"{spec} returned {type(step).__name__}, not TorchStep or JaxStep",
            key_path=key_path,
            hint=_FACTORY_HINT,
        )
    return step


def knob_trace_values(low: int, high: int, default: int | None = None) -> list[int]:
    """Three values spanning ``[low, high]`` to trace at: the ends and a middle one.

    Fake tensors cost the same at any size, so the points span the whole range the planner
    searches, which keeps the fitted line honest at both ends.

    >>> knob_trace_values(8, 512)
    [8, 64, 512]
    >>> knob_trace_values(4, 4)
    [4]
    """
    if high <= low:
        return [low]
    middle = default if default is not None and low < default < high else int((low * high) ** 0.5)
    return sorted({low, max(low, min(high, middle)), high})


def _values_for(workload: Workload, knob: str) -> list[int]:
    spec = workload.knobs.get(knob)
    if spec is not None:
        if spec.choices is not None:
            ordered = sorted(spec.choices)
            return sorted({ordered[0], ordered[len(ordered) // 2], ordered[-1]})
        if spec.min is not None and spec.max is not None:
            return knob_trace_values(spec.min, spec.max, spec.default)
    if knob in workload.settings:
        value = workload.settings[knob]
        return sorted({max(1, value // 2), value})
    raise ConfigError(
        f"the factory's batch knob {knob!r} is neither a knob nor a setting of the workload",
        key_path="factory",
        hint=f"add {knob} under knobs: (or settings:), or set batch_knob in the factory's step",
    )


def measure(
    workload: Workload, *, gpu: str | None = None, batch_sizes: Sequence[int] | None = None
) -> MeasuredTerms:
    """Trace the workload's factory step and return its measured terms for the planner.

    Args:
        workload: A workload with ``estimator: torch`` or ``jax`` and ``factory``.
        gpu: GPU name for the device-level figures (does not change the allocated terms).
        batch_sizes: Values of the batch knob to trace; default three spanning its range.

    Raises:
        ConfigError: When the workload has no factory, the factory is wrong, its framework
            does not match ``estimator``, or its batch knob is not in the workload.
        EstimateError: When the step cannot be traced.
    """
    if workload.estimator == "analytic" or not workload.factory:
        raise ConfigError(
            "the workload does not name a traced estimator",
            key_path="estimator",
            hint="set estimator: torch (or jax) and factory: module:function",
        )
    step = make_step(workload.factory)
    want = TorchStep if workload.estimator == "torch" else JaxStep
    if not isinstance(step, want):
        raise ConfigError(
            f"estimator is {workload.estimator} but {workload.factory} returned "
            f"{type(step).__name__}",
            key_path="estimator",
            hint="make estimator match what the factory returns (TorchStep: torch, JaxStep: jax)",
        )
    sizes = list(batch_sizes) if batch_sizes is not None else _values_for(workload, step.batch_knob)
    if len(set(sizes)) < 2:
        sizes = sorted({sizes[0], sizes[0] * 2})
    if isinstance(step, TorchStep):
        from memfit.estimate.torch.trace import estimate_torch

        estimate = estimate_torch(
            step.build, step.step, step.make_batch, sizes, gpu=gpu, batch_knob=step.batch_knob
        )
        return estimate.to_measured()
    from memfit.estimate.xla.step import estimate_jax_sweep

    sweep = estimate_jax_sweep(step.fn, step.make_args, sizes, gpu=gpu, batch_knob=step.batch_knob)
    fit = sweep.fit
    if fit is None:  # pragma: no cover - sizes hold two distinct values by construction
        raise ConfigError("need two distinct batch sizes", key_path="batch_sizes")
    return MeasuredTerms(
        knob=step.batch_knob,
        fixed_bytes={"executable_fixed": round(fit.intercept)},
        per_item_bytes=fit.slope,
        residual_bytes=round(fit.residual + 0.5),
        source="xla memory_analysis",
        notes=sweep.points[-1].notes,
    )
