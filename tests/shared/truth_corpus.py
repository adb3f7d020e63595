"""GPU truth: what real runs allocated, captured once, replayed in CPU tests forever.

``bench/gpu_truth.py`` runs each accuracy workload on a real device and stores one entry per
(workload, batch size) under ``tests/data/gpu_truth/<device-slug>/`` as gzip JSON. This module
defines that format and reads it back; it imports neither torch nor JAX, so CI can replay the
corpus anywhere.

An entry (:class:`TruthEntry`) holds:

* ``environment``: the GPU (name, compute capability, total memory), driver, torch, CUDA,
  cuDNN and cuBLAS versions, the cuBLAS / cuBLASLt workspace sizes in force, JAX and jaxlib;
  for CPU entries the CPU capability and thread count;
* ``peaks``: ``max_allocated`` / ``max_reserved`` (``torch.cuda.max_memory_*`` of a clean
  run), ``nvml_used`` (the process's device memory from NVML at the end) and
  ``device_used`` (``mem_get_info`` total - free); ``cpu_peak`` for CPU entries (the CPU
  allocator's peak from profiler memory events);
* ``allocator``: the allocator settings the run used (``expandable_segments``,
  ``max_split_size``, the memory limit, the ``PYTORCH_[CUDA_]ALLOC_CONF`` text);
* ``trace``: the allocator's own trace (``torch.cuda.memory._record_memory_history`` then
  ``_snapshot()``; on the CPU, profiler memory events), compressed to the columns a replay
  needs: action, address (delta-coded), size, stream, and the ATen op that was running (an
  index into ``op_names``). Stack frames are not kept;
* ``jax``: for JAX entries, ``memory_stats()`` before and after the run and the compiled
  ``memory_analysis()`` on that device.

The replays: :func:`replay` runs a CUDA trace's allocations and completed frees through
:class:`memfit.allocator.model.AllocatorModel` (streams, settings, the device's limit) and
:func:`real_reserved_peak` reads the real reserved peak from the trace's segment events;
:func:`diff_requests` aligns a traced run's request sequence with the real one and names
every difference (cuBLAS / cuBLASLt workspace, cuDNN workspace, SDPA scratch, ...).
"""

from __future__ import annotations

import difflib
import gzip
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memfit.allocator.model import AllocatorModel
from memfit.allocator.snapshot import ACTIONS as SNAPSHOT_ACTIONS
from memfit.errors import ConfigError, OutOfMemory

__all__ = [
    "ACTIONS",
    "FORMAT_VERSION",
    "Difference",
    "Event",
    "ReplayResult",
    "Trace",
    "TruthEntry",
    "corpus_bytes",
    "diff_requests",
    "load_corpus",
    "load_entry",
    "real_reserved_peak",
    "replay",
    "save_entry",
]

#: Version of the stored format; :func:`load_entry` refuses any other.
FORMAT_VERSION = 1

#: Trace actions, as ``torch.cuda.memory._snapshot()`` names them (the snapshot reader's
#: one list); a corpus trace stores each by its index here.
ACTIONS = SNAPSHOT_ACTIONS

_KINDS = ("torch", "jax", "program")
_DEVICES = ("cuda", "cpu")


@dataclass(frozen=True)
class Event:
    """One allocator event."""

    action: str
    addr: int
    size: int
    stream: int
    op: str | None


@dataclass(frozen=True)
class Trace:
    """An allocator trace as columns (equal lengths)."""

    actions: tuple[int, ...]
    addrs: tuple[int, ...]
    sizes: tuple[int, ...]
    streams: tuple[int, ...]
    ops: tuple[int, ...]  # index into op_names, -1 for none
    op_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        n = len(self.actions)
        for name in ("addrs", "sizes", "streams", "ops"):
            if len(getattr(self, name)) != n:
                raise ConfigError(
                    f"trace column {name} has {len(getattr(self, name))} entries, not {n}",
                    key_path=f"trace.{name}",
                )
        if any(not 0 <= a < len(ACTIONS) for a in self.actions):
            raise ConfigError("trace has an unknown action code", key_path="trace.actions")
        if any(not -1 <= o < len(self.op_names) for o in self.ops):
            raise ConfigError("trace names an op that op_names lacks", key_path="trace.ops")
        if any(s < 0 for s in self.sizes):
            raise ConfigError("trace has a negative size", key_path="trace.sizes")

    def __len__(self) -> int:
        return len(self.actions)

    def events(self) -> Iterator[Event]:
        """The events in order."""
        for action, addr, size, stream, op in zip(
            self.actions, self.addrs, self.sizes, self.streams, self.ops, strict=True
        ):
            yield Event(ACTIONS[action], addr, size, stream, self.op_names[op] if op >= 0 else None)

    @classmethod
    def from_events(cls, events: Sequence[Event]) -> Trace:
        """Columns from events (op names are collected in order of first use)."""
        names: dict[str, int] = {}
        ops = []
        for e in events:
            if e.op is None:
                ops.append(-1)
            else:
                ops.append(names.setdefault(e.op, len(names)))
        return cls(
            actions=tuple(ACTIONS.index(e.action) for e in events),
            addrs=tuple(e.addr for e in events),
            sizes=tuple(e.size for e in events),
            streams=tuple(e.stream for e in events),
            ops=tuple(ops),
            op_names=tuple(names),
        )

    def to_json(self) -> dict[str, Any]:
        deltas, last = [], 0
        for addr in self.addrs:
            deltas.append(addr - last)
            last = addr
        return {
            "actions": list(self.actions),
            "addr_deltas": deltas,
            "sizes": list(self.sizes),
            "streams": list(self.streams),
            "ops": list(self.ops),
            "op_names": list(self.op_names),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Trace:
        addrs, last = [], 0
        for delta in _ints(data, "addr_deltas", "trace"):
            last += delta
            addrs.append(last)
        names = data.get("op_names", [])
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ConfigError("op_names must be a list of strings", key_path="trace.op_names")
        return cls(
            actions=tuple(_ints(data, "actions", "trace")),
            addrs=tuple(addrs),
            sizes=tuple(_ints(data, "sizes", "trace")),
            streams=tuple(_ints(data, "streams", "trace")),
            ops=tuple(_ints(data, "ops", "trace")),
            op_names=tuple(names),
        )


def _ints(data: Mapping[str, Any], key: str, where: str) -> list[int]:
    value = data.get(key)
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        raise ConfigError(f"{key} must be a list of integers", key_path=f"{where}.{key}")
    return value


@dataclass(frozen=True)
class TruthEntry:
    """One real run of one workload at one batch size (see the module docstring).

    Attributes:
        name: ``<workload>@<batch>`` (the file's stem).
        kind: ``"torch"``, ``"jax"`` or ``"program"`` (a whole example program).
        device: ``"cuda"`` or ``"cpu"`` (what the truth was measured on).
        workload: The workload's name in ``bench/estimate_workloads.py``,
            ``bench/estimate_third_party.py`` or ``bench/gpu_truth.py``.
        batch: The batch size, or ``None`` for a program.
        environment: Versions and hardware (see the module docstring).
        peaks: Real peaks in bytes, ``None`` where not measured.
        allocator: Allocator settings of the run.
        trace: The allocator trace, or ``None`` (JAX).
        jax: JAX memory statistics and compiled memory analysis, or ``None``.
        notes: Anything the capture had to say (dropped trace entries, errors).
    """

    name: str
    kind: str
    device: str
    workload: str
    batch: int | None
    environment: Mapping[str, Any]
    peaks: Mapping[str, int | None]
    allocator: Mapping[str, Any] = field(default_factory=dict)
    trace: Trace | None = None
    jax: Mapping[str, Any] | None = None
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ConfigError(f"unknown kind {self.kind!r}", key_path=f"{self.name}.kind")
        if self.device not in _DEVICES:
            raise ConfigError(f"unknown device {self.device!r}", key_path=f"{self.name}.device")
        if self.batch is not None and (isinstance(self.batch, bool) or self.batch < 1):
            raise ConfigError(f"bad batch {self.batch!r}", key_path=f"{self.name}.batch")
        for key, value in self.peaks.items():
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ConfigError(
                    f"peak {key} must be a non-negative integer or null, got {value!r}",
                    key_path=f"{self.name}.peaks.{key}",
                )

    @property
    def gpu(self) -> str | None:
        """The GPU's name as the driver reports it, or ``None`` for a CPU entry."""
        name = self.environment.get("gpu_name")
        return str(name) if name else None

    def to_json(self) -> dict[str, Any]:
        """Plain data, as stored."""
        return {
            "format": FORMAT_VERSION,
            "name": self.name,
            "kind": self.kind,
            "device": self.device,
            "workload": self.workload,
            "batch": self.batch,
            "environment": dict(self.environment),
            "peaks": dict(self.peaks),
            "allocator": dict(self.allocator),
            "trace": None if self.trace is None else self.trace.to_json(),
            "jax": None if self.jax is None else dict(self.jax),
            "notes": list(self.notes),
        }

    @classmethod
    def from_json(cls, data: Any, *, source: str = "entry") -> TruthEntry:
        """Read and check one entry.

        Raises:
            ConfigError: When the format version is not :data:`FORMAT_VERSION` or a field
                is missing or malformed (the message names it).
        """
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: not a JSON object", key_path=source)
        if data.get("format") != FORMAT_VERSION:
            raise ConfigError(
                f"{source}: format {data.get('format')!r}, this memfit reads {FORMAT_VERSION}",
                key_path=f"{source}.format",
                hint="recapture with this memfit's bench/gpu_truth.py",
            )
        for key in ("name", "kind", "device", "workload", "environment", "peaks"):
            if key not in data:
                raise ConfigError(f"{source}: missing {key}", key_path=f"{source}.{key}")
        for key in ("environment", "peaks", "allocator"):
            if not isinstance(data.get(key, {}), dict):
                raise ConfigError(f"{source}: {key} must be an object", key_path=f"{source}.{key}")
        trace = data.get("trace")
        jax_data = data.get("jax")
        return cls(
            name=str(data["name"]),
            kind=str(data["kind"]),
            device=str(data["device"]),
            workload=str(data["workload"]),
            batch=data.get("batch"),
            environment=data["environment"],
            peaks=data["peaks"],
            allocator=data.get("allocator", {}),
            trace=None if trace is None else Trace.from_json(trace),
            jax=jax_data if isinstance(jax_data, dict) else None,
            notes=tuple(str(n) for n in data.get("notes", [])),
        )


def save_entry(entry: TruthEntry, path: str | Path) -> Path:
    """Write ``entry`` as gzip JSON (compact separators, deterministic bytes)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    raw = json.dumps(entry.to_json(), separators=(",", ":"), sort_keys=True).encode()
    target.write_bytes(gzip.compress(raw, compresslevel=9, mtime=0))  # no name, no time
    return target


def load_entry(path: str | Path) -> TruthEntry:
    """Read one stored entry.

    Raises:
        ConfigError: When the file is not gzip JSON of this format.
    """
    source = Path(path)
    try:
        with gzip.open(source, "rt", encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{source}: not gzip JSON ({exc})", key_path=str(source)) from exc
    return TruthEntry.from_json(data, source=source.name)


#: Folder of the corpus that holds public CUDA snapshots (``memfit.allocator.snapshot`` data, not
#: entries of this format; ``tests/allocator/test_public_snapshots.py`` replays them).
PUBLIC_FOLDER = "public"


def load_corpus(root: str | Path) -> list[TruthEntry]:
    """Every entry under ``root`` (``<slug>/*.json.gz``, not :data:`PUBLIC_FOLDER`), sorted
    by slug and name."""
    base = Path(root)
    return [
        load_entry(p) for p in sorted(base.glob("*/*.json.gz")) if p.parent.name != PUBLIC_FOLDER
    ]


def corpus_bytes(root: str | Path) -> int:
    """Bytes the stored corpus takes on disk."""
    return sum(p.stat().st_size for p in Path(root).rglob("*") if p.is_file())


# --- (a) the allocator model against a real trace ------------------------------------------------


@dataclass(frozen=True)
class ReplayResult:
    """A CUDA trace replayed through the allocator model, next to what really happened.

    Attributes:
        real_reserved_peak: Peak of the real reserved bytes (segment events of the trace).
        model_reserved_peak: The model's reserved peak for the same requests.
        real_allocated_peak: Peak of live block bytes as the trace shows them (requested
            sizes rounded to 512 B; a lower bound of ``max_memory_allocated``, which also
            counts unsplit block slack).
        model_allocated_peak: The model's allocated peak.
        real_segments: Segments the real allocator obtained.
        model_segments: Segments the model obtained.
        requests: Allocations replayed.
    """

    real_reserved_peak: int
    model_reserved_peak: int
    real_allocated_peak: int
    model_allocated_peak: int
    real_segments: int
    model_segments: int
    requests: int

    @property
    def reserved_error(self) -> float:
        """Relative error of the model's reserved peak (0.01 = 1% over)."""
        if not self.real_reserved_peak:
            return 0.0
        return (self.model_reserved_peak - self.real_reserved_peak) / self.real_reserved_peak


def real_reserved_peak(trace: Trace, initial_reserved: int = 0) -> int:
    """Peak reserved bytes from the trace's segment events (``segment_alloc`` / ``_map``
    add, ``segment_free`` / ``_unmap`` subtract)."""
    reserved = peak = initial_reserved
    for event in trace.events():
        if event.action in ("segment_alloc", "segment_map"):
            reserved += event.size
            peak = max(peak, reserved)
        elif event.action in ("segment_free", "segment_unmap"):
            reserved -= event.size
    return peak


def replay(
    trace: Trace,
    *,
    expandable_segments: bool = False,
    max_split_size: int | None = None,
    limit_bytes: int | None = None,
) -> ReplayResult:
    """Replay a real CUDA trace's requests through :class:`AllocatorModel`.

    Each ``alloc`` becomes ``malloc(size, stream)``; each ``free_completed`` frees the block
    allocated at that address (``free_requested`` is only the start of a free that may wait
    for other streams' events); an ``oom`` event ends the replay (the real run failed there).
    A new segment the model needs is placed where the real ``cudaMalloc`` put the segment the
    trace obtained just before that allocation (its ``segment_alloc`` event), as
    :func:`memfit.allocator.replay.replay` does with ``exact_addresses``: best fit breaks
    ties between free blocks of one size by address, and the driver's addresses are neither
    ascending nor descending (act_2cam_384@4 replays 3.3% under with the model's own
    ascending addresses, four H100 entries miss with descending ones; with the trace's, every
    H100 entry replays to its reserved peak and segment count).

    Raises:
        ConfigError: When the trace frees an address it never allocated, or the settings are
            invalid.
    """
    model = AllocatorModel(expandable_segments, max_split_size, limit_bytes)
    live: dict[tuple[int, int], int] = {}  # (addr, stream) -> handle
    requests = segments = 0
    from memfit.allocator.model import round_size

    allocated = real_allocated = 0
    new_segment: int | None = None  # where cudaMalloc put the segment for the next alloc
    placed: set[int] = set()  # addresses given to the model (a reused one could collide)
    for event in trace.events():
        if event.action == "alloc":
            try:
                live[(event.addr, event.stream)] = model.malloc(
                    event.size, event.stream, segment_address=new_segment
                )
            except OutOfMemory:
                break
            new_segment = None
            requests += 1
            allocated += round_size(event.size) if event.size else 0
            real_allocated = max(real_allocated, allocated)
        elif event.action == "free_completed":
            handle = live.pop((event.addr, event.stream), None)
            if handle is None:
                raise ConfigError(
                    f"the trace frees address {event.addr:#x} on stream {event.stream}, "
                    "which it never allocated",
                    key_path="trace",
                    hint="capture the trace from the start of the run (max_entries large "
                    "enough that nothing was dropped)",
                )
            model.free(handle)
            allocated -= round_size(event.size) if event.size else 0
        elif event.action == "segment_alloc":
            segments += 1
            reused = expandable_segments or event.addr in placed
            new_segment = None if reused else event.addr
            placed.add(event.addr)
        elif event.action == "oom":
            break
    return ReplayResult(
        real_reserved_peak=real_reserved_peak(trace),
        model_reserved_peak=model.peak_reserved_bytes,
        real_allocated_peak=real_allocated,
        model_allocated_peak=model.peak_allocated_bytes,
        real_segments=segments,
        model_segments=model.segment_count,
        requests=requests,
    )


# --- (b) a traced run's requests against a real run's ---------------------------------------------


@dataclass(frozen=True)
class Difference:
    """Allocations one side made that the other did not (after alignment), with a cause.

    Attributes:
        cause: What explains it (``"cuBLAS/cuBLASLt workspace"``, ``"cuDNN convolution
            workspace"``, ``"SDPA scratch"``, ``"kernel-internal buffer"`` of the op,
            ``"reordered"``, ...), or ``"unexplained"`` (no op to blame).
        side: ``"real"`` (only the real run allocated it), ``"traced"``, or ``"both"``
            (``"reordered"``: the same size at another point of the other sequence).
        op: The ATen op running when it was allocated, normalised (``"aten.mm"``), or ``None``.
        count: How many allocations.
        nbytes: Their bytes in total.
    """

    cause: str
    side: str
    op: str | None
    count: int
    nbytes: int


def _norm_op(op: str | None) -> str | None:
    """``aten::mm`` and ``aten.mm.default`` -> ``aten.mm``."""
    if not op:
        return None
    name = op.replace("::", ".")
    for suffix in (".default", ".Tensor", ".Scalar", ".out"):
        name = name.removesuffix(suffix)
    return name


_MATMUL_WORDS = ("mm", "matmul", "linear", "addmv", "dot", "baddbmm", "_scaled_mm")
_CONV = re.compile(r"conv(olution|[123]d|_)|cudnn")


def _cause(side: str, nbytes: int, op: str | None, device: str, workspaces: frozenset[int]) -> str:
    """Why one side allocated this and the other did not, from its size and op."""
    name = op or ""
    if nbytes <= 64:
        return "scalar temporaries (<= 64 B)"
    if side == "real":
        if nbytes in workspaces:
            return "cuBLAS/cuBLASLt workspace" if device == "cuda" else "BLAS workspace"
        if _CONV.search(name):
            if device == "cuda":
                return "cuDNN convolution workspace"
            return "oneDNN convolution scratch"
        if "attention" in name or "scaled_dot_product" in name or "flash" in name:
            return "SDPA scratch"
        if device == "cuda" and any(w in name for w in _MATMUL_WORDS):
            return "cuBLASLt workspace"
        if "loss" in name:
            return "loss kernel buffer"
        if "norm" in name:
            return "normalization kernel scratch"
        if "Backward" in name or "autograd" in name:
            return "autograd node buffer"
        if op:
            return "kernel-internal buffer"
        return "unexplained"
    if "attention" in name or "scaled_dot_product" in name:
        return "SDPA outputs of another backend"
    if _CONV.search(name):
        return "convolution outputs of another backend"
    if op:
        return "output the real kernel does not allocate"
    return "unexplained"


def diff_requests(
    real: Sequence[tuple[int, str | None]],
    traced: Sequence[tuple[int, str | None, str | None]],
    *,
    device: str,
    workspaces: Sequence[int] = (),
) -> list[Difference]:
    """Align two request sequences and name what differs.

    The sequences are aligned on their sizes (``difflib``, no junk heuristic); requests that
    only one side made are grouped by cause and op. A replaced run (both sides allocated at
    that point, in different sizes) counts on both sides.

    Args:
        real: The real run's allocations in order: ``(requested bytes, op running)``.
        traced: The traced run's: ``(bytes, op, cause)``, where ``cause`` names what a
            modelled allocation stands for (``"measured kernel scratch"``, ``"cuBLAS
            workspace (modelled)"``), ``None`` for a tensor.
        device: ``"cuda"`` or ``"cpu"`` (names differ: cuDNN vs oneDNN).
        workspaces: Sizes that are BLAS workspaces on this device (cuBLAS per handle,
            cuBLASLt).

    Returns:
        The differences, largest first.
    """
    matcher = difflib.SequenceMatcher(
        a=[n for n, _ in real], b=[t[0] for t in traced], autojunk=False
    )
    only_real: list[tuple[int, str | None]] = []
    only_traced: list[tuple[int, str | None, str | None]] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            only_real += real[i1:i2]
            only_traced += traced[j1:j2]
    groups: dict[tuple[str, str, str | None], list[int]] = {}
    # The same size on both sides, at other points of the sequence: an allocation that moved
    # (the real run frees or allocates in another order, or a kernel choice swaps two ops).
    waiting: dict[int, list[int]] = {}
    for index, (nbytes, _op, modelled) in enumerate(only_traced):
        if modelled is None:
            waiting.setdefault(nbytes, []).append(index)
    moved: set[int] = set()
    known = frozenset(workspaces)
    for nbytes, op in only_real:
        slots = waiting.get(nbytes)
        if slots:
            moved.add(slots.pop())
            groups.setdefault(("reordered", "both", _norm_op(op)), []).append(nbytes)
            continue
        name = _norm_op(op)
        groups.setdefault((_cause("real", nbytes, name, device, known), "real", name), []).append(
            nbytes
        )
    for index, (nbytes, op, modelled) in enumerate(only_traced):
        if index in moved:
            continue
        name = _norm_op(op)
        cause = modelled or _cause("traced", nbytes, name, device, known)
        groups.setdefault((cause, "traced", name), []).append(nbytes)
    out = [
        Difference(cause, side, op, len(sizes), sum(sizes))
        for (cause, side, op), sizes in groups.items()
    ]
    out.sort(key=lambda d: -d.nbytes)
    return out
