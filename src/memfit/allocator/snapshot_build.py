"""Build a CUDA memory snapshot from a sequence of requests, through the allocator model.

:class:`TraceBuilder` runs ``malloc`` / ``free`` / ``empty_cache`` through
:class:`memfit.allocator.model.AllocatorModel` and records what PyTorch's
``_record_memory_history`` would: ``alloc``, ``free_requested`` / ``free_completed``,
``segment_alloc`` / ``segment_free`` and ``oom`` events, and at the end the segments with their
blocks; :meth:`TraceBuilder.snapshot` returns it as ``torch.cuda.memory._snapshot()``'s data,
which :mod:`memfit.allocator.snapshot` reads. memfit uses it for snapshots with known answers
(tests, ``bench/explain_speed.py``) and for the OOM dump of ``memfit.simulate_gpu``, which has no
CUDA allocator to ask.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memfit.allocator.model import AllocatorModel
from memfit.errors import OutOfMemory

__all__ = ["TraceBuilder"]

#: Where the builder's first segment starts (a plausible device address; any would do).
BASE_ADDRESS = 0x7F0000000000

FrameList = Sequence[tuple[str, int, str]]


def _frames(frames: FrameList | None) -> list[dict[str, Any]]:
    return [{"filename": f, "line": n, "name": name} for f, n, name in frames or ()]


class TraceBuilder:
    """Record an allocator trace while replaying requests through the model.

    Args:
        limit_bytes: The most the allocator may reserve (the device's memory for the
            process), or ``None``.
        max_split_size: ``max_split_size_mb`` in bytes, or ``None``.
        device: The device index written into the snapshot.

    >>> b = TraceBuilder()
    >>> h = b.malloc(3 << 20); b.free(h)
    >>> [e["action"] for e in b.events]
    ['segment_alloc', 'alloc', 'free_requested', 'free_completed']
    """

    def __init__(
        self,
        *,
        limit_bytes: int | None = None,
        max_split_size: int | None = None,
        device: int = 0,
    ) -> None:
        self.model = AllocatorModel(max_split_size=max_split_size, limit_bytes=limit_bytes)
        self.model._next_address = BASE_ADDRESS
        self.model.on_segment = self._segment
        self.device = device
        self.events: list[dict[str, Any]] = []
        self.limit_bytes = limit_bytes
        self.max_split_size = max_split_size
        self._requests: dict[int, tuple[int, int, list[dict[str, Any]]]] = {}

    def _segment(self, action: str, address: int, size: int, stream: int) -> None:
        self.events.append({"action": action, "addr": address, "size": size, "stream": stream})

    def malloc(self, nbytes: int, stream: int = 0, *, frames: FrameList | None = None) -> int:
        """Allocate; on a failure record an ``oom`` event (``device_free`` is the limit
        less what is reserved) and raise :class:`~memfit.errors.OutOfMemory`."""
        stack = _frames(frames)
        try:
            handle = self.model.malloc(nbytes, stream)
        except OutOfMemory:
            free = (
                None
                if self.limit_bytes is None
                else max(0, self.limit_bytes - self.model.reserved_bytes)
            )
            event: dict[str, Any] = {"action": "oom", "addr": 0, "size": nbytes, "stream": stream}
            if free is not None:
                event["device_free"] = free
            if stack:
                event["frames"] = stack
            self.events.append(event)
            raise
        address = self.model.address_of(handle)
        if address is not None:
            event = {"action": "alloc", "addr": address, "size": nbytes, "stream": stream}
            if stack:
                event["frames"] = stack
            self.events.append(event)
            self._requests[handle] = (nbytes, stream, stack)
        return handle

    def free(self, handle: int, *, frames: FrameList | None = None) -> None:
        """Free (``free_requested`` then ``free_completed``, as on one stream)."""
        address = self.model.address_of(handle)
        self.model.free(handle)
        got = self._requests.pop(handle, None)
        if address is None or got is None:
            return
        nbytes, stream, _ = got
        stack = _frames(frames)
        for action in ("free_requested", "free_completed"):
            event: dict[str, Any] = {
                "action": action,
                "addr": address,
                "size": nbytes,
                "stream": stream,
            }
            if stack:
                event["frames"] = stack
            self.events.append(event)

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache()``: free segments are given back (recorded)."""
        self.model.empty_cache()

    def snapshot(self) -> dict[str, Any]:
        """The snapshot as ``torch.cuda.memory._snapshot()`` returns it (plain data)."""
        by_address = {
            self.model.address_of(h): (n, s) for h, (n, _stream, s) in self._requests.items()
        }
        segments = []
        for address, size, stream, small, blocks in self.model.segments():
            out_blocks: list[dict[str, Any]] = []
            for block_address, block_size, allocated in blocks:
                requested, stack = by_address.get(block_address, (0, []))
                out_blocks.append(
                    {
                        "address": block_address,
                        "size": block_size,
                        "requested_size": requested if allocated else 0,
                        "state": "active_allocated" if allocated else "inactive",
                        "frames": stack if allocated else [],
                    }
                )
            segments.append(
                {
                    "device": self.device,
                    "address": address,
                    "total_size": size,
                    "allocated_size": sum(
                        int(b["size"]) for b in out_blocks if b["state"] != "inactive"
                    ),
                    "stream": stream,
                    "segment_type": "small" if small else "large",
                    "is_expandable": False,
                    "frames": [],
                    "blocks": out_blocks,
                }
            )
        traces: list[list[dict[str, Any]]] = [[] for _ in range(self.device)]
        traces.append(list(self.events))
        return {
            "segments": segments,
            "device_traces": traces,
            "allocator_settings": {
                "expandable_segments": False,
                "max_split_size": -1 if self.max_split_size is None else self.max_split_size,
                "garbage_collection_threshold": 0.0,
            },
        }
