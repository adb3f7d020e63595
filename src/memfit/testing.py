"""Chaos testing for training loops: ``memfit.testing.inject_oom``.

Under :func:`inject_oom` each PyTorch operation dispatched in a chosen phase raises
``torch.OutOfMemoryError`` with probability ``rate``, drawn from a seeded generator, so a run
is reproducible. The error is raised *before* the operation runs, so the operation has no
effect, as when the caching allocator refuses the operation's first allocation.

The phase of an operation is found this way:

* ``"optimizer"``: between the global ``Optimizer.step`` pre-hook and post-hook
  (``torch.optim.optimizer.register_optimizer_step_pre_hook`` / ``..._post_hook``). A step
  that raises never reaches its post-hook; the phase then ends when memfit raises the
  injected error itself, or at the next operation run with gradients enabled (an optimizer
  step runs with gradients disabled).
* ``"backward"``: while the autograd engine runs a graph task
  (``torch._C._current_graph_task_id() != -1``), i.e. inside ``backward()`` or
  ``torch.autograd.grad``.
* ``"forward"``: everything else.

Four kinds of operation never fail, because they take no memory from the allocator: views
(``slice``, ``view``, ``t``...), reads of a scalar to the host (``tensor.item()``),
operations inside :func:`memfit.runtime.oom.no_alloc_section` (memfit's own commit steps,
which only write into existing memory), and, unless ``inplace=True``, operations that only
write into tensors they were given (``add_``, ``_foreach_mul_``, ``copy_``, ``out=``
variants: a real out-of-memory strikes at an allocation, and these make none, so injecting
there would test failures that cannot happen, such as an optimizer step that fails while
counting its steps).

Under a ``TorchDispatchMode`` PyTorch does not raise the version counters of the tensors an
in-place operation writes; :func:`inject_oom` raises them itself, so code that reads
``tensor._version`` (TrainGuard does, to tell whether a failed ``optimizer.step()`` changed
anything) sees what it would see without the mode.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from memfit._checks import require, require_int_list, require_number_in, require_str_list
from memfit.errors import ConfigError
from memfit.runtime.oom import in_no_alloc_section

__all__ = ["PHASES", "InjectedOom", "chaos_active", "inject_oom", "real_cpu_peak", "run_steps"]

_ACTIVE = [0]


def chaos_active() -> bool:
    """Whether an :func:`inject_oom` context is active.

    Guards do not change their policy under it (a chaos test exercises the policy the run
    will use); it is for code that wants to label its output as a chaos run.
    """
    return _ACTIVE[0] > 0


# Operator namespaces that never allocate tensor memory (profiler bookkeeping).
_NEVER = frozenset({"profiler"})
# Operators that return a Python number, not a tensor (``tensor.item()``, ``float(tensor)``):
# they copy one value to the host and take nothing from the device's allocator.
_SCALAR_READS = frozenset({"_local_scalar_dense"})

#: The phases ``inject_oom`` can target.
PHASES: tuple[str, ...] = ("forward", "backward", "optimizer")


@dataclass
class InjectedOom:
    """What one :func:`inject_oom` context did.

    Attributes:
        rate: Probability per operation.
        seed: Seed of the generator.
        where: The phases targeted.
        ops_seen: Operations dispatched in a targeted phase.
        raised: Errors raised, by phase.
        limit: At most this many errors are raised (``None``: no limit).
    """

    rate: float
    seed: int
    where: tuple[str, ...]
    limit: int | None = None
    ops_seen: int = 0
    raised: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PHASES, 0))

    @property
    def total_raised(self) -> int:
        """Errors raised in all phases."""
        return sum(self.raised.values())


def _writes_only_into_inputs(func: Any) -> bool:
    """An in-place or ``out=`` operation: it returns (aliases of) tensors it was given."""
    schema = func._schema
    return bool(schema.is_mutable) and all(r.alias_info is not None for r in schema.returns)


def _check(rate: float, where: Sequence[str], limit: int | None) -> tuple[str, ...]:
    require_number_in(
        "rate",
        rate,
        low=0,
        high=1,
        what="a probability in [0, 1]",
        hint="use a small rate such as 0.01 (one operation in a hundred)",
    )
    if isinstance(where, str):
        where = (where,)
    phases = tuple(require_str_list("where", where))
    unknown = [p for p in phases if p not in PHASES]
    if unknown or not phases:
        raise ConfigError(
            f"unknown phase(s) {unknown or list(phases)!r}",
            key_path="where",
            hint=f"choose among {', '.join(PHASES)}",
        )
    if limit is not None and limit < 0:
        raise ConfigError(f"limit must be >= 0, not {limit}", key_path="limit")
    return phases


@contextmanager
def inject_oom(
    rate: float,
    seed: int = 0,
    where: Sequence[str] = PHASES,
    *,
    limit: int | None = None,
    inplace: bool = False,
    at: Iterable[int] | None = None,
) -> Iterator[InjectedOom]:
    """Make PyTorch operations fail with ``torch.OutOfMemoryError`` at random.

    Args:
        rate: Probability that one operation in a targeted phase fails.
        seed: Seed; the same seed and the same program give the same failures.
        where: Phases to target: any of ``"forward"``, ``"backward"``, ``"optimizer"``.
        limit: Raise at most this many errors (``None``: no limit).
        inplace: Also fail operations that only write into existing tensors (harsher than
            a real out-of-memory).
        at: Fail exactly these operations instead of drawing at random: indices, from 0,
            into the operations the context sees in the targeted phases (``ops_seen``
            before each). A sweep over ``range(ops)`` puts a fault at every point of a
            step, one run each.

    Yields:
        An :class:`InjectedOom` with the counts, updated as the block runs.

    Raises:
        ConfigError: When ``rate`` is not in ``[0, 1]``, a phase is unknown, or ``limit``
            is negative.

    >>> import torch
    >>> with inject_oom(1.0, seed=0, where=("forward",)) as chaos:
    ...     try:
    ...         torch.ones(3) + 1
    ...     except torch.OutOfMemoryError:
    ...         pass
    >>> chaos.raised["forward"]
    1
    """
    require("seed", seed, "any_int")
    require("limit", limit, "int", optional=True)
    require("inplace", inplace, "bool")
    targets_list = require_int_list("at", at) if at is not None else None
    phases = _check(rate, where, limit)
    import torch
    from torch.autograd.graph import increment_version
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )
    from torch.utils._python_dispatch import TorchDispatchMode

    record = InjectedOom(rate=float(rate), seed=seed, where=phases, limit=limit)
    targets = frozenset(targets_list) if targets_list is not None else None
    rng = random.Random(seed)
    state = {"optimizer": 0}

    def _pre(optimizer: Any, args: Any, kwargs: Any) -> None:
        state["optimizer"] += 1

    def _post(optimizer: Any, args: Any, kwargs: Any) -> None:
        state["optimizer"] = max(0, state["optimizer"] - 1)

    def _phase() -> str:
        if state["optimizer"]:
            if torch.is_grad_enabled():
                state["optimizer"] = 0  # a step that raised never reached its post-hook
            else:
                return "optimizer"
        if torch._C._current_graph_task_id() != -1:
            return "backward"
        return "forward"

    current: Callable[[], str] = _phase

    def _run(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> Any:
        out = func(*args, **(kwargs or {}))
        schema = func._schema
        if schema.is_mutable:
            written: list[Any] = []
            for arg, value in zip(schema.arguments, args, strict=False):
                if arg.alias_info is not None and arg.alias_info.is_write:
                    written.extend(value if isinstance(value, (list, tuple)) else [value])
            for name, value in (kwargs or {}).items():
                spec = next((a for a in schema.arguments if a.name == name), None)
                if spec is not None and spec.alias_info is not None and spec.alias_info.is_write:
                    written.extend(value if isinstance(value, (list, tuple)) else [value])
            tensors = [t for t in written if isinstance(t, torch.Tensor)]
            if tensors:
                increment_version(tensors)
        return out

    class _InjectMode(TorchDispatchMode):  # type: ignore[no-untyped-call]
        #: TrainGuard may trust version counters under this mode (see the module's doc).
        keeps_versions = True

        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            if (
                in_no_alloc_section()
                or func.is_view
                or func.namespace in _NEVER
                or func._opname in _SCALAR_READS
                or (not inplace and _writes_only_into_inputs(func))
            ):
                return _run(func, args, kwargs)
            phase = current()
            if phase in phases:
                index = record.ops_seen
                record.ops_seen += 1
                under_limit = record.limit is None or record.total_raised < record.limit
                chosen = index in targets if targets is not None else rng.random() < record.rate
                if chosen and under_limit:
                    record.raised[phase] += 1
                    if phase == "optimizer":
                        state["optimizer"] = 0
                    raise torch.OutOfMemoryError(
                        f"CUDA out of memory. Tried to allocate 2.00 MiB (injected by "
                        f"memfit.testing.inject_oom in {phase}, {func}; seed {seed})"
                    )
            return _run(func, args, kwargs)

    pre_handle = register_optimizer_step_pre_hook(_pre)
    post_handle = register_optimizer_step_post_hook(_post)
    _ACTIVE[0] += 1
    try:
        with _InjectMode():  # type: ignore[no-untyped-call]
            yield record
    finally:
        _ACTIVE[0] -= 1
        pre_handle.remove()
        post_handle.remove()


def run_steps(step: Any, batch_size: int, steps: int = 2) -> tuple[Any, Any]:
    """Build ``step``'s model and optimiser and run ``steps`` real training steps of
    ``step.make_batch(batch_size)`` on the default device, as :func:`memfit.estimate_torch`
    traces them (each batch is dropped once its step is done).

    Returns:
        The model and optimiser: hold them while reading the device's memory.
    """
    model, opt = step.build()
    for _ in range(steps):
        batch = step.make_batch(batch_size)
        step.step(model, opt, batch)
        del batch
    return model, opt


def real_cpu_peak(step: Any, batch_size: int, steps: int = 2) -> int:
    """The peak live bytes of a real run of ``step`` on the CPU, from the CPU allocator's
    own reports (the profiler's memory events): the oracle an estimate is checked against.

    Runs :func:`run_steps` of ``step`` (a :class:`memfit.estimate.TorchStep`) under the
    profiler.

    Returns:
        The largest sum of live allocations, in bytes.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        model, opt = run_steps(step, batch_size, steps)
        del model, opt
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    live = peak = 0
    for event in events:
        live += event.nbytes()
        peak = max(peak, live)
    return peak
