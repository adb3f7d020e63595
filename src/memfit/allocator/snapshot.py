"""The one reader of CUDA caching-allocator snapshots (``torch.cuda.memory._snapshot()``).

``torch.cuda.memory._dump_snapshot(path)`` pickles a dict of plain data: ``segments`` (every
segment the allocator holds, with its blocks and their state), ``device_traces`` (one list
of events per device, when ``torch.cuda.memory._record_memory_history()`` was on), and in
newer PyTorch ``allocator_settings``. This module reads it, memfit's own OOM dump (the same
dict, written by :mod:`memfit.monitor._oom_dump`) or the same data as JSON (optionally
gzip-compressed), into plain frozen records; it imports no torch.

A snapshot is untrusted input: a pickle can name any Python callable and run it while it is
loaded. Pickles are read by memfit's own opcode interpreter
(:mod:`memfit.allocator.snapshot_pickle`), never by ``pickle.load``: it resolves no global at
all (``GLOBAL``, ``STACK_GLOBAL``, ``INST``, ``OBJ``, ``REDUCE``, ``NEWOBJ``, ``BUILD``,
persistent ids, copyreg extensions are refused before anything of them is called), builds
without recursion, hashes only flat keys, and counts every object it builds, a memo
reference counted as everything it holds. Files over ``max_bytes`` (default
:data:`MAX_SNAPSHOT_BYTES`, also after gzip) and data nested deeper than a snapshot nests
(:data:`MAX_DEPTH`) are refused with a message that says so.

Memory and time are linear in the file: the events of a trace are checked and kept in
columns as they are read (:class:`~memfit.allocator.snapshot_records.Trace`, about 50 bytes
an event), so a pickle of 7.7 million events (200 MB) is read in about the same memory again,
and runs of events of one layout are read by one regular expression at a time
(:mod:`memfit.allocator.snapshot_bulk`, about 1 us an event; ``docs/benchmarks.md``).
``progress(done, total)`` reports long reads.

Stack frames are interned: each event and block carries the index of its stack in
:attr:`SnapshotDevice.stacks` (a tuple of indices into :attr:`SnapshotDevice.frames`,
innermost first as PyTorch records them), or ``-1`` when it has none.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memfit._userfiles import file_error, read_user_bytes
from memfit.allocator.snapshot_pickle import read_pickle
from memfit.allocator.snapshot_records import (
    ACTIONS,
    BLOCK_STATES,
    PICKLE_HINT,
    BlockInfo,
    Frame,
    Interner,
    SegmentInfo,
    Trace,
    TraceEvent,
    TraceSink,
    not_snapshot,
    printable,
    read_int,
    read_size,
    shown,
)
from memfit.errors import ConfigError

__all__ = [
    "ACTIONS",
    "BLOCK_STATES",
    "MAX_DEPTH",
    "MAX_SNAPSHOT_BYTES",
    "RECORD_HINT",
    "BlockInfo",
    "Frame",
    "SegmentInfo",
    "Snapshot",
    "SnapshotDevice",
    "Trace",
    "TraceEvent",
    "load_snapshot",
    "parse_snapshot",
    "snapshot_from_data",
    "snapshot_to_data",
    "write_json_gz",
]

#: Largest snapshot read by default, in bytes (the file, and again the data after gzip):
#: ``max_bytes=`` lifts it.
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

_PICKLE_HINT = PICKLE_HINT

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class SnapshotDevice:
    """One device's segments (at the end) and trace (in order)."""

    device: int
    segments: tuple[SegmentInfo, ...]
    trace: Sequence[TraceEvent]
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
    """A whole snapshot: one :class:`SnapshotDevice` per device that appears in it.

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

    devices: tuple[SnapshotDevice, ...]
    settings: Mapping[str, Any] = field(default_factory=dict)
    source: str = "<data>"
    kind: str = "json"
    meta: Mapping[str, Any] = field(default_factory=dict)
    has_traces: bool = True

    def device(self, index: int | None = None) -> SnapshotDevice:
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
                d.trace.has("oom")
                if isinstance(d.trace, Trace)
                else any(e.action == "oom" for e in d.trace),
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


def load_snapshot(
    path: str | Path,
    *,
    max_bytes: int = MAX_SNAPSHOT_BYTES,
    progress: Progress | None = None,
) -> Snapshot:
    """Read a snapshot file (pickle, JSON, either gzip-compressed).

    Args:
        path: The file.
        max_bytes: Refuse a larger file (and more data after gzip); any size may be given.
        progress: ``progress(done, total)`` in bytes while a pickle is read (every 8 MiB).

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
    data = read_user_bytes(
        source, what="the snapshot", hint=_PICKLE_HINT, max_bytes=min(max_bytes, sys.maxsize - 1)
    )
    return parse_snapshot(data, source=str(source), max_bytes=max_bytes, progress=progress)


def _too_big(source: str, size: int, max_bytes: int) -> ConfigError:
    return ConfigError(
        f"{size} bytes, more than the {max_bytes} bytes memfit reads as a snapshot",
        key_path=source,
        hint="record fewer entries (_record_memory_history(max_entries=...)), or pass a "
        "larger max_bytes= to memfit.explain",
    )


def _gunzip(data: bytes, source: str, max_bytes: int) -> bytes:
    stream = zlib.decompressobj(16 + zlib.MAX_WBITS)
    # zlib takes a length that fits a C ssize_t: any max_bytes beyond that is no bound at all
    cap = min(max_bytes, sys.maxsize - 1)
    try:
        out = stream.decompress(data, cap + 1)
    except zlib.error as exc:
        raise ConfigError(
            f"a broken gzip file ({exc})", key_path=source, hint=_PICKLE_HINT
        ) from exc
    if len(out) > cap:
        raise _too_big(source + " (after gzip)", len(out), max_bytes)
    if not stream.eof:
        raise ConfigError("the gzip data is cut off", key_path=source, hint="copy the file again")
    return out


def parse_snapshot(
    data: bytes,
    *,
    source: str = "<data>",
    max_bytes: int = MAX_SNAPSHOT_BYTES,
    progress: Progress | None = None,
) -> Snapshot:
    """Read a snapshot from its bytes (see :func:`load_snapshot`)."""
    if len(data) > max_bytes:
        raise _too_big(source, len(data), max_bytes)
    if data[:2] == b"\x1f\x8b":
        data = _gunzip(data, source, max_bytes)
    if not data.strip():
        raise ConfigError("the file is empty", key_path=source, hint=_PICKLE_HINT)
    if data[:1] == b"\x80":
        return _from_pickle(data, source, progress)
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
                f"not valid JSON ({printable(str(exc))})", key_path=source, hint=_PICKLE_HINT
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


class _Devices:
    """One interner per device, shared by its segments and its trace."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.by_device: dict[int, Interner] = {}

    def __call__(self, device: int) -> Interner:
        got = self.by_device.get(device)
        if got is None:
            got = self.by_device[device] = Interner(self.source)
        return got

    def sink(self, device: int) -> TraceSink:
        return TraceSink(device, self(device), self.source)


def _from_pickle(data: bytes, source: str, progress: Progress | None) -> Snapshot:
    devices = _Devices(source)
    obj = read_pickle(data, source=source, make_trace=devices.sink, progress=progress)
    return _convert(obj, source, "pickle", devices)


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
            for k, v in item.items():
                todo.extend((x, depth + 1) for x in (k, v) if isinstance(x, _NESTED))
        else:
            todo.extend((v, depth + 1) for v in item if isinstance(v, _NESTED))


_NESTED = (dict, list, tuple, set, frozenset)


def _block_stack(raw: Mapping[str, Any], frames: Interner) -> int:
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
    return _convert(obj, source, kind, _Devices(source))


def _convert(obj: Any, source: str, kind: str, devices: _Devices) -> Snapshot:
    if not isinstance(obj, dict):
        raise not_snapshot(source, f"{shown(obj)}, not a dict")
    # The segments and traces are read field by field with their types checked, so nothing
    # deeper than a snapshot nests is followed there; the rest is checked here.
    _check_depth({k: v for k, v in obj.items() if k not in ("segments", "device_traces")}, source)
    if "segments" not in obj:
        keys = ", ".join(sorted(printable(str(k)) for k in obj)[:8]) or "none"
        raise not_snapshot(source, f"no 'segments' key; its keys are {keys}")
    raw_segments = obj["segments"]
    raw_traces = obj.get("device_traces") or []
    if not isinstance(raw_segments, list) or not isinstance(raw_traces, list):
        raise not_snapshot(source, "'segments' and 'device_traces' must be lists")
    by_device = _read_segments(raw_segments, source, devices)
    traces: dict[int, Trace] = {}
    for device, raw_trace in enumerate(raw_traces):
        if isinstance(raw_trace, TraceSink):
            sink = raw_trace  # read while the pickle was
        elif isinstance(raw_trace, list):
            sink = devices.sink(device)
            sink.extend(raw_trace)
        else:
            raise not_snapshot(source, f"device_traces[{device}] is not a list")
        if len(sink):
            traces[device] = sink.trace
    out = []
    for device in sorted(set(by_device) | set(traces)):
        frames = devices(device)
        segs = sorted(by_device.get(device, []), key=lambda s: s.address)
        out.append(
            SnapshotDevice(
                device=device,
                segments=tuple(segs),
                trace=traces.get(device, Trace()),
                frames=tuple(frames.frames),
                stacks=tuple(frames.stacks),
            )
        )
    settings = obj.get("allocator_settings")
    meta = obj.get("memfit")
    return Snapshot(
        devices=tuple(out),
        settings=dict(settings) if isinstance(settings, dict) else {},
        source=source,
        kind=kind,
        meta=dict(meta) if isinstance(meta, dict) else {},
        has_traces="device_traces" in obj,
    )


def _read_segments(
    raw_segments: list[Any], source: str, devices: _Devices
) -> dict[int, list[SegmentInfo]]:
    by_device: dict[int, list[SegmentInfo]] = {}
    for i, seg in enumerate(raw_segments):
        where = f"segments[{i}]"
        if not isinstance(seg, dict):
            raise not_snapshot(source, f"{where} is not a dict")
        device = read_int(seg.get("device", 0), f"{where}.device", source)
        if not 0 <= device < 1 << 16:
            raise not_snapshot(source, f"{where}.device is {device}, not a device index")
        frames = devices(device)
        blocks = []
        raw_blocks = seg.get("blocks") or []
        if not isinstance(raw_blocks, list):
            raise not_snapshot(source, f"{where}.blocks is not a list")
        for j, blk in enumerate(raw_blocks):
            bw = f"{where}.blocks[{j}]"
            if not isinstance(blk, dict):
                raise not_snapshot(source, f"{bw} is not a dict")
            state = blk.get("state")
            if not isinstance(state, str) or state not in BLOCK_STATES:
                raise not_snapshot(source, f"{bw}.state is {shown(state)}")
            blocks.append(
                BlockInfo(
                    address=read_size(blk.get("address"), f"{bw}.address", source),
                    size=read_size(blk.get("size"), f"{bw}.size", source),
                    requested_size=read_size(
                        blk.get("requested_size", 0), f"{bw}.requested", source
                    ),
                    state=state,
                    stack=_block_stack(blk, frames),
                )
            )
        seg_type = seg.get("segment_type", "large")
        if not isinstance(seg_type, str) or seg_type not in ("small", "large"):
            raise not_snapshot(source, f"{where}.segment_type is {shown(seg_type)}")
        by_device.setdefault(device, []).append(
            SegmentInfo(
                address=read_size(seg.get("address"), f"{where}.address", source),
                total_size=read_size(seg.get("total_size"), f"{where}.total_size", source),
                stream=read_int(seg.get("stream", 0), f"{where}.stream", source),
                small=seg_type == "small",
                expandable=bool(seg.get("is_expandable", False)),
                blocks=tuple(blocks),
                stack=frames.stack(seg.get("frames")) if seg.get("frames") else -1,
            )
        )
    return by_device


# --- writing -------------------------------------------------------------------------------------


def snapshot_to_data(
    snapshot: Snapshot, *, frames: bool = True, times: bool = True
) -> dict[str, Any]:
    """The snapshot as the plain data ``_snapshot()`` returns (JSON-ready), optionally
    without stack frames or times; :func:`snapshot_from_data` reads it back."""

    def stack(dev: SnapshotDevice, index: int) -> list[dict[str, Any]]:
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
