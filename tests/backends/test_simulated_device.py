"""The simulated device: a real DeviceProbe and a byte counter with a budget."""

from __future__ import annotations

import threading

import pytest

from memfit import ConfigError, OutOfMemory
from memfit.backends import DeviceProbe, SimulatedDevice

GiB = 2**30
MiB = 2**20


def test_is_a_device_probe() -> None:
    assert isinstance(SimulatedDevice("8GiB"), DeviceProbe)


def test_allocate_release_peak_and_free() -> None:
    dev = SimulatedDevice("8GiB", used_by_others="512MiB")
    assert dev.total_bytes == 8 * GiB
    assert dev.free_bytes == 8 * GiB - 512 * MiB
    dev.allocate(3 * GiB)
    dev.allocate(GiB)
    dev.release(2 * GiB)
    assert dev.allocated_bytes == 2 * GiB
    assert dev.peak_allocated_bytes == 4 * GiB
    assert dev.free_bytes == 8 * GiB - 512 * MiB - 2 * GiB
    dev.reset_peak()
    assert dev.peak_allocated_bytes == 2 * GiB


def test_out_of_memory_takes_nothing_and_says_why() -> None:
    dev = SimulatedDevice(GiB, name="tiny", used_by_others=100 * MiB)
    dev.allocate(800 * MiB)
    with pytest.raises(OutOfMemory) as info:
        dev.allocate(200 * MiB)
    err = info.value
    assert err.device == "tiny"
    assert err.requested_bytes == 200 * MiB
    assert err.free_bytes == 124 * MiB
    assert err.budget_bytes == GiB - 100 * MiB
    assert dev.allocated_bytes == 800 * MiB
    dev.allocate(124 * MiB)  # exactly the rest fits
    assert dev.free_bytes == 0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"total_bytes": 0}, "positive"),
        ({"total_bytes": "8GiB", "used_by_others": "9GiB"}, "more than the device"),
        ({"total_bytes": "eight"}, "not a size"),
    ],
)
def test_invalid_construction(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        SimulatedDevice(**kwargs)  # type: ignore[arg-type]


def test_invalid_allocate_release() -> None:
    dev = SimulatedDevice("1GiB")
    with pytest.raises(ConfigError):
        dev.allocate(-1)
    with pytest.raises(ConfigError):
        dev.release(-1)
    dev.allocate(10)
    with pytest.raises(ConfigError, match="only"):
        dev.release(11)
    assert dev.allocated_bytes == 10


def test_snapshot_reports_the_counter() -> None:
    dev = SimulatedDevice("4GiB", name="what-if", used_by_others="300MiB", index=2)
    dev.allocate(GiB)
    snap = dev.snapshot()
    assert snap.source == "simulated"
    (d,) = snap.devices
    assert d.index == 2 and d.name == "what-if" and d.backend == "simulated"
    assert d.total_bytes == 4 * GiB
    assert d.device_used_bytes == GiB + 300 * MiB
    assert d.free_bytes == 3 * GiB - 300 * MiB
    assert d.allocated_bytes == GiB and d.peak_allocated_bytes == GiB
    (other,) = d.processes
    assert other.pid is None and other.used_bytes == 300 * MiB


def test_snapshot_without_others_has_no_process() -> None:
    assert SimulatedDevice("1GiB").snapshot().devices[0].processes == ()


def test_from_gpu_uses_the_catalog() -> None:
    dev = SimulatedDevice.from_gpu("T4", used_by_others="1GiB")
    assert dev.name == "Tesla T4"
    assert dev.total_bytes == 15360 * MiB
    assert dev.used_by_others == GiB
    assert SimulatedDevice.from_gpu("12GiB").total_bytes == 12 * GiB


def test_thread_safe_counting() -> None:
    dev = SimulatedDevice("1GiB")

    def work() -> None:
        for _ in range(1000):
            dev.allocate(512)
            dev.release(512)
        dev.allocate(1024)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert dev.allocated_bytes == 8 * 1024
    assert dev.peak_allocated_bytes >= 8 * 1024


def test_repr_names_the_figures() -> None:
    assert "allocated_bytes=0" in repr(SimulatedDevice("1GiB"))
