"""Cleanup policies, measured: the habits practitioners have today, and a better default.

Each policy counts its calls, the cleanups it actually ran and the seconds they took
(:class:`CleanupStats`), and reports every cleanup as a ``"cleanup"``
:class:`~memfit.runtime.events.MemoryEvent`. The event's ``step`` is the training step the
caller gives (``policy(step=step)``, or ``after_call(step=lambda: step)``), ``None`` when it
gives none (``memfit report`` then places it by its time); the policy's own count of calls is
in ``data["call"]``, never passed off as a step:

* :func:`every` — clean every *n*-th call (``empty_cache`` every 10 steps, ``gc.collect``
  every 50: what many training loops do blindly);
* :func:`on_pressure` — the default: ``empty_cache`` only when the free memory or the
  fragmentation (reserved but unallocated memory) crosses a threshold;
* :func:`after_call` — a decorator that cleans after each call of a function (e.g. after
  each camera-image fetch);
* :func:`full_reset` — everything at once: ``gc.collect()``, ``empty_cache()``, IPC handles,
  peak statistics.

What "clean" means: ``torch.cuda.empty_cache()`` when torch has initialised CUDA (it returns
cached, unoccupied blocks to the driver; it frees nothing a live tensor holds), and
``gc.collect()`` when asked. On a machine without CUDA the calls are still made and timed
(``gc.collect`` costs the same everywhere), so the cost of a habit can be measured on a CPU.
"""

from __future__ import annotations

import abc
import functools
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from memfit._checks import check_int_size, require, require_count, require_object
from memfit._plain import plain_fields
from memfit.backends.live import Reading, active_reader
from memfit.errors import ConfigError
from memfit.runtime.events import EventSink, MemoryEvent, emit
from memfit.units import parse_fraction

__all__ = [
    "CleanupPolicy",
    "CleanupStats",
    "Every",
    "OnPressure",
    "PressureReading",
    "after_call",
    "every",
    "full_reset",
    "on_pressure",
    "pressure_figures",
    "read_pressure",
]

P = ParamSpec("P")
R = TypeVar("R")


@dataclass
class CleanupStats:
    """What a policy did.

    Attributes:
        calls: Times the policy was asked (once per step for :func:`every`).
        cleanups: Times it actually cleaned.
        seconds: Wall-clock seconds spent cleaning (``time.perf_counter``).
    """

    calls: int = 0
    cleanups: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain data."""
        return plain_fields(self)


def _clean(*, empty_cache: bool, gc_collect: bool, reset: bool = False) -> None:
    if gc_collect:
        gc.collect()
    from memfit.backends.live import torch_cuda, torch_reset_peak

    torch = torch_cuda()
    if torch is None:
        return
    if empty_cache:
        torch.cuda.empty_cache()
    if reset:
        torch.cuda.ipc_collect()
        torch_reset_peak(torch)


class CleanupPolicy:
    """Base of the policies: runs a cleanup, times it, counts it and reports it.

    Args:
        source: Name used in events (``"cleanup.every"``).
        empty_cache: Return cached CUDA blocks to the driver when cleaning.
        gc_collect: Run a full ``gc.collect()`` when cleaning.
        on_event: Called with a ``"cleanup"`` event after each cleanup.
    """

    def __init__(
        self,
        source: str,
        *,
        empty_cache: bool = True,
        gc_collect: bool = False,
        on_event: EventSink | None = None,
    ) -> None:
        self.source = source
        self.empty_cache = empty_cache
        self.gc_collect = gc_collect
        self.on_event = on_event
        self.stats = CleanupStats()
        self.events: list[MemoryEvent] = []

    def _called(self, step: object) -> int | None:
        """Count one call; the training step it gave, checked (see :func:`_training_step`)."""
        checked = _training_step(step)
        self.stats.calls += 1
        return checked

    def _run(self, reason: str, step: int | None, reset: bool = False, **data: Any) -> float:
        start = time.perf_counter()
        _clean(empty_cache=self.empty_cache, gc_collect=self.gc_collect, reset=reset)
        seconds = time.perf_counter() - start
        self.stats.cleanups += 1
        self.stats.seconds += seconds
        data.update(
            seconds=seconds,
            empty_cache=self.empty_cache,
            gc_collect=self.gc_collect,
            call=self.stats.calls,
        )
        event = MemoryEvent("cleanup", step, self.source, reason, data)
        self.events.append(event)
        emit(self.on_event, event)
        return seconds


def _training_step(step: object) -> int | None:
    """The training step a caller gave, checked.

    Raises:
        ConfigError: When it is neither ``None`` nor a whole number.
    """
    if step is None or (isinstance(step, int) and not isinstance(step, bool)):
        return None if step is None else check_int_size("step", step)
    raise ConfigError(
        f"step must be the training step (a whole number) or None, not {step!r}",
        key_path="step",
        hint="call the policy as policy(step=step) inside the training loop",
    )


class _PerStep(CleanupPolicy, abc.ABC):
    """A policy called once per training step that cleans when :meth:`_due` says so."""

    reset = False

    @abc.abstractmethod
    def _due(self) -> tuple[str, dict[str, Any]] | None:
        """Why to clean now and the figures for the event, or ``None`` to skip this step."""

    def __call__(self, step: int | None = None) -> bool:
        """Count one step; clean when the policy's condition holds.

        Args:
            step: The training step now, stamped on the cleanup's event (``None``: unknown).

        Returns:
            Whether it cleaned.

        Raises:
            ConfigError: When ``step`` is not a whole number or ``None``.
        """
        step = self._called(step)
        due = self._due()
        if due is None:
            return False
        reason, data = due
        self._run(reason, step, reset=self.reset, **data)
        return True


class Every(_PerStep):
    """Clean every ``n``-th call. Made by :func:`every`."""

    def __init__(
        self,
        n: int,
        *,
        empty_cache: bool = True,
        gc_collect: bool = False,
        reset: bool = False,
        on_event: EventSink | None = None,
    ) -> None:
        require_count("n", n, lo=1, what="a positive whole number of steps", hint="e.g. every(10)")
        super().__init__(
            "cleanup.every", empty_cache=empty_cache, gc_collect=gc_collect, on_event=on_event
        )
        self.n = n
        self.reset = reset

    def _due(self) -> tuple[str, dict[str, Any]] | None:
        if self.stats.calls % self.n:
            return None
        return f"scheduled cleanup every {self.n} steps", {}


def every(
    n: int,
    *,
    empty_cache: bool = True,
    gc_collect: bool = False,
    reset: bool = False,
    on_event: EventSink | None = None,
) -> Every:
    """A policy that cleans on every ``n``-th call: ``policy(step=step)`` once per step.

    Args:
        n: Steps between cleanups.
        empty_cache: Call ``torch.cuda.empty_cache()`` (when CUDA is initialised).
        gc_collect: Call ``gc.collect()``.
        reset: Also collect CUDA IPC handles and reset the peak statistics (a full reset).
        on_event: Called with each cleanup's event.

    Returns:
        The policy; its ``stats`` say how often it cleaned and what it cost.

    Raises:
        ConfigError: When ``n`` is not a positive integer.

    >>> policy = every(10, gc_collect=True)
    >>> sum(policy(step=step) for step in range(25)), policy.stats.calls
    (2, 25)
    >>> [event.step for event in policy.events]  # the 10th and the 20th call
    [9, 19]
    """
    for name, flag in (("empty_cache", empty_cache), ("gc_collect", gc_collect), ("reset", reset)):
        require(name, flag, "bool")
    require("on_event", on_event, "callable", optional=True)
    return Every(n, empty_cache=empty_cache, gc_collect=gc_collect, reset=reset, on_event=on_event)


def PressureReading(
    total_bytes: int | None,
    free_bytes: int | None,
    reserved_bytes: int | None,
    allocated_bytes: int | None,
) -> Reading:
    """Figures given by hand, for :func:`on_pressure`'s ``read`` (bytes; ``None`` where
    unknown): the one record of memory now, :class:`memfit.backends.live.Reading`, with
    ``source="given"``.

    Raises:
        ConfigError: When a figure is neither an integer nor ``None``.

    >>> PressureReading(100, 5, 90, 88).free_bytes
    5
    """
    for name, value in (
        ("total_bytes", total_bytes),
        ("free_bytes", free_bytes),
        ("reserved_bytes", reserved_bytes),
        ("allocated_bytes", allocated_bytes),
    ):
        require(name, value, "int", optional=True)
    return Reading(
        "given",
        total_bytes=total_bytes,
        free_bytes=free_bytes,
        reserved_bytes=reserved_bytes,
        allocated_bytes=allocated_bytes,
    )


def pressure_figures(reading: Reading) -> dict[str, int | None]:
    """What :class:`OnPressure` weighs in a reading (bytes; ``None`` where unknown).

    ``total_bytes`` is what the process may hold (the budget where one is set, else the
    device's total). ``free_bytes`` is what is still free: under a budget, the budget less
    what the process holds; on a device whose used memory is known, the driver's free memory
    (the allocator's cache counted as used: that is what a cleanup gives back); else the
    reading's own ``free_bytes``. ``reserved_bytes`` is what the caching allocator holds
    (what is allocated, where no allocator is read).

    Raises:
        ConfigError: When ``reading`` is not a :class:`~memfit.backends.live.Reading`.
    """
    _require_reading("reading", reading)
    total = reading.capacity_bytes
    free = reading.free_bytes
    if reading.budget_bytes is None and reading.device_used_bytes is not None:
        free = total - reading.device_used_bytes if total is not None else None
    reserved = reading.reserved_bytes
    return {
        "free_bytes": free,
        "total_bytes": total,
        "reserved_bytes": reserved if reserved is not None else reading.allocated_bytes,
        "allocated_bytes": reading.allocated_bytes,
    }


def _require_reading(name: str, value: object) -> None:
    require_object(
        name,
        value,
        attributes=("budget_bytes", "total_bytes", "device_used_bytes", "free_bytes"),
        what="a memfit.backends.live.Reading",
        hint="build one with memfit.cleanup.PressureReading(total, free, reserved, allocated)",
    )


def _fraction(part: int | None, whole: int | None) -> float | None:
    return part / whole if part is not None and whole else None


def read_pressure() -> Reading:
    """Memory of the innermost :func:`memfit.simulate_gpu`, else of the current CUDA device
    (through :func:`memfit.backends.live.active_reader`); :func:`pressure_figures` says
    what the policy weighs in it.

    Returns:
        The reading; with no figure (``Reading("none")``) when there is neither.
    """
    now = active_reader().read()
    return now if now.source in ("simulated", "torch.cuda") else Reading("none")


class OnPressure(_PerStep):
    """Clean only when memory is short or fragmented. Made by :func:`on_pressure`."""

    def __init__(
        self,
        *,
        min_free: float,
        max_fragmentation: float,
        gc_collect: bool,
        on_event: EventSink | None,
        read: Callable[[], Reading],
    ) -> None:
        super().__init__(
            "cleanup.on_pressure", empty_cache=True, gc_collect=gc_collect, on_event=on_event
        )
        self.min_free = min_free
        self.max_fragmentation = max_fragmentation
        self.read = read

    def _due(self) -> tuple[str, dict[str, Any]] | None:
        """Read memory; due when free memory or fragmentation crosses its threshold."""
        now = self.read()
        _require_reading("read()", now)
        figures = pressure_figures(now)
        reasons: list[str] = []
        free = _fraction(figures["free_bytes"], figures["total_bytes"])
        reserved, allocated = figures["reserved_bytes"], figures["allocated_bytes"]
        frag = None
        if reserved is not None and allocated is not None:
            frag = (reserved - allocated) / reserved if reserved else 0.0
        if free is not None and free < self.min_free:
            reasons.append(f"free {free:.1%} < {self.min_free:.1%}")
        if frag is not None and frag > self.max_fragmentation:
            reasons.append(f"fragmentation {frag:.1%} > {self.max_fragmentation:.1%}")
        if not reasons:
            return None
        return "memory pressure: " + ", ".join(reasons), figures


def on_pressure(
    min_free: float | str = 0.1,
    max_fragmentation: float | str = 0.3,
    *,
    gc_collect: bool = False,
    on_event: EventSink | None = None,
    read: Callable[[], Reading] | None = None,
) -> OnPressure:
    """The default policy: ``empty_cache`` only when memory is short or fragmented.

    Args:
        min_free: Clean when the free fraction of the device drops below this
            (``0.1`` or ``"10%"``).
        max_fragmentation: Clean when reserved-but-unallocated memory is more than this
            fraction of reserved memory.
        gc_collect: Also run ``gc.collect()`` when cleaning.
        on_event: Called with each cleanup's event.
        read: Where the figures come from: a function returning a
            :class:`memfit.backends.live.Reading` (default :func:`read_pressure`).

    Returns:
        The policy: call it once per step; its ``stats`` say what it did and cost.

    Raises:
        ConfigError: When a threshold is not a fraction in ``[0, 1)``.
    """
    require("min_free", min_free, "number", "str")
    require("max_fragmentation", max_fragmentation, "number", "str")
    require("gc_collect", gc_collect, "bool")
    require("on_event", on_event, "callable", optional=True)
    require("read", read, "callable", optional=True)
    return OnPressure(
        min_free=parse_fraction(min_free),
        max_fragmentation=parse_fraction(max_fragmentation),
        gc_collect=gc_collect,
        on_event=on_event,
        read=read or read_pressure,
    )


def after_call(
    fn: Callable[P, R] | None = None,
    *,
    empty_cache: bool = True,
    gc_collect: bool = False,
    on_event: EventSink | None = None,
    step: Callable[[], int | None] | None = None,
) -> Any:
    """Decorator: clean after each call of the function (even when it raises).

    Use it bare (``@after_call``) or with options (``@after_call(gc_collect=True)``). The
    wrapped function has a ``cleanup`` attribute, the :class:`CleanupPolicy` with its stats.

    Args:
        fn: The function (when used bare).
        empty_cache: Call ``torch.cuda.empty_cache()`` after each call.
        gc_collect: Call ``gc.collect()`` after each call.
        on_event: Called with each cleanup's event.
        step: Returns the training step at the time of a call, stamped on its cleanup's
            event (``step=lambda: step`` reads the loop's variable); ``None``: unknown.

    Returns:
        The wrapped function, or a decorator when ``fn`` is not given.

    Raises:
        ConfigError: When ``fn`` is given and is not callable.

    >>> @after_call
    ... def fetch(i):
    ...     return i * 2
    >>> fetch(3), fetch.cleanup.stats.cleanups
    (6, 1)
    """

    require("empty_cache", empty_cache, "bool")
    require("gc_collect", gc_collect, "bool")
    require("on_event", on_event, "callable", optional=True)

    def decorate(func: Callable[P, R]) -> Callable[P, R]:
        policy = CleanupPolicy(
            f"cleanup.after_call({getattr(func, '__qualname__', 'function')})",
            empty_cache=empty_cache,
            gc_collect=gc_collect,
            on_event=on_event,
        )

        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            at = policy._called(step() if step is not None else None)
            try:
                return func(*args, **kwargs)
            finally:
                policy._run("cleanup after call", at)

        wrapper.cleanup = policy  # type: ignore[attr-defined]
        return wrapper

    if step is not None and not callable(step):
        raise ConfigError(
            f"step must be a function returning the training step, not {step!r}",
            key_path="step",
            hint="write step=lambda: step to read the loop's variable at each call",
        )
    if fn is not None:
        if not callable(fn):
            raise ConfigError(
                f"after_call decorates a function, not a {type(fn).__name__}",
                key_path="fn",
                hint="use @memfit.cleanup.after_call or "
                "@memfit.cleanup.after_call(gc_collect=True)",
            )
        return decorate(fn)
    return decorate


class _FullReset(CleanupPolicy):
    def __call__(self, *, step: int | None = None, on_event: EventSink | None = None) -> float:
        """Run ``gc.collect()``, ``empty_cache()``, ``ipc_collect()`` and reset the peaks.

        Args:
            step: The training step now, stamped on the reset's event (``None``: unknown).
            on_event: Also send this reset's event here (besides the policy's sink).

        Returns:
            Seconds it took.

        Raises:
            ConfigError: When ``step`` is not a whole number or ``None``.
        """
        require("on_event", on_event, "callable", optional=True)
        step = self._called(step)
        seconds = self._run("full reset", step, reset=True)
        if on_event is not None:
            on_event(self.events[-1])
        return seconds


#: ``memfit.cleanup.full_reset()``: a full cleanup now; ``full_reset.stats`` counts them all.
full_reset = _FullReset("cleanup.full_reset", empty_cache=True, gc_collect=True)
