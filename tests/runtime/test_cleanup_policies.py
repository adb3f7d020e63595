"""memfit.cleanup: policies count their calls, cleanups and the seconds they cost."""

from __future__ import annotations

import doctest
import gc

import pytest
import torch

import memfit
from memfit.errors import ConfigError
from memfit.runtime import cleanup
from memfit.runtime.cleanup import PressureReading
from memfit.runtime.events import MemoryEvent
from memfit.runtime.simulate import simulate_gpu


def test_every_cleans_on_the_nth_call_and_times_it() -> None:
    events: list[MemoryEvent] = []
    policy = memfit.cleanup.every(10, gc_collect=True, on_event=events.append)
    cleaned = [policy() for _ in range(35)]
    assert [i + 1 for i, c in enumerate(cleaned) if c] == [10, 20, 30]
    assert policy.stats.calls == 35 and policy.stats.cleanups == 3
    assert policy.stats.seconds > 0
    assert [e.step for e in events] == [10, 20, 30]
    assert all(e.kind == "cleanup" and e.source == "cleanup.every" for e in events)
    assert events[0].data["gc_collect"] is True and events[0].data["seconds"] >= 0


def test_every_really_collects_garbage() -> None:
    class Node:
        def __init__(self) -> None:
            self.me = self

    gc.collect()
    gc.disable()
    try:
        for _ in range(100):
            Node()
        assert any(type(o) is Node for o in gc.get_objects())
        cleanup.every(1, gc_collect=True)()
        assert not any(type(o) is Node for o in gc.get_objects())
    finally:
        gc.enable()


def test_every_rejects_bad_n() -> None:
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ConfigError, match="positive whole number"):
            cleanup.every(bad)  # type: ignore[arg-type]


def test_on_pressure_cleans_only_past_a_threshold() -> None:
    readings = iter(
        [
            PressureReading(100, 50, 40, 38),  # fine
            PressureReading(100, 5, 90, 88),  # free 5% < 10%
            PressureReading(100, 50, 40, 20),  # fragmentation 50% > 30%
            PressureReading(None, None, None, None),  # unknown: never cleans
        ]
    )
    policy = memfit.cleanup.on_pressure("10%", 0.3, read=lambda: next(readings))
    assert [policy() for _ in range(4)] == [False, True, True, False]
    assert policy.stats.calls == 4 and policy.stats.cleanups == 2
    assert "free 5.0% < 10.0%" in policy.events[0].message
    assert "fragmentation 50.0% > 30.0%" in policy.events[1].message
    assert policy.events[0].data["free_bytes"] == 5


def test_on_pressure_reads_the_simulated_gpu() -> None:
    policy = cleanup.on_pressure(min_free=0.5)
    with simulate_gpu("64KiB"):
        assert policy() is False
        big = torch.zeros(12000)  # 48000 bytes: free drops under half
        assert policy() is True
        del big
    assert cleanup.read_pressure() == PressureReading(None, None, None, None)
    with pytest.raises(ConfigError, match="fraction"):
        cleanup.on_pressure(min_free=2.0)


def test_after_call_bare_and_with_options() -> None:
    @cleanup.after_call
    def fetch(i: int) -> int:
        return i + 1

    @cleanup.after_call(gc_collect=True)
    def fetch_image(i: int) -> int:
        if i < 0:
            raise ValueError("no camera")
        return i

    assert [fetch(i) for i in range(3)] == [1, 2, 3]
    assert fetch.cleanup.stats.calls == 3 and fetch.cleanup.stats.cleanups == 3
    assert fetch.__name__ == "fetch"
    with pytest.raises(ValueError, match="no camera"):
        fetch_image(-1)
    assert fetch_image.cleanup.stats.cleanups == 1  # cleaned even though it raised
    assert fetch_image.cleanup.gc_collect is True


def test_full_reset_counts_and_reports() -> None:
    before = cleanup.full_reset.stats.cleanups
    events: list[MemoryEvent] = []
    seconds = memfit.cleanup.full_reset(on_event=events.append)
    assert seconds >= 0 and cleanup.full_reset.stats.cleanups == before + 1
    assert events and events[0].source == "cleanup.full_reset"


def test_doctests() -> None:
    result = doctest.testmod(cleanup)
    assert result.attempted > 0 and result.failed == 0
