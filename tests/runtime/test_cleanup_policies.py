"""memfit.cleanup: policies count their calls, cleanups and the seconds they cost."""

from __future__ import annotations

import gc

import pytest
import torch

import memfit
from memfit.backends.live import Reading
from memfit.errors import ConfigError
from memfit.runtime import cleanup
from memfit.runtime.cleanup import PressureReading
from memfit.runtime.events import MemoryEvent
from memfit.runtime.simulate import simulate_gpu


def test_every_cleans_on_the_nth_call_and_times_it() -> None:
    events: list[MemoryEvent] = []
    policy = memfit.cleanup.every(10, gc_collect=True, on_event=events.append)
    cleaned = [policy(step=100 + i) for i in range(35)]
    assert [i + 1 for i, c in enumerate(cleaned) if c] == [10, 20, 30]
    assert policy.stats.calls == 35 and policy.stats.cleanups == 3
    assert policy.stats.seconds > 0
    # stamped with the training step it was given, the call count kept apart
    assert [e.step for e in events] == [109, 119, 129]
    assert [e.data["call"] for e in events] == [10, 20, 30]
    assert all(e.kind == "cleanup" and e.source == "cleanup.every" for e in events)
    assert events[0].data["gc_collect"] is True and events[0].data["seconds"] >= 0


def test_cleanup_events_never_pass_a_call_count_off_as_a_step() -> None:
    every = memfit.cleanup.every(2)
    pressure = memfit.cleanup.on_pressure(read=lambda: PressureReading(100, 1, 1, 1))
    for _ in range(4):
        every()
        pressure()
    assert [e.step for e in every.events] == [None, None]
    assert [e.data["call"] for e in every.events] == [2, 4]
    assert [e.step for e in pressure.events] == [None] * 4
    pressure(step=7)
    assert pressure.events[-1].step == 7 and pressure.events[-1].data["call"] == 5
    with pytest.raises(ConfigError, match="training step"):
        every(step=1.5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="training step"):
        every(step=True)


def test_after_call_stamps_the_step_its_function_reads() -> None:
    step = 0

    @cleanup.after_call(step=lambda: step)
    def save() -> None:
        return None

    for step in range(0, 200, 50):  # noqa: B007 - read by the lambda
        save()
    assert [e.step for e in save.cleanup.events] == [0, 50, 100, 150]
    assert [e.data["call"] for e in save.cleanup.events] == [1, 2, 3, 4]
    with pytest.raises(ConfigError, match="function returning the training step"):
        cleanup.after_call(step=5)  # type: ignore[arg-type]


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


def test_on_pressure_weighs_the_one_reading_of_memory_now() -> None:
    """The policy reads :class:`memfit.backends.live.Reading`: on a device the driver's free
    memory (the allocator's cache counts as used), under a budget what the budget leaves."""
    device = Reading(
        "torch.cuda",
        allocated_bytes=30,
        reserved_bytes=40,
        device_used_bytes=95,
        total_bytes=100,
        free_bytes=15,  # the process could still get 5 free + 10 cached
    )
    assert cleanup.pressure_figures(device) == {
        "free_bytes": 5,
        "total_bytes": 100,
        "reserved_bytes": 40,
        "allocated_bytes": 30,
    }
    budget = Reading(
        "simulated", allocated_bytes=60, total_bytes=1000, budget_bytes=100, free_bytes=40
    )
    figures = cleanup.pressure_figures(budget)
    assert figures["total_bytes"] == 100 and figures["free_bytes"] == 40
    assert figures["reserved_bytes"] == 60  # no allocator read: what is held
    policy = cleanup.on_pressure(0.1, 0.3, read=lambda: device)
    assert policy() is True  # 5% free
    data = policy.events[0].data
    assert {k: data[k] for k in cleanup.pressure_figures(device)} == cleanup.pressure_figures(
        device
    )
    assert PressureReading(100, 5, 90, 88) == Reading(
        "given", total_bytes=100, free_bytes=5, reserved_bytes=90, allocated_bytes=88
    )


def test_a_reading_that_is_not_one_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="free_bytes must be an integer"):
        PressureReading(100, "5", 90, 88)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"reading must be a memfit\.backends"):
        cleanup.pressure_figures({"free_bytes": 5})  # type: ignore[arg-type]
    policy = cleanup.on_pressure(read=lambda: 0.05)  # type: ignore[arg-type,return-value]
    with pytest.raises(ConfigError, match=r"read\(\) must be a memfit\.backends"):
        policy()


def test_on_pressure_reads_the_simulated_gpu() -> None:
    policy = cleanup.on_pressure(min_free=0.5)
    with simulate_gpu("64KiB"):
        assert policy() is False
        big = torch.zeros(12000)  # 48000 bytes: free drops under half
        assert policy() is True
        del big
    assert cleanup.read_pressure() == Reading("none")
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
    seconds = memfit.cleanup.full_reset(step=12, on_event=events.append)
    assert seconds >= 0 and cleanup.full_reset.stats.cleanups == before + 1
    assert events and events[0].source == "cleanup.full_reset" and events[0].step == 12
