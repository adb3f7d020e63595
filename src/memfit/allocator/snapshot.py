"""The one reader of CUDA caching-allocator snapshots (``torch.cuda.memory._snapshot()``).

``torch.cuda.memory._dump_snapshot(path)`` pickles a dict of plain data: ``segments`` (every
segment the allocator holds, with its blocks and their state), ``device_traces`` (one list
of events per device, when ``torch.cuda.memory._record_memory_history()`` was on), and in
newer PyTorch ``allocator_settings``. This module reads it, memfit's own OOM dump (the same
dict, written by :mod:`memfit.monitor._oom_dump`) or the same data as JSON (optionally
gzip-compressed), into plain frozen records; it imports no torch.

A snapshot is untrusted input: a pickle can name any Python callable and run it while it is
loaded. The unpickler here resolves no global at all: a pickle that names one (``GLOBAL``,
``STACK_GLOBAL``, ``INST``, ``OBJ``, the ``REDUCE`` / ``NEWOBJ`` / ``BUILD`` that need a class,
persistent ids, copyreg extensions) is refused before anything of it is called. Files over
:data:`MAX_SNAPSHOT_BYTES` (also after gzip) and data nested deeper than a snapshot nests
(:data:`MAX_DEPTH`) are refused with a message that says so.

Stack frames are interned: each event and block carries the index of its stack in
:attr:`DeviceSnapshot.stacks` (a tuple of indices into :attr:`DeviceSnapshot.frames`,
innermost first as PyTorch records them), or ``-1`` when it has none.
"""

from __future__ import annotations

import copyreg
import gzip
import io
import json
import os
import pickle
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memfit._userfiles import file_error, read_user_bytes
from memfit.errors import ConfigError

__all__ = [
    "ACTIONS",
    "BLOCK_STATES",
    "MAX_DEPTH",
    "MAX_SNAPSHOT_BYTES",
    "RECORD_HINT",
    "BlockInfo",
    "DeviceSnapshot",
    "Frame",
    "SegmentInfo",
    "Snapshot",
    "TraceEvent",
    "load_snapshot",
    "parse_snapshot",
    "snapshot_from_data",
    "snapshot_to_data",
    "write_json_gz",
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

#: Block states in ``segments[i]["blocks"]``.
BLOCK_STATES: tuple[str, ...] = ("active_allocated", "active_pending_free", "inactive")

#: Largest snapshot read, in bytes (the file, and again the data after gzip).
MAX_SNAPSHOT_BYTES = 1 << 30

#: Deepest nesting of lists and dicts a snapshot has (segments > blocks > frames > frame is 5;
#: ``user_metadata`` and ``segment_pool_id`` add little); deeper data is refused.
MAX_DEPTH = 32

#: How to record a snapshot, for messages.
RECORD_HINT = (
    "record one with torch.cuda.memory._record_memory_history(max_entries=100000) before the "
    "steps and torch.cuda.memory._dump_snapshot('snapshot.pickle') after them (or at the "
    "out-of-memory error)"
)

_PICKLE_HINT = (
    "pass a file written by torch.cuda.memory._dump_snapshot(), by memfit's Recorder OOM "
    "dump, or the same data as JSON"
)


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
        stack: Index into :attr:`DeviceSnapshot.stacks`, ``-1`` without frames.
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
        stack: Index into :attr:`DeviceSnapshot.stacks`, ``-1`` without frames.
        device_free: For ``oom``: the driver's free memory at the failure, else ``None``.
    """

    action: str
    addr: int
    size: int
    stream: int
    time_us: int | None = None
    stack: int = -1
    device_free: int | None = None


@dataclass(frozen=True)
class DeviceSnapshot:
    """One device's segments (at the end) and trace (in order)."""

    device: int
    segments: tuple[SegmentInfo, ...]
    trace: tuple[TraceEvent, ...]
    frames: tuple[Frame, ...] = ()
    stacks: tuple[tuple[int, ...], ...] = ()

    @property
    def has_frames(self) -> bool:
        """Whether any event or block carries a stack."""
        return bool(self.stacks)

    def stack_frames(self, stack: int) -> list[Frame]:
        """The frames of stack ``stack`` (innermost first); empty for ``-1``."""
        if stack < 0:
            return []
        return [self.frames[i] for i in self.stacks[stack]]

    @property
    def reserved_bytes(self) -> int:
        """Bytes the segments hold at the end."""
        return sum(s.total_size for s in self.segments)

    @property
    def allocated_bytes(self) -> int:
        """Bytes of live blocks at the end."""
        return sum(b.size for s in self.segments for b in s.blocks if b.live)


@dataclass(frozen=True)
class Snapshot:
    """A whole snapshot: one :class:`DeviceSnapshot` per device that appears in it.

    Attributes:
        devices: By device index, ascending.
        settings: The allocator's settings as recorded (``allocator_settings``), or empty
            (older PyTorch records none).
        source: Where it came from (a path, ``"<data>"``).
        kind: ``"pickle"`` or ``"json"``.
        meta: memfit's own ``memfit`` section (format, origin, notes), or empty.
        has_traces: Whether the data has ``device_traces`` at all (``_snapshot()`` always
            writes it, empty lists when no history was recorded).
    """

    devices: tuple[DeviceSnapshot, ...]
    settings: Mapping[str, Any] = field(default_factory=dict)
    source: str = "<data>"
    kind: str = "json"
    meta: Mapping[str, Any] = field(default_factory=dict)
    has_traces: bool = True

    def device(self, index: int | None = None) -> DeviceSnapshot:
        """The device ``index``; by default the one with an ``oom`` event, else the longest
        trace, else the most reserved memory.

        Raises:
            ConfigError: When ``index`` is not in the snapshot.
        """
        if index is not None:
            for dev in self.devices:
                if dev.device == index:
                    return dev
            have = ", ".join(str(d.device) for d in self.devices) or "none"
            raise ConfigError(
                f"the snapshot has no device {index} (it has {have})",
                key_path=f"{self.source}: --device",
                hint="pick one of the devices it has",
            )
        return max(
            self.devices,
            key=lambda d: (
                any(e.action == "oom" for e in d.trace),
                len(d.trace),
                d.reserved_bytes,
                -d.device,
            ),
        )

    @property
    def expandable_segments(self) -> bool:
        """Whether the run used expandable segments (settings, or any segment says so)."""
        if bool(self.settings.get("expandable_segments")):
            return True
        return any(s.expandable for d in self.devices for s in d.segments)

    @property
    def max_split_size(self) -> int | None:
        """``max_split_size`` in bytes, ``None`` when unlimited or unknown."""
        value = self.settings.get("max_split_size")
        if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 1 << 62:
            return value
        return None


# --- reading -------------------------------------------------------------------------------------


class _NoGlobals(pickle.Unpickler):
    """Unpickles plain data only: every way a pickle names a Python object is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise ConfigError(
            f"the pickle names the Python object {_printable(module)}.{_printable(name)}; "
            "a memory snapshot holds only plain data (dicts, lists, strings, numbers), so it "
            "is refused and nothing of it is run",
            hint="only open pickles you trust; " + _PICKLE_HINT,
        )

    def persistent_load(self, pid: Any) -> Any:
        raise ConfigError(
            "the pickle refers to a persistent object; a memory snapshot has none, so it is "
            "refused",
            hint=_PICKLE_HINT,
        )


class _PyNoGlobals(pickle._Unpickler):
    """The pure-Python unpickler with the opcodes that reach objects removed (used when the
    process registered copyreg extensions, which the C unpickler resolves from its cache
    without asking :meth:`find_class`)."""

    def find_class(self, module: str, name: str) -> Any:
        return _NoGlobals.find_class(self, module, name)  # type: ignore[arg-type]

    def persistent_load(self, pid: Any) -> Any:
        return _NoGlobals.persistent_load(self, pid)  # type: ignore[arg-type]

    def _refuse(self) -> None:
        self.find_class("copyreg", "extension")


_DISPATCH: dict[int, Any] = dict(pickle._Unpickler.dispatch)
for _op in (pickle.EXT1, pickle.EXT2, pickle.EXT4):
    _DISPATCH[_op[0]] = _PyNoGlobals._refuse
_PyNoGlobals.dispatch = _DISPATCH


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in str(text))[:80]


def load_snapshot(path: str | Path, *, max_bytes: int = MAX_SNAPSHOT_BYTES) -> Snapshot:
    """Read a snapshot file (pickle, JSON, either gzip-compressed).

    Args:
        path: The file.
        max_bytes: Refuse a larger file (and more data after gzip).

    Raises:
        ConfigError: When the file is missing, not a regular file, too large, not a snapshot,
            cut off, names a Python object, or has no device trace and no segments.
    """
    source = Path(path)
    try:
        size = os.stat(source).st_size
    except OSError as exc:
        raise file_error(exc, source, action="read the snapshot", hint=_PICKLE_HINT) from exc
    if size > max_bytes:
        raise _too_big(str(source), size, max_bytes)
    data = read_user_bytes(source, what="the snapshot", hint=_PICKLE_HINT)
    return parse_snapshot(data, source=str(source), max_bytes=max_bytes)


def _too_big(source: str, size: int, max_bytes: int) -> ConfigError:
    return ConfigError(
        f"{size} bytes, more than the {max_bytes} bytes memfit reads as a snapshot",
        key_path=source,
        hint="record fewer entries (_record_memory_history(max_entries=...)), or pass a "
        "larger max_bytes= to memfit.explain",
    )


def _gunzip(data: bytes, source: str, max_bytes: int) -> bytes:
    stream = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = stream.decompress(data, max_bytes + 1)
    except zlib.error as exc:
        raise ConfigError(
            f"a broken gzip file ({exc})", key_path=source, hint=_PICKLE_HINT
        ) from exc
    if len(out) > max_bytes:
        raise _too_big(source + " (after gzip)", len(out), max_bytes)
    if not stream.eof:
        raise ConfigError("the gzip data is cut off", key_path=source, hint="copy the file again")
    return out


def parse_snapshot(
    data: bytes, *, source: str = "<data>", max_bytes: int = MAX_SNAPSHOT_BYTES
) -> Snapshot:
    """Read a snapshot from its bytes (see :func:`load_snapshot`)."""
    if len(data) > max_bytes:
        raise _too_big(source, len(data), max_bytes)
    if data[:2] == b"\x1f\x8b":
        data = _gunzip(data, source, max_bytes)
    if not data.strip():
        raise ConfigError("the file is empty", key_path=source, hint=_PICKLE_HINT)
    if data[:1] == b"\x80":
        return snapshot_from_data(_unpickle(data, source), source=source, kind="pickle")
    if data.lstrip()[:1] in (b"{", b"["):
        try:
            obj = json.loads(data)
        except RecursionError as exc:
            raise _too_deep(source) from exc
        except ValueError as exc:
            if _is_recorder_log(data):
                raise ConfigError(
                    "this is a Recorder log or OOM samples file (JSON lines), not a memory "
                    "snapshot",
                    key_path=source,
                    hint="pass the .snapshot.pickle written next to it (or read this one "
                    "with `memfit report`)",
                ) from exc
            raise ConfigError(
                f"not valid JSON ({exc})", key_path=source, hint=_PICKLE_HINT
            ) from exc
        return snapshot_from_data(obj, source=source, kind="json")
    if data[:4] == b"PK\x03\x04":
        raise ConfigError(
            "a zip archive (torch.save() writes these: a checkpoint), not a memory snapshot",
            key_path=source,
            hint=_PICKLE_HINT,
        )
    raise ConfigError(
        "neither a pickle (protocol 2 or later) nor JSON",
        key_path=source,
        hint=_PICKLE_HINT,
    )


def _is_recorder_log(data: bytes) -> bool:
    """Whether the first line is a JSON object with a ``type`` (a Recorder's record)."""
    first = data.lstrip().split(b"\n", 1)[0]
    try:
        record = json.loads(first)
    except (ValueError, RecursionError):
        return False
    return isinstance(record, dict) and "type" in record


def _unpickle(data: bytes, source: str) -> Any:
    extensions = bool(copyreg._extension_registry) or bool(copyreg._extension_cache)  # type: ignore[attr-defined]
    cls = _PyNoGlobals if extensions else _NoGlobals
    try:
        return cls(io.BytesIO(data)).load()
    except ConfigError as exc:
        raise ConfigError(exc.message, key_path=source, hint=exc.hint) from None
    except RecursionError as exc:
        raise _too_deep(source) from exc
    except (EOFError, pickle.UnpicklingError) as exc:
        if not isinstance(exc, EOFError) and "truncated" not in str(exc):
            raise ConfigError(
                f"not a readable pickle ({_printable(str(exc))})",
                key_path=source,
                hint=_PICKLE_HINT,
            ) from exc
        raise ConfigError(
            "the pickle is cut off (it ends before its STOP)",
            key_path=source,
            hint="copy the file again; a dump interrupted while it was written is incomplete",
        ) from exc
    except (
        ValueError,
        TypeError,
        KeyError,
        IndexError,
        AttributeError,
        OverflowError,
        MemoryError,
    ) as exc:
        raise ConfigError(
            f"not a readable pickle ({_printable(str(exc))})",
            key_path=source,
            hint=_PICKLE_HINT,
        ) from exc


def _too_deep(source: str) -> ConfigError:
    return ConfigError(
        f"the data is nested more than {MAX_DEPTH} levels deep; a memory snapshot is not",
        key_path=source,
        hint=_PICKLE_HINT,
    )


def _check_depth(obj: Any, source: str) -> None:
    """Refuse lists / dicts nested deeper than :data:`MAX_DEPTH` (an iterative walk that
    visits each container once; shared containers, as pickle memoises them, once)."""
    seen: set[int] = set()
    todo: list[tuple[Any, int]] = [(obj, 1)]
    while todo:
        item, depth = todo.pop()
        if depth > MAX_DEPTH:
            raise _too_deep(source)
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, dict):
            todo.extend((v, depth + 1) for v in item.values() if isinstance(v, dict | list | tuple))
        else:
            todo.extend((v, depth + 1) for v in item if isinstance(v, dict | list | tuple))


def _not_snapshot(source: str, why: str) -> ConfigError:
    return ConfigError(f"not a CUDA memory snapshot ({why})", key_path=source, hint=_PICKLE_HINT)


def _int(value: Any, where: str, source: str, *, default: int | None = None) -> int:
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _not_snapshot(source, f"{where} is {type(value).__name__}, not an integer")
    return value


def _size(value: Any, where: str, source: str) -> int:
    got = _int(value, where, source, default=0)
    if not 0 <= got < 1 << 64:
        raise _not_snapshot(source, f"{where} is {got}, not a size")
    return got


class _Interner:
    """Frames and stacks, each stored once."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.frames: list[Frame] = []
        self.frame_index: dict[tuple[str, int, str], int] = {}
        self.by_id: dict[int, int] = {}
        self.stack_by_id: dict[int, int] = {}
        self.stacks: list[tuple[int, ...]] = []
        self.stack_index: dict[tuple[int, ...], int] = {}

    def frame(self, raw: Any) -> int:
        got = self.by_id.get(id(raw))
        if got is not None:
            return got
        try:  # the common case, checked once per distinct frame below
            key: Any = (raw["filename"], raw["line"], raw["name"])
            index = self.frame_index.get(key)
        except (KeyError, TypeError):
            index = None
        if index is None:
            if not isinstance(raw, dict):
                raise _not_snapshot(self.source, "a stack frame is not a dict")
            line = raw.get("line", raw.get("lineno", 0))
            key = (
                str(raw.get("filename", "??")),
                line if isinstance(line, int) and not isinstance(line, bool) else 0,
                str(raw.get("name", "??")),
            )
            index = self.frame_index.get(key)
            if index is None:
                index = self.frame_index[key] = len(self.frames)
                self.frames.append(Frame(*key))
        self.by_id[id(raw)] = index
        return index

    def stack(self, raw: Any) -> int:
        if not raw:
            return -1
        got = self.stack_by_id.get(id(raw))
        if got is not None:
            return got
        if not isinstance(raw, list | tuple):
            raise _not_snapshot(self.source, "frames is not a list")
        key = tuple(map(self.frame, raw))
        index = self.stack_index.get(key)
        if index is None:
            index = self.stack_index[key] = len(self.stacks)
            self.stacks.append(key)
        self.stack_by_id[id(raw)] = index
        return index


def _block_stack(raw: Mapping[str, Any], frames: _Interner) -> int:
    if raw.get("frames"):
        return frames.stack(raw["frames"])
    history = raw.get("history")  # PyTorch 2.0 / 2.1
    if isinstance(history, list) and history and isinstance(history[-1], dict):
        return frames.stack(history[-1].get("frames"))
    return -1


def snapshot_from_data(obj: Any, *, source: str = "<data>", kind: str = "json") -> Snapshot:
    """Check and convert the plain data of a snapshot (what ``_snapshot()`` returns).

    Raises:
        ConfigError: When it is not a snapshot, or has neither segments nor a device trace.
    """
    if not isinstance(obj, dict):
        raise _not_snapshot(source, f"a {type(obj).__name__}, not a dict")
    # The segments and traces are read field by field with their types checked, so nothing
    # deeper than a snapshot nests is followed there; the rest is checked here.
    _check_depth({k: v for k, v in obj.items() if k not in ("segments", "device_traces")}, source)
    if "segments" not in obj:
        keys = ", ".join(sorted(_printable(str(k)) for k in obj)[:8]) or "none"
        raise _not_snapshot(source, f"no 'segments' key; its keys are {keys}")
    raw_segments = obj["segments"]
    raw_traces = obj.get("device_traces") or []
    if not isinstance(raw_segments, list) or not isinstance(raw_traces, list):
        raise _not_snapshot(source, "'segments' and 'device_traces' must be lists")
    by_device: dict[int, list[SegmentInfo]] = {}
    interners: dict[int, _Interner] = {}

    def interner(device: int) -> _Interner:
        got = interners.get(device)
        if got is None:
            got = interners[device] = _Interner(source)
        return got

    for i, seg in enumerate(raw_segments):
        where = f"segments[{i}]"
        if not isinstance(seg, dict):
            raise _not_snapshot(source, f"{where} is not a dict")
        device = _int(seg.get("device", 0), f"{where}.device", source)
        frames = interner(device)
        blocks = []
        raw_blocks = seg.get("blocks") or []
        if not isinstance(raw_blocks, list):
            raise _not_snapshot(source, f"{where}.blocks is not a list")
        for j, blk in enumerate(raw_blocks):
            bw = f"{where}.blocks[{j}]"
            if not isinstance(blk, dict):
                raise _not_snapshot(source, f"{bw} is not a dict")
            state = blk.get("state")
            if state not in BLOCK_STATES:
                raise _not_snapshot(source, f"{bw}.state is {_printable(str(state))!r}")
            blocks.append(
                BlockInfo(
                    address=_size(blk.get("address"), f"{bw}.address", source),
                    size=_size(blk.get("size"), f"{bw}.size", source),
                    requested_size=_size(blk.get("requested_size", 0), f"{bw}.requested", source),
                    state=str(state),
                    stack=_block_stack(blk, frames),
                )
            )
        seg_type = seg.get("segment_type", "large")
        if seg_type not in ("small", "large"):
            raise _not_snapshot(source, f"{where}.segment_type is {_printable(str(seg_type))!r}")
        by_device.setdefault(device, []).append(
            SegmentInfo(
                address=_size(seg.get("address"), f"{where}.address", source),
                total_size=_size(seg.get("total_size"), f"{where}.total_size", source),
                stream=_int(seg.get("stream", 0), f"{where}.stream", source),
                small=seg_type == "small",
                expandable=bool(seg.get("is_expandable", False)),
                blocks=tuple(blocks),
                stack=frames.stack(seg.get("frames")) if seg.get("frames") else -1,
            )
        )
    traces: dict[int, list[TraceEvent]] = {}
    for device, raw_trace in enumerate(raw_traces):
        if not isinstance(raw_trace, list):
            raise _not_snapshot(source, f"device_traces[{device}] is not a list")
        if not raw_trace:
            continue
        traces[device] = _read_trace(raw_trace, device, interner(device), source)
    devices = []
    for device in sorted(set(by_device) | set(traces)):
        frames = interner(device)
        segs = sorted(by_device.get(device, []), key=lambda s: s.address)
        devices.append(
            DeviceSnapshot(
                device=device,
                segments=tuple(segs),
                trace=tuple(traces.get(device, [])),
                frames=tuple(frames.frames),
                stacks=tuple(frames.stacks),
            )
        )
    settings = obj.get("allocator_settings")
    meta = obj.get("memfit")
    return Snapshot(
        devices=tuple(devices),
        settings=dict(settings) if isinstance(settings, dict) else {},
        source=source,
        kind=kind,
        meta=dict(meta) if isinstance(meta, dict) else {},
        has_traces="device_traces" in obj,
    )


def _read_trace(
    raw_trace: Sequence[Any], device: int, frames: _Interner, source: str
) -> list[TraceEvent]:
    out = []
    for k, ev in enumerate(raw_trace):
        where = f"device_traces[{device}][{k}]"
        if not isinstance(ev, dict):
            raise _not_snapshot(source, f"{where} is not a dict")
        action = ev.get("action")
        if action not in ACTIONS:
            raise _not_snapshot(source, f"{where}.action is {_printable(str(action))!r}")
        time_us = ev.get("time_us")
        free = ev.get("device_free")
        out.append(
            TraceEvent(
                action=str(action),
                addr=_size(ev.get("addr", 0), f"{where}.addr", source),
                size=_size(ev.get("size", 0), f"{where}.size", source),
                stream=_int(ev.get("stream", 0), f"{where}.stream", source),
                time_us=time_us
                if isinstance(time_us, int) and not isinstance(time_us, bool)
                else None,
                stack=frames.stack(ev.get("frames")) if ev.get("frames") else -1,
                device_free=_size(free, f"{where}.device_free", source)
                if free is not None
                else None,
            )
        )
    return out


# --- writing -------------------------------------------------------------------------------------


def snapshot_to_data(
    snapshot: Snapshot, *, frames: bool = True, times: bool = True
) -> dict[str, Any]:
    """The snapshot as the plain data ``_snapshot()`` returns (JSON-ready), optionally
    without stack frames or times; :func:`snapshot_from_data` reads it back."""

    def stack(dev: DeviceSnapshot, index: int) -> list[dict[str, Any]]:
        if not frames or index < 0:
            return []
        return [
            {"filename": f.filename, "line": f.line, "name": f.name}
            for f in dev.stack_frames(index)
        ]

    segments: list[dict[str, Any]] = []
    traces: list[list[dict[str, Any]]] = []
    for dev in snapshot.devices:
        for seg in dev.segments:
            segments.append(
                {
                    "device": dev.device,
                    "address": seg.address,
                    "total_size": seg.total_size,
                    "stream": seg.stream,
                    "segment_type": "small" if seg.small else "large",
                    "is_expandable": seg.expandable,
                    "frames": stack(dev, seg.stack),
                    "blocks": [
                        {
                            "address": b.address,
                            "size": b.size,
                            "requested_size": b.requested_size,
                            "state": b.state,
                            "frames": stack(dev, b.stack),
                        }
                        for b in seg.blocks
                    ],
                }
            )
        while len(traces) < dev.device:
            traces.append([])
        events = []
        for e in dev.trace:
            item: dict[str, Any] = {
                "action": e.action,
                "addr": e.addr,
                "size": e.size,
                "stream": e.stream,
            }
            if times and e.time_us is not None:
                item["time_us"] = e.time_us
            if e.device_free is not None:
                item["device_free"] = e.device_free
            if frames and e.stack >= 0:
                item["frames"] = stack(dev, e.stack)
            events.append(item)
        traces.append(events)
    out: dict[str, Any] = {"segments": segments, "device_traces": traces}
    if snapshot.settings:
        out["allocator_settings"] = dict(snapshot.settings)
    if snapshot.meta:
        out["memfit"] = dict(snapshot.meta)
    return out


def write_json_gz(data: Mapping[str, Any], path: str | Path) -> Path:
    """Write snapshot data as gzip JSON (deterministic bytes: no name, no time)."""
    target = Path(path)
    raw = json.dumps(data, separators=(",", ":")).encode()
    target.write_bytes(gzip.compress(raw, compresslevel=9, mtime=0))
    return target
