"""The records a CUDA snapshot is read into, and the checks of the values they are read from.

:mod:`memfit.allocator.snapshot` reads a snapshot into these plain frozen records; this module
holds them, the interning of stack frames, and :class:`TraceSink`, which checks the events of
one device's trace one by one and keeps them in columns (:class:`Trace`, about 50 bytes an
event, where a dict per event takes some 300), so a trace of millions of events is read in
memory linear in its length with a small constant. Every value is checked for its type and
its size before it is kept: an integer of a snapshot is under ``2**64`` (an address, a size)
or, signed, in ``(-2**63, 2**63)`` (a stream, a time, a line number); nothing of a value is
shown in a message but its type, or a short printable slice of a string.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

from memfit._checks import INT_LIMIT
from memfit.errors import ConfigError

__all__ = [
    "ACTIONS",
    "BLOCK_STATES",
    "PICKLE_HINT",
    "BlockInfo",
    "Frame",
    "Interner",
    "SegmentInfo",
    "Trace",
    "TraceEvent",
    "TraceSink",
    "not_snapshot",
    "printable",
    "read_int",
    "read_size",
    "shown",
]

#: Trace actions PyTorch records (``TraceEntry::Action``).
ACTIONS: tuple[str, ...] = (
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "oom",
    "snapshot",
)
_ACTION_CODE: dict[str, int] = {a: i for i, a in enumerate(ACTIONS)}

#: Block states in ``segments[i]["blocks"]``.
BLOCK_STATES: tuple[str, ...] = ("active_allocated", "active_pending_free", "inactive")

PICKLE_HINT = (
    "pass a file written by torch.cuda.memory._dump_snapshot(), by memfit's Recorder OOM "
    "dump, or the same data as JSON"
)

_SIZE_LIMIT = 1 << 64
_NONE = -(1 << 63)  # a time or a free-memory figure that is not there


def printable(text: str) -> str:
    """``text`` with unprintable characters as ``?``, at most 80 characters."""
    return "".join(c if c.isprintable() else "?" for c in str(text)[:80])


def shown(value: Any) -> str:
    """A value for a message, safely: a string's printable start, else its type's name
    (``str()`` of a value nested thousands deep would recurse, of a 5,000-digit int fail)."""
    if isinstance(value, str):
        return repr(printable(value))
    if value is None or isinstance(value, bool):
        return repr(value)
    return f"a {type(value).__name__}"


def not_snapshot(source: str, why: str) -> ConfigError:
    """The error for data that is not a snapshot (``why`` says what is wrong, where)."""
    return ConfigError(f"not a CUDA memory snapshot ({why})", key_path=source, hint=PICKLE_HINT)


def read_int(value: Any, where: str, source: str, *, default: int | None = None) -> int:
    """``value`` as a signed integer of a snapshot (a stream, a device index).

    Raises:
        ConfigError: When it is not an integer, or is ``2**63`` or more in magnitude.
    """
    if value is None and default is not None:
        return default
    if type(value) is not int:
        if isinstance(value, int) and not isinstance(value, bool):
            value = int(value)
        else:
            raise not_snapshot(source, f"{where} is {shown(value)}, not an integer")
    if not -INT_LIMIT < value < INT_LIMIT:
        raise not_snapshot(source, f"{where} is an integer of {value.bit_length()} bits")
    return int(value)


def read_size(value: Any, where: str, source: str) -> int:
    """``value`` as an address or a size: an integer from 0 to ``2**64 - 1`` (``None``: 0).

    Raises:
        ConfigError: Otherwise.
    """
    if type(value) is int and 0 <= value < _SIZE_LIMIT:
        return value
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool):
        raise not_snapshot(source, f"{where} is {shown(value)}, not an integer")
    if value < 0:
        raise not_snapshot(source, f"{where} is negative, not a size")
    if value >= _SIZE_LIMIT:
        raise not_snapshot(
            source, f"{where} is an integer of {value.bit_length()} bits, not a size"
        )
    return int(value)


@dataclass(frozen=True, slots=True)
class Frame:
    """One stack frame: a Python frame (``filename`` ends in ``.py``) or a C++ one."""

    filename: str
    line: int
    name: str


@dataclass(frozen=True, slots=True)
class BlockInfo:
    """One block of a segment at the time of the snapshot.

    Attributes:
        address: Its device address.
        size: Its size (a multiple of 512; an unsplit block counts whole).
        requested_size: Bytes the caller asked for (0 for a free block).
        state: ``"active_allocated"``, ``"active_pending_free"`` (freed, waiting on another
            stream's work) or ``"inactive"`` (free, cached).
        stack: Index into :attr:`SnapshotDevice.stacks`, ``-1`` without frames.
    """

    address: int
    size: int
    requested_size: int
    state: str
    stack: int = -1

    @property
    def live(self) -> bool:
        """Whether the block is allocated (or its free has not completed yet)."""
        return self.state != "inactive"


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """One segment (a ``cudaMalloc``, or an expandable segment's mapped range)."""

    address: int
    total_size: int
    stream: int
    small: bool
    expandable: bool
    blocks: tuple[BlockInfo, ...]
    stack: int = -1


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One allocator event (``device_traces[d][i]``).

    Attributes:
        action: One of :data:`ACTIONS`.
        addr: The block's (or segment's) address.
        size: Bytes: the request for ``alloc`` / ``free_*`` (not rounded), the segment's size
            for ``segment_*``, the failed request for ``oom``.
        stream: The CUDA stream (as an integer handle).
        time_us: When, in microseconds, or ``None``.
        stack: Index into :attr:`SnapshotDevice.stacks`, ``-1`` without frames.
        device_free: For ``oom``: the driver's free memory at the failure, else ``None``.
    """

    action: str
    addr: int
    size: int
    stream: int
    time_us: int | None = None
    stack: int = -1
    device_free: int | None = None


class Interner:
    """Frames and stacks of one device, each stored once (looked up by identity first: a
    snapshot shares its frame dicts and stack lists among events)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.frames: list[Frame] = []
        self.frame_index: dict[tuple[str, int, str], int] = {}
        self.by_id: dict[int, int] = {}
        self.stack_by_id: dict[int, int] = {}
        self.stacks: list[tuple[int, ...]] = []
        self.stack_index: dict[tuple[int, ...], int] = {}
        self._keep: list[Any] = []  # what by_id and stack_by_id refer to, kept alive

    def frame(self, raw: Any) -> int:
        """The index of a frame dict (``filename``, ``line``, ``name``)."""
        got = self.by_id.get(id(raw))
        if got is not None:
            return got
        if not isinstance(raw, dict):
            raise not_snapshot(self.source, "a stack frame is not a dict")
        filename = raw.get("filename", "??")
        name = raw.get("name", "??")
        line = raw.get("line", raw.get("lineno", 0))
        if type(line) is not int:
            line = 0  # absent or not a number: unknown
        elif not -INT_LIMIT < line < INT_LIMIT:
            raise not_snapshot(
                self.source, f"a stack frame's line is an integer of {line.bit_length()} bits"
            )
        key = (
            filename if isinstance(filename, str) else "??",
            line,
            name if isinstance(name, str) else "??",
        )
        index = self.frame_index.get(key)
        if index is None:
            index = self.frame_index[key] = len(self.frames)
            self.frames.append(Frame(*key))
        self.by_id[id(raw)] = index
        self._keep.append(raw)
        return index

    def stack(self, raw: Any) -> int:
        """The index of a list of frame dicts (``-1`` for none)."""
        if not raw:
            return -1
        got = self.stack_by_id.get(id(raw))
        if got is not None:
            return got
        if not isinstance(raw, list | tuple):
            raise not_snapshot(self.source, "frames is not a list")
        index = self.stack_of(raw)
        self.stack_by_id[id(raw)] = index
        self._keep.append(raw)
        return index

    def stack_of(self, raw: Sequence[Any]) -> int:
        """The index of the stack of frame dicts ``raw`` (``-1`` for none), by its frames
        alone (for a list read as tokens, which no one else holds)."""
        if not raw:
            return -1
        key = tuple(map(self.frame, raw))
        index = self.stack_index.get(key)
        if index is None:
            index = self.stack_index[key] = len(self.stacks)
            self.stacks.append(key)
        return index


class Trace(Sequence[TraceEvent]):
    """One device's events, kept in columns; each access builds its :class:`TraceEvent`.

    It is a sequence like the tuple it replaces (``len``, indexing, slicing, iteration,
    ``==`` with another sequence of events), in about 50 bytes an event.
    """

    __slots__ = ("_actions", "_addr", "_free", "_size", "_stack", "_stream", "_time")

    def __init__(self) -> None:
        self._actions = bytearray()
        self._addr = array("Q")
        self._size = array("Q")
        self._stream = array("q")
        self._time = array("q")
        self._stack = array("q")
        self._free = array("q")

    @classmethod
    def of(cls, events: Sequence[TraceEvent]) -> Trace:
        """A trace holding ``events`` (already checked records)."""
        out = cls()
        for e in events:
            out._append(
                _ACTION_CODE[e.action],
                e.addr,
                e.size,
                e.stream,
                _NONE if e.time_us is None else e.time_us,
                e.stack,
                _NONE if e.device_free is None else e.device_free,
            )
        return out

    def _append(
        self, code: int, addr: int, size: int, stream: int, time: int, stack: int, free: int
    ) -> None:
        self._actions.append(code)
        self._addr.append(addr)
        self._size.append(size)
        self._stream.append(stream)
        self._time.append(time)
        self._stack.append(stack)
        self._free.append(free)

    def __len__(self) -> int:
        return len(self._actions)

    def _event(self, i: int) -> TraceEvent:
        time = self._time[i]
        free = self._free[i]
        return TraceEvent(
            ACTIONS[self._actions[i]],
            self._addr[i],
            self._size[i],
            self._stream[i],
            None if time == _NONE else time,
            self._stack[i],
            None if free == _NONE else free,
        )

    @overload
    def __getitem__(self, index: int) -> TraceEvent: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[TraceEvent]: ...

    def __getitem__(self, index: int | slice) -> TraceEvent | Sequence[TraceEvent]:
        if isinstance(index, slice):
            return [self._event(i) for i in range(*index.indices(len(self)))]
        n = len(self._actions)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError("trace index out of range")
        return self._event(index)

    def __iter__(self) -> Iterator[TraceEvent]:
        actions = ACTIONS
        event = TraceEvent
        none = _NONE
        for code, addr, size, stream, time, stack, free in zip(
            self._actions,
            self._addr,
            self._size,
            self._stream,
            self._time,
            self._stack,
            self._free,
            strict=True,
        ):
            yield event(
                actions[code],
                addr,
                size,
                stream,
                None if time == none else time,
                stack,
                None if free == none else free,
            )

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Trace):
            return all(
                getattr(self, s) == getattr(other, s) for s in Trace.__slots__
            )  # fmt: skip
        if isinstance(other, Sequence) and not isinstance(other, str):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    def __hash__(self) -> int:
        return hash((bytes(self._actions), self._addr.tobytes(), self._size.tobytes()))

    def __repr__(self) -> str:
        return f"Trace({len(self)} events)"

    def has(self, action: str) -> bool:
        """Whether any event is ``action`` (a search of the action column, no events built)."""
        code = _ACTION_CODE.get(action)
        return code is not None and code in self._actions

    @property
    def nbytes(self) -> int:
        """Bytes the columns take."""
        return len(self._actions) + 8 * 6 * len(self._actions)


class TraceSink:
    """Checks the events of one device's trace as they come and keeps them in a
    :class:`Trace` (the pickle reader hands them over in batches and forgets each dict).

    Args:
        device: The device index (for messages).
        frames: The device's :class:`Interner`.
        source: The file, for messages.
    """

    __slots__ = ("count", "device", "frames", "source", "trace")

    def __init__(self, device: int, frames: Interner, source: str) -> None:
        self.device = device
        self.frames = frames
        self.source = source
        self.trace = Trace()
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def extend(self, events: Sequence[Any]) -> None:
        """Check and keep ``events`` (dicts as ``_snapshot()`` writes them).

        Raises:
            ConfigError: Naming the first event (``device_traces[d][k]``) that is not one.
        """
        trace = self.trace
        codes = _ACTION_CODE
        stack = self.frames.stack
        stack_ids = self.frames.stack_by_id
        limit = _SIZE_LIMIT
        big = INT_LIMIT
        none = _NONE
        add_action = trace._actions.append
        add_addr = trace._addr.append
        add_size = trace._size.append
        add_stream = trace._stream.append
        add_time = trace._time.append
        add_stack = trace._stack.append
        add_free = trace._free.append
        base = self.count
        for k, ev in enumerate(events, base):
            if type(ev) is not dict:
                raise self._bad(k, "", f"is {shown(ev)}, not a dict")
            get = ev.get
            action = get("action")
            code = codes.get(action) if type(action) is str else None
            if code is None:
                raise self._bad(k, ".action", f"is {shown(action)}")
            addr = get("addr", 0)
            if not (type(addr) is int and 0 <= addr < limit):
                addr = read_size(addr, self._where(k, ".addr"), self.source)
            size = get("size", 0)
            if not (type(size) is int and 0 <= size < limit):
                size = read_size(size, self._where(k, ".size"), self.source)
            stream = get("stream", 0)
            if type(stream) is not int or not -big < stream < big:
                stream = read_int(stream, self._where(k, ".stream"), self.source)
            time = get("time_us")
            if type(time) is not int or not -big < time < big:
                time = none  # absent or not a time: unknown
            free = get("device_free")
            if free is None:
                free = none
            elif not (type(free) is int and 0 <= free < big):
                free = read_size(free, self._where(k, ".device_free"), self.source)
                if free >= big:
                    raise self._bad(k, ".device_free", "is not a size")
            raw = get("frames")
            if raw:
                index = stack_ids.get(id(raw))
                if index is None:
                    index = stack(raw)
            else:
                index = -1
            add_action(code)
            add_addr(addr)
            add_size(size)
            add_stream(stream)
            add_time(time)
            add_stack(index)
            add_free(free)
            self.count = k + 1

    def extend_columns(
        self,
        actions: bytes,
        addr: array[int],
        size: array[int],
        stream: array[int],
        time: array[int],
        stack: array[int],
        free: array[int],
    ) -> None:
        """Keep events already checked, given as columns of equal length (the bulk path of
        :mod:`memfit.allocator.snapshot_bulk`: action codes, addresses and sizes under
        ``2**64``, streams and times in ``(-2**63, 2**63)``, stack indices of
        :attr:`frames`, free memory or the missing mark)."""
        trace = self.trace
        trace._actions.extend(actions)
        trace._addr.extend(addr)
        trace._size.extend(size)
        trace._stream.extend(stream)
        trace._time.extend(time)
        trace._stack.extend(stack)
        trace._free.extend(free)
        self.count += len(actions)

    def _where(self, k: int, field: str) -> str:
        return f"device_traces[{self.device}][{k}]{field}"

    def _bad(self, k: int, field: str, why: str) -> ConfigError:
        return not_snapshot(self.source, f"{self._where(k, field)} {why}")
