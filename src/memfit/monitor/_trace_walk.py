"""A recorded trace walked event by event: the live blocks at any point, and where each came
from (the user's own frame, the ``forward`` it was allocated in, its size class)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from memfit.allocator.model import K_SMALL_SIZE, round_size
from memfit.allocator.replay import (
    StartState,
)
from memfit.allocator.snapshot import (
    Frame,
    SnapshotDevice,
)
from memfit.units import MiB

_STDLIB = re.compile(r"(^|[/\\])(lib[/\\]python3[.\d]*|Lib)[/\\](?!site-packages|dist-packages)")


#: Library frames: torch's (and what runs it), and memfit's own package, but not a checkout
#: of memfit whose tests, examples or benchmarks are the user's code here.
_LIBRARY = re.compile(
    r"(^|[/\\])(torch|triton|_pytest|pluggy)[/\\]"
    r"|(^|[/\\])memfit[/\\](?!tests[/\\]|examples[/\\]|bench[/\\])"
)


def user_frame(frames: Sequence[Frame]) -> Frame | None:
    """The innermost Python frame outside torch, memfit and the standard library."""
    for frame in frames:
        name = frame.filename
        if not name.endswith(".py") or name.startswith("<"):
            continue
        if _LIBRARY.search(name) or _STDLIB.search(name):
            continue
        return frame
    return None


def _module_frame(frames: Sequence[Frame]) -> Frame | None:
    """The innermost ``forward`` (an ``nn.Module``'s) outside torch."""
    for frame in frames:
        name = frame.filename
        if frame.name == "forward" and name.endswith(".py") and not _LIBRARY.search(name):
            return frame
    return None


def frame_text(frame: Frame) -> str:
    short = frame.filename.replace("\\", "/").rsplit("/", 2)
    return f"{'/'.join(short[-2:])}:{frame.line} ({frame.name})"


def size_class(nbytes: int) -> str:
    if nbytes <= K_SMALL_SIZE:
        return "<= 1 MiB (small pool)"
    for limit, text in (
        (10 * MiB, "1-10 MiB"),
        (100 * MiB, "10-100 MiB"),
        (1024 * MiB, "100 MiB-1 GiB"),
    ):
        if nbytes <= limit:
            return text
    return "> 1 GiB"


@dataclass
class LiveBlock:
    size: int
    stream: int
    stack: int


class TraceWalk:
    """Live blocks event by event (sizes rounded to 512 B, as the allocator's blocks)."""

    def __init__(self, dev: SnapshotDevice, start: StartState) -> None:
        self.dev = dev
        allocated_in_trace = {e.addr for e in dev.trace if e.action == "alloc"}
        end_stacks = {b.address: b.stack for s in dev.segments for b in s.blocks if b.live}
        self.live: dict[int, LiveBlock] = {}
        for address, size, stream in start.blocks:
            stack = end_stacks.get(address, -1) if address not in allocated_in_trace else -1
            self.live[address] = LiveBlock(size, stream, stack)
        self.allocated = sum(b.size for b in self.live.values())
        self.index = 0

    def advance(self, stop: int) -> None:
        trace = self.dev.trace
        while self.index < stop:
            event = trace[self.index]
            if event.action == "alloc" and event.size:
                size = round_size(event.size)
                self.live[event.addr] = LiveBlock(size, event.stream, event.stack)
                self.allocated += size
            elif event.action == "free_completed" and event.size:
                gone = self.live.pop(event.addr, None)
                if gone is not None:
                    self.allocated -= gone.size
            self.index += 1


def site_name(dev: SnapshotDevice, stack: int, cache: dict[int, str]) -> str:
    got = cache.get(stack)
    if got is None:
        if stack < 0:
            got = "(allocated before the recording started)"
        else:
            frame = user_frame(dev.stack_frames(stack))
            got = frame_text(frame) if frame is not None else "(inside torch: no user frame)"
        cache[stack] = got
    return got


def module_name(dev: SnapshotDevice, stack: int) -> str:
    if stack < 0:
        return "(unknown)"
    frame = _module_frame(dev.stack_frames(stack))
    return frame_text(frame) if frame is not None else "(outside any forward)"
