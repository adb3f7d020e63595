"""A JAX training loop of several jitted calls, replayed through the BFC allocator.

One jitted step in a fresh process is placed in an empty pool: every request splits the
pool's free space and ``peak_bytes_in_use`` is the step's buffers
(:func:`memfit.estimate_jax`). A training loop written in Python (CleanRL-style PPO: a jitted
rollout, advantages and update called in turn, each returning new arrays while the old ones
are dropped) runs for many iterations in one allocator, and there the allocator's rule that
a free chunk under twice a request is handed out whole (``tsl::BFCAllocator``; see
:mod:`memfit.allocator.bfc`) makes ``peak_bytes_in_use`` depend on where earlier arrays were
freed: a 22 MiB rollout buffer that lands in the 38 MiB hole the last update's temporaries
left counts 38 MiB.

This module replays such a loop: the arrays the program holds before it starts, then for a
number of iterations the loop's events in order (:class:`Call` a jitted phase: its outputs,
each leaf its own allocation, then its temporaries, one allocation freed when the call
returns; :class:`Allocate` an eager array; :class:`Release` a name's arrays;
:class:`Rebind` a name to another's arrays, freeing what it held). Each phase's buffers come
from :func:`phase_buffers` (XLA's compile for the card, :func:`memfit.estimate_jax`); the
first call of a phase also holds its GEMM autotuning (``JaxEstimate.first_call_bytes``) above
what is in use.

Assumed, and said in :attr:`ProgramReplay.assumptions`: a call allocates its outputs in the
order of their leaves and its temporaries last (XLA's GPU executable allocates in buffer
allocation order, the combined temporaries at the end: ``GpuExecutable::
GenerateBufferAllocations``, ``BufferAssignment::CombineTempAllocations``); an array is freed
when the program drops it (JAX frees it once the computations using it are done; a loop that
syncs every iteration, as one that reads its metrics does, frees it before the next call).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from memfit._checks import (
    require,
    require_byte_sizes,
    require_bytes,
    require_callable,
    require_items,
    require_iterable,
    require_mapping,
    require_positive_int,
)
from memfit._plain import plain_fields
from memfit.allocator.bfc import BfcAllocator, round_up
from memfit.errors import ConfigError, OutOfMemory

__all__ = [
    "Allocate",
    "Call",
    "PhaseBuffers",
    "ProgramReplay",
    "Rebind",
    "Release",
    "allocator_settings",
    "phase_buffers",
    "replay_program",
]


@dataclass(frozen=True)
class PhaseBuffers:
    """What one call of a jitted phase allocates on the device.

    Attributes:
        name: The phase (``"update"``).
        outputs: The bytes of each leaf, for each top-level output of the function.
        temp_bytes: XLA's temporaries (one allocation for the call).
        first_call_bytes: What the first call's autotuning holds above what is in use.
    """

    name: str
    outputs: tuple[tuple[int, ...], ...]
    temp_bytes: int
    first_call_bytes: int = 0

    def __post_init__(self) -> None:
        """A size that cannot be real (``temp_bytes=-1``, ``nan``, ``1.5``) is refused here,
        never dropped by the replay.

        Raises:
            ConfigError: Naming the field.
        """
        _check_phase("", self)


@dataclass(frozen=True)
class Call:
    """Call phase ``phase``; ``outputs`` names each top-level output (a name may repeat)."""

    phase: str
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class Allocate:
    """An array made outside a jitted phase (a key split eagerly): ``sizes`` under ``name``."""

    name: str
    sizes: tuple[int, ...]


@dataclass(frozen=True)
class Release:
    """The program drops every array held under ``name``."""

    name: str


@dataclass(frozen=True)
class Rebind:
    """``old = new`` in the program: ``old``'s arrays are freed and ``new``'s are held as
    ``old``."""

    old: str
    new: str


Event = Call | Allocate | Release | Rebind


@dataclass(frozen=True)
class ProgramReplay:
    """The loop replayed through the allocator.

    Attributes:
        peak_bytes_in_use: ``memory_stats()["peak_bytes_in_use"]`` at the end of the
            iterations: the chunks in use at the worst moment, the first calls'
            autotuning included.
        peak_at: Where it was reached (``"iteration 3, update"``).
        live_peak_bytes: The most the program's arrays (rounded to 256 B) held at once: the
            peak without chunks handed out whole.
        iteration_peaks: ``peak_bytes_in_use`` after each iteration.
        pool_bytes: The allocator's regions at the end (JAX's pool when preallocated).
        out_of_memory: Where a request found no chunk, or ``None``.
        assumptions: What the replay took for granted.
    """

    peak_bytes_in_use: int
    peak_at: str
    live_peak_bytes: int
    iteration_peaks: tuple[int, ...]
    pool_bytes: int
    out_of_memory: str | None = None
    assumptions: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        """The replay as plain data."""
        return plain_fields(
            self, iteration_peaks=list(self.iteration_peaks), assumptions=list(self.assumptions)
        )


ASSUMPTIONS = (
    "a call allocates its outputs in the order of their leaves, then its temporaries as one "
    "buffer freed when it returns (XLA's GPU executable, buffer allocation order)",
    "an array is freed when the program drops it (a loop that reads its metrics every "
    "iteration has finished the computations that use it)",
    "the first call's autotuning is counted above what is in use, not placed in the pool",
)


class _Replay:
    def __init__(self, pool: BfcAllocator, phases: Mapping[str, PhaseBuffers]) -> None:
        self.pool = pool
        self.phases = phases
        self.held: dict[str, list[tuple[int, int]]] = {}  # name -> [(id, rounded bytes)]
        self.live = 0
        self.live_peak = 0
        self.peak = 0
        self.peak_at = "start"
        self.called: set[str] = set()

    def note(self, where: str, extra: int = 0) -> None:
        now = max(self.pool.peak_bytes_in_use, self.pool.bytes_in_use + extra)
        if now > self.peak:
            self.peak, self.peak_at = now, where
        self.live_peak = max(self.live_peak, self.live + extra)

    def allocate(self, name: str, size: int) -> None:
        ident = self.pool.allocate(size)
        rounded = round_up(size)
        self.held.setdefault(name, []).append((ident, rounded))
        self.live += rounded

    def release(self, name: str) -> None:
        for ident, rounded in self.held.pop(name, []):
            self.pool.free(ident)
            self.live -= rounded

    def run(self, event: Event, where: str) -> None:
        if isinstance(event, Allocate):
            for size in event.sizes:
                self.allocate(event.name, size)
        elif isinstance(event, Release):
            self.release(event.name)
        elif isinstance(event, Rebind):
            self.release(event.old)
            if event.new in self.held:
                self.held[event.old] = self.held.pop(event.new)
        else:
            phase = self.phases[event.phase]
            if event.phase not in self.called:
                self.called.add(event.phase)
                self.note(f"{where} (first call's autotuning)", phase.first_call_bytes)
            for name, leaves in zip(event.outputs, phase.outputs, strict=True):
                for size in leaves:
                    self.allocate(name, size)
            temp = self.pool.allocate(phase.temp_bytes) if phase.temp_bytes > 0 else None
            rounded = round_up(phase.temp_bytes) if temp is not None else 0
            self.live += rounded
            self.note(where)
            if temp is not None:
                self.pool.free(temp)
                self.live -= rounded
        self.note(where)


_NAME_HINT = "name each array as a string, e.g. Call('update', ('state', 'loss'))"


def _check_phase(where: str, phase: PhaseBuffers) -> None:
    """Each of ``phase``'s sizes is a number of bytes that can be real (``where``: the key
    path's prefix)."""
    require(f"{where}name", phase.name, "str", hint="the phase's name, e.g. 'update'")
    tops = require_iterable(f"{where}outputs", phase.outputs)
    for i, leaves in enumerate(tops):
        require_byte_sizes(
            f"{where}outputs[{i}]",
            leaves,
            hint="give each top-level output as the bytes of its leaves, e.g. ((4096, 8),)",
        )
    hint = "XLA's temp_size_in_bytes for the call (phase_buffers() reads it)"
    require_bytes(f"{where}temp_bytes", phase.temp_bytes, hint=hint)
    hint = "JaxEstimate.first_call_bytes (phase_buffers() reads it), 0 for none"
    require_bytes(f"{where}first_call_bytes", phase.first_call_bytes, hint=hint)


def _check_phases(phases: object) -> None:
    """``phases`` maps names to :class:`PhaseBuffers` whose every size is a number of bytes."""
    require_mapping("phases", phases, hint="pass {name: phase_buffers(name, fn, ...)[0]}")
    assert isinstance(phases, Mapping)
    for key, phase in phases.items():
        where = f"phases.{key}"
        if not isinstance(phase, PhaseBuffers):
            raise ConfigError(
                f"{where} must be a PhaseBuffers, not {type(phase).__name__} ({phase!r:.60})",
                key_path=where,
                hint="build each phase's buffers with phase_buffers() or PhaseBuffers(...)",
            )
        _check_phase(f"{where}.", phase)


def _check_event(index: int, event: object, phases: Mapping[str, PhaseBuffers]) -> None:
    where = f"loop.{index}"
    if isinstance(event, Call):
        require(f"{where}.phase", event.phase, "str", hint="the phase's name in phases=")
        if event.phase not in phases:
            raise ConfigError(
                f"loop[{index}] calls {event.phase!r}, which is not among the phases "
                f"({', '.join(sorted(phases)) or 'none'})",
                key_path=f"{where}.phase",
                hint="pass the phase's buffers in phases=, built by phase_buffers()",
            )
        if isinstance(event.outputs, str):
            raise ConfigError(
                f"loop[{index}] names its outputs {event.outputs!r:.60}, a string, not a tuple "
                "of names",
                key_path=f"{where}.outputs",
                hint=_NAME_HINT,
            )
        names = require_items(f"{where}.outputs", event.outputs, "str", what=_NAME_HINT)
        expected = len(phases[event.phase].outputs)
        if len(names) != expected:
            raise ConfigError(
                f"loop[{index}] names {len(names)} outputs of {event.phase!r}, "
                f"which returns {expected}",
                key_path=f"{where}.outputs",
                hint="name every top-level output of the function, in order",
            )
    elif isinstance(event, Allocate):
        require(f"{where}.name", event.name, "str", hint=_NAME_HINT)
        require_byte_sizes(
            f"{where}.sizes",
            event.sizes,
            hint="give each array's bytes, e.g. Allocate('key', (8,))",
        )
    elif isinstance(event, Release):
        require(f"{where}.name", event.name, "str", hint=_NAME_HINT)
    elif isinstance(event, Rebind):
        require(f"{where}.old", event.old, "str", hint=_NAME_HINT)
        require(f"{where}.new", event.new, "str", hint=_NAME_HINT)
    else:
        raise ConfigError(
            f"loop[{index}] is {type(event).__name__}, not an event",
            key_path=where,
            hint="use Call, Allocate, Release or Rebind",
        )


def _check_events(initial: object, phases: object, loop: object) -> list[Event]:
    """Every argument of :func:`replay_program` checked, each size a number of bytes that can
    be real (never dropped); the loop's events as a list."""
    require_mapping("initial", initial, hint="pass {name: [bytes, ...]}, e.g. {'state': [4096]}")
    assert isinstance(initial, Mapping)
    for name, sizes in initial.items():
        require_byte_sizes(
            f"initial.{name}",
            sizes,
            hint="give each array the program holds before the loop as its bytes",
        )
    _check_phases(phases)
    assert isinstance(phases, Mapping)
    events = require_iterable("loop", loop)
    for index, event in enumerate(events):
        _check_event(index, event, phases)
    made = set(initial)
    for event in events:
        if isinstance(event, Call):
            made.update(event.outputs)
        elif isinstance(event, Allocate):
            made.add(event.name)
    for index, event in enumerate(events):
        names = (event.name,) if isinstance(event, Release) else ()
        if isinstance(event, Rebind):
            names = (event.new,)
        for name in names:
            if name not in made:
                raise ConfigError(
                    f"loop[{index}] names {name!r}, which neither the initial arrays nor any "
                    f"call or allocation of the loop hold (they hold: {', '.join(sorted(made))})",
                    key_path=f"loop.{index}",
                    hint="name arrays as a Call's outputs, an Allocate or initial= name them",
                )
    return events


def replay_program(
    initial: Mapping[str, Sequence[int]],
    phases: Mapping[str, PhaseBuffers],
    loop: Sequence[Event],
    *,
    limit_bytes: int,
    preallocate: bool = True,
    iterations: int = 100,
) -> ProgramReplay:
    """Replay a training loop through JAX's allocator and read its peak.

    Args:
        initial: The arrays the program holds before the loop: bytes per array, by name.
        phases: The buffers of each jitted phase (:func:`phase_buffers`), by phase name.
        loop: One iteration's events, in order.
        limit_bytes: The allocator's limit (``memory_stats()["bytes_limit"]``).
        preallocate: JAX's pool is allocated at start (the default); ``False``: it grows.
        iterations: How many times the loop runs: the peak drifts up over iterations and
            may jump late (a published PPO loop's at iteration 72 of 100), so as many as
            the program runs.

    Returns:
        A :class:`ProgramReplay`.

    Raises:
        ConfigError: An argument of the wrong type, an event that names an unknown phase
            or the wrong number of outputs, or a size (an array's, a phase's temporaries or
            autotuning) that is not a whole number of bytes from 0 to under 2**63.

    The second batch (10 MiB) is handed whole the 18 MiB hole the first batch and the old
    state left (less than twice the request):

    >>> update = PhaseBuffers("update", ((8 << 20,), (256,)), temp_bytes=30 << 20)
    >>> rollout = PhaseBuffers("rollout", ((10 << 20,),), temp_bytes=1 << 20)
    >>> loop = [Call("rollout", ("batch",)), Call("update", ("new", "loss")),
    ...         Rebind("state", "new"), Release("batch"), Release("loss")]
    >>> out = replay_program({"state": [8 << 20]}, {"update": update, "rollout": rollout},
    ...                      loop, limit_bytes=1 << 30)
    >>> out.live_peak_bytes >> 20, out.peak_bytes_in_use >> 20, out.peak_at
    (56, 64, 'iteration 2, update')
    """
    require_positive_int("iterations", iterations, hint="as many as the loop runs, e.g. 100")
    require_bytes("limit_bytes", limit_bytes, lo=1, hint="memory_stats()['bytes_limit']")
    require("preallocate", preallocate, "bool")
    loop = _check_events(initial, phases, loop)
    replay = _Replay(BfcAllocator(limit_bytes, preallocate=preallocate), phases)
    peaks: list[int] = []
    where = "start"
    try:
        for name, sizes in initial.items():
            for size in sizes:
                replay.allocate(name, size)
        replay.note(where)
        for iteration in range(1, iterations + 1):
            for event in loop:
                where = f"iteration {iteration}, " + (
                    event.phase if isinstance(event, Call) else type(event).__name__.lower()
                )
                replay.run(event, where)
            peaks.append(replay.peak)
    except OutOfMemory:
        return ProgramReplay(
            replay.peak, replay.peak_at, replay.live_peak, tuple(peaks),
            replay.pool.pool_bytes, where, ASSUMPTIONS,
        )  # fmt: skip
    return ProgramReplay(
        replay.peak, replay.peak_at, replay.live_peak, tuple(peaks), replay.pool.pool_bytes,
        None, ASSUMPTIONS,
    )  # fmt: skip


def phase_buffers(
    name: str,
    fn: Callable[..., Any],
    *args: Any,
    estimate: Callable[..., Any] | None = None,
    **estimate_kwargs: Any,
) -> tuple[PhaseBuffers, Any]:
    """The buffers one call of ``fn(*args)`` allocates on the card, and its estimate.

    ``estimate_kwargs`` go to :func:`memfit.estimate_jax` (``gpu=``, ``environ=``,
    ``jaxlib=``); the outputs' leaves come from ``jax.eval_shape``.

    Raises:
        ConfigError: The estimate was not compiled for a GPU (no autotuning figure).
    """
    require("name", name, "str", hint="the phase's name, e.g. 'update'")
    require_callable("fn", fn)
    require_callable("estimate", estimate, optional=True)
    import jax
    import numpy as np

    from memfit.estimate.xla.step import estimate_jax

    est = (estimate or estimate_jax)(fn, *args, **estimate_kwargs)
    if est.first_call_bytes is None:
        raise ConfigError(
            f"phase {name!r} was compiled for {est.compiled_for}, not for a GPU",
            key_path="gpu",
            hint='name the card (gpu="RTX 4090") and install the gpu-target extra',
        )
    shapes = jax.eval_shape(fn, *args)
    tops = shapes if isinstance(shapes, tuple) else (shapes,)
    outputs = tuple(
        tuple(
            int(np.prod(leaf.shape, dtype=np.int64)) * np.dtype(leaf.dtype).itemsize
            for leaf in jax.tree_util.tree_leaves(top)
        )
        for top in tops
    )
    return PhaseBuffers(name, outputs, int(est.temp_bytes), int(est.first_call_bytes)), est


def allocator_settings(gpu: str, environ: Mapping[str, str] | None = None) -> tuple[int, bool]:
    """JAX's allocator on ``gpu`` under ``environ`` (default ``os.environ``): its limit in
    bytes (the fraction of the memory CUDA reports, as the card's XLA target config gives
    it) and whether the pool is preallocated (:func:`replay_program`'s arguments).

    Raises:
        ConfigError: An unknown card, one with no XLA target config, or an allocator
            setting JAX would refuse.
    """
    require("gpu", gpu, "str", hint="a card of memfit gpus, e.g. 'RTX 4090'")
    require_mapping("environ", environ, values="str", optional=True)
    from memfit.estimate.xla.step import preallocation_from_env
    from memfit.hardware.catalog import gpu as lookup_gpu
    from memfit.hardware.xla_target import target_config

    policy = preallocation_from_env(environ)
    limit = int(target_config(lookup_gpu(gpu)).device_memory_size * policy.fraction)
    return limit, policy.preallocate
