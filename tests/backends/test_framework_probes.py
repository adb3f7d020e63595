"""The torch and JAX probes: on this CPU machine (no CUDA, no crash) and against fakes."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from _fake_torch_cuda import FakeTorchCuda

from memfit import BackendUnavailable
from memfit.backends import probe_all
from memfit.backends.jax_device import JaxProbe, device_from_stats
from memfit.backends.torch_cuda import TorchProbe, allocator_counts

MiB = 2**20


def test_torch_probe_on_cpu_reports_no_cuda() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    snap = TorchProbe().snapshot()
    assert snap.source == "torch"
    assert snap.devices == ()
    assert len(snap.notes) == 1
    assert "no CUDA device" in snap.notes[0]
    assert not torch.cuda.is_initialized()


def test_probe_all_tries_torch_and_reports_none_on_cpu() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    snap = probe_all(try_torch=True)
    if snap.source == "nvml":
        pytest.skip("NVML works here")
    assert snap.source == "none"
    assert any("no CUDA device" in n for n in snap.notes)


class _FakeCuda(FakeTorchCuda):
    def __init__(self, available: bool = True) -> None:
        super().__init__(
            free=20000 * MiB,
            total=24564 * MiB,
            allocated=3000 * MiB,
            reserved=4000 * MiB,
            peak_allocated=3500 * MiB,
            peak_reserved=4100 * MiB,
            available=available,
        )

    def device_count(self) -> int:
        return 1

    def get_device_properties(self, index: int) -> Any:
        return SimpleNamespace(major=8, minor=9, uuid="abcd-ef")

    def get_device_name(self, index: int) -> str:
        return "NVIDIA GeForce RTX 4090"


def _fake_torch(available: bool = True, cuda_version: str | None = "12.8") -> Any:
    return SimpleNamespace(
        __version__="2.13.0", version=SimpleNamespace(cuda=cuda_version), cuda=_FakeCuda(available)
    )


def test_torch_probe_reads_allocator_stats() -> None:
    snap = TorchProbe(module=_fake_torch()).snapshot()
    (dev,) = snap.devices
    assert snap.cuda_version == "12.8"
    assert dev.name == "NVIDIA GeForce RTX 4090"
    assert dev.uuid == "GPU-abcd-ef"
    assert dev.total_bytes == 24564 * MiB
    assert dev.free_bytes == 20000 * MiB
    assert dev.device_used_bytes == 4564 * MiB
    assert dev.allocated_bytes == 3000 * MiB
    assert dev.allocator_reserved_bytes == 4000 * MiB
    assert dev.peak_allocated_bytes == 3500 * MiB
    assert dev.peak_reserved_bytes == 4100 * MiB
    assert dev.compute_capability == (8, 9)
    assert dev.driver_reserved_bytes is None and dev.utilization_percent is None


def test_torch_probe_cuda_build_without_device() -> None:
    snap = TorchProbe(module=_fake_torch(available=False)).snapshot()
    assert snap.devices == ()
    assert "CUDA_VISIBLE_DEVICES" in snap.notes[0]


def test_torch_probe_unknown_index() -> None:
    with pytest.raises(BackendUnavailable, match="no device 3"):
        TorchProbe(devices=[3], module=_fake_torch()).snapshot()


def test_jax_probe_on_cpu() -> None:
    pytest.importorskip("jax")
    snap = JaxProbe().snapshot()
    if snap.devices:
        pytest.skip("JAX has a GPU here")
    assert any("no GPU device" in n for n in snap.notes)
    with_cpu = JaxProbe(include_cpu=True).snapshot()
    assert with_cpu.devices
    cpu = with_cpu.devices[0]
    assert cpu.allocated_bytes is None and cpu.total_bytes is None
    assert "memory_stats() is None" in cpu.notes[0]


def test_jax_probe_reads_memory_stats_of_gpu_devices() -> None:
    stats = {
        "bytes_in_use": 5 * MiB,
        "peak_bytes_in_use": 9 * MiB,
        "bytes_limit": 60000 * MiB,
        "bytes_reserved": 6 * MiB,
    }
    gpu_dev = SimpleNamespace(
        platform="gpu", id=0, device_kind="NVIDIA H100 80GB HBM3", memory_stats=lambda: stats
    )
    cpu_dev = SimpleNamespace(platform="cpu", id=0, device_kind="cpu", memory_stats=lambda: None)
    fake = SimpleNamespace(
        __version__="0.10.2", devices=lambda: [gpu_dev, cpu_dev], default_backend=lambda: "gpu"
    )
    snap = JaxProbe(module=fake).snapshot()
    (dev,) = snap.devices
    assert dev.name == "NVIDIA H100 80GB HBM3"
    assert dev.allocated_bytes == 5 * MiB
    assert dev.peak_allocated_bytes == 9 * MiB
    assert dev.limit_bytes == 60000 * MiB
    assert dev.allocator_reserved_bytes == 6 * MiB
    assert dev.total_bytes is None


def test_device_from_stats_ignores_non_integers() -> None:
    dev = device_from_stats(1, "x", {"bytes_in_use": "5", "bytes_limit": True}, platform="gpu")
    assert dev.allocated_bytes is None and dev.limit_bytes is None


def test_allocator_counts_read_the_nested_statistics_once() -> None:
    calls: list[int] = []

    def nested(index: int) -> dict[str, Any]:
        calls.append(index)
        return {
            "allocated_bytes": {"all": {"current": 1, "peak": 3}},
            "reserved_bytes": {"all": {"current": 2, "peak": 4}},
        }

    fake = SimpleNamespace(_C=SimpleNamespace(_cuda_memoryStats=nested), cuda=_FakeCuda())
    assert allocator_counts(fake, 0) == (1, 2, 3, 4)
    assert calls == [0]


def test_allocator_counts_fall_back_to_the_public_flat_statistics() -> None:
    def changed(index: int) -> dict[str, Any]:
        return {"allocated": 1}  # a future torch that renamed its keys

    fake = SimpleNamespace(_C=SimpleNamespace(_cuda_memoryStats=changed), cuda=_FakeCuda())
    counts = allocator_counts(fake, 0)
    assert counts.allocated == 3000 * MiB and counts.peak_reserved == 4100 * MiB
    assert allocator_counts(_fake_torch(), 0) == counts  # no private call at all


def test_probe_all_falls_back_to_jax_only_when_this_process_imported_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without NVML and torch, a process that already runs JAX on a GPU is read through JAX's
    allocator statistics; one that has not imported jax is never made to (it would
    preallocate the device)."""
    import sys

    if probe_all(try_torch=False).source == "nvml":
        pytest.skip("NVML works here")
    stats = {"bytes_in_use": 5 * MiB, "peak_bytes_in_use": 9 * MiB, "bytes_limit": 600 * MiB}
    gpu_dev = SimpleNamespace(
        platform="gpu", id=0, device_kind="NVIDIA H100 80GB HBM3", memory_stats=lambda: stats
    )
    fake = SimpleNamespace(__version__="0.10.2", devices=lambda: [gpu_dev])
    monkeypatch.setitem(sys.modules, "jax", fake)
    snap = probe_all(try_torch=False)
    assert snap.source == "jax"
    assert [d.name for d in snap.devices] == ["NVIDIA H100 80GB HBM3"]
    monkeypatch.delitem(sys.modules, "jax")
    assert probe_all(try_torch=False).source == "none"
    assert "jax" not in sys.modules
