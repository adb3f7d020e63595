"""The NVML gate against a fake ``pynvml`` raising each NVML error kind."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from memfit import BackendUnavailable
from memfit.backends import nvml as nvml_mod
from memfit.backends import probe_all
from memfit.backends.nvml import FATAL_KINDS, NvmlGate, NvmlProbe, error_kind, translate_error

MiB = 2**20

CODES = {
    "uninitialized": 1,
    "invalid_argument": 2,
    "not_supported": 3,
    "no_permission": 4,
    "not_found": 6,
    "insufficient_size": 7,
    "driver_not_loaded": 9,
    "timeout": 10,
    "library_not_found": 12,
    "function_not_found": 13,
    "gpu_is_lost": 15,
    "reset_required": 16,
    "operating_system": 17,
    "driver_library_mismatch": 18,
    "version_mismatch": 25,
    "deprecated": 26,
    "unknown": 999,
}


class FakeNVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return f"fake NVML error {self.value}"


class FakeNvml:
    """A stand-in for the pynvml module: one H100, configurable failures."""

    NVMLError = FakeNVMLError
    NVML_ERROR_UNINITIALIZED = 1
    NVML_ERROR_INVALID_ARGUMENT = 2
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_NO_PERMISSION = 4
    NVML_ERROR_NOT_FOUND = 6
    NVML_ERROR_INSUFFICIENT_SIZE = 7
    NVML_ERROR_DRIVER_NOT_LOADED = 9
    NVML_ERROR_TIMEOUT = 10
    NVML_ERROR_LIBRARY_NOT_FOUND = 12
    NVML_ERROR_FUNCTION_NOT_FOUND = 13
    NVML_ERROR_GPU_IS_LOST = 15
    NVML_ERROR_RESET_REQUIRED = 16
    NVML_ERROR_OPERATING_SYSTEM = 17
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
    NVML_ERROR_DEPRECATED = 26
    NVML_ERROR_UNKNOWN = 999
    nvmlMemory_v2 = 0x02000028

    def __init__(
        self,
        *,
        errors: dict[str, int] | None = None,
        compute: list[tuple[int, int | None]] | None = None,
        graphics: list[tuple[int, int | None]] | None = None,
        mig: bool = False,
        count: int = 1,
    ) -> None:
        self.errors = errors or {}
        self.compute = compute if compute is not None else [(os.getpid(), 1024 * MiB)]
        self.graphics = graphics or []
        self.mig = mig
        self.count = count
        self.calls: list[str] = []

    def _call(self, name: str) -> None:
        self.calls.append(name)
        code = self.errors.get(name)
        if code is not None:
            raise FakeNVMLError(code)

    def nvmlInit(self) -> None:
        self._call("nvmlInit")

    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown")

    def nvmlSystemGetDriverVersion(self) -> str:
        self._call("nvmlSystemGetDriverVersion")
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        self._call("nvmlSystemGetCudaDriverVersion_v2")
        return 12040

    def nvmlDeviceGetCount(self) -> int:
        self._call("nvmlDeviceGetCount")
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> tuple[str, int]:
        self._call("nvmlDeviceGetHandleByIndex")
        return ("handle", index)

    def nvmlDeviceGetName(self, handle: Any) -> bytes:
        self._call("nvmlDeviceGetName")
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        self._call("nvmlDeviceGetUUID")
        return "GPU-1234"

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        if version is not None:
            self._call("memory_v2")
            return SimpleNamespace(
                total=81559 * MiB, reserved=527 * MiB, free=80000 * MiB, used=1032 * MiB
            )
        self._call("memory_v1")
        return SimpleNamespace(total=81559 * MiB, free=80000 * MiB, used=1559 * MiB)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        self._call("nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=37, memory=12)

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        self._call("nvmlDeviceGetCudaComputeCapability")
        return (9, 0)

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        self._call("nvmlDeviceGetMigMode")
        return [1 if self.mig else 0, 0]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        self._call("compute")
        return [SimpleNamespace(pid=p, usedGpuMemory=u) for p, u in self.compute]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> list[Any]:
        self._call("graphics")
        return [SimpleNamespace(pid=p, usedGpuMemory=u) for p, u in self.graphics]


def _probe(fake: FakeNvml, proc_root: Path | str = "/proc") -> NvmlProbe:
    return NvmlProbe(NvmlGate(module=fake), proc_root=proc_root)


@pytest.mark.parametrize(("kind", "code"), sorted(CODES.items()))
def test_error_kind_maps_every_code(kind: str, code: int) -> None:
    assert error_kind(FakeNVMLError(code), FakeNvml) == kind


@pytest.mark.parametrize(("kind", "code"), sorted(CODES.items()))
def test_translate_error_raises_only_for_fatal_kinds(kind: str, code: int) -> None:
    exc = FakeNVMLError(code)
    if kind in FATAL_KINDS:
        with pytest.raises(BackendUnavailable) as info:
            translate_error(exc, FakeNvml, "memory")
        assert info.value.__cause__ is exc
        assert info.value.hint
    else:
        reason = translate_error(exc, FakeNvml, "memory")
        assert reason.startswith("memory: ")
        assert "fake NVML error" in reason


def test_error_without_value_is_unknown() -> None:
    assert error_kind(RuntimeError("x"), FakeNvml) == "unknown"


@pytest.mark.parametrize(
    "kind", ["driver_not_loaded", "library_not_found", "no_permission", "unknown"]
)
def test_init_failure_is_backend_unavailable(kind: str) -> None:
    gate = NvmlGate(module=FakeNvml(errors={"nvmlInit": CODES[kind]}))
    with pytest.raises(BackendUnavailable, match="NVML unavailable"):
        gate.init()
    assert not gate.initialized


def test_missing_package_is_backend_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(BackendUnavailable, match="nvidia-ml-py"):
        NvmlGate().init()


def test_full_snapshot_v2(tmp_path: Path) -> None:
    fake = FakeNvml(compute=[(4242, 900 * MiB)], graphics=[(4242, 900 * MiB), (77, 64 * MiB)])
    proc = tmp_path / "4242"
    proc.mkdir()
    (proc / "comm").write_text("python\n")
    (proc / "cmdline").write_text("python\0train.py\0--lr\0" + "3e-4\0")
    snap = _probe(fake, tmp_path).snapshot()
    assert snap.source == "nvml"
    assert snap.driver_version == "550.54.15"
    assert snap.cuda_version == "12.4"
    (dev,) = snap.devices
    assert dev.name == "NVIDIA H100 80GB HBM3"
    assert dev.uuid == "GPU-1234"
    assert dev.total_bytes == 81559 * MiB
    assert dev.driver_reserved_bytes == 527 * MiB
    assert dev.device_used_bytes == 1032 * MiB
    assert dev.free_bytes == 80000 * MiB
    assert dev.utilization_percent == 37
    assert dev.compute_capability == (9, 0)
    by_pid = {p.pid: p for p in dev.processes}
    assert by_pid[4242].name == "python"
    assert by_pid[4242].command == "python train.py --lr 3e-4"
    assert by_pid[4242].kind == "compute+graphics"
    assert by_pid[4242].used_bytes == 900 * MiB
    assert by_pid[77].name is None
    assert "namespace" in (by_pid[77].note or "")
    assert any("PID namespace" in n for n in dev.notes)


@pytest.mark.parametrize("kind", ["function_not_found", "version_mismatch", "not_supported"])
def test_memory_v2_failure_falls_back_to_v1(kind: str) -> None:
    fake = FakeNvml(errors={"memory_v2": CODES[kind]})
    (dev,) = _probe(fake).snapshot().devices
    assert "memory_v1" in fake.calls
    assert dev.driver_reserved_bytes is None
    assert dev.device_used_bytes == 1559 * MiB
    assert any("fell back to the v1 call" in n for n in dev.notes)


def test_memory_both_calls_fail_leaves_none_with_reason() -> None:
    fake = FakeNvml(errors={"memory_v2": CODES["not_supported"], "memory_v1": 3})
    (dev,) = _probe(fake).snapshot().devices
    assert dev.total_bytes is None and dev.free_bytes is None and dev.device_used_bytes is None
    assert any(n.startswith("memory: not supported") for n in dev.notes)


def test_wddm_per_process_memory_is_none_with_reason() -> None:
    fake = FakeNvml(compute=[(os.getpid(), None)])
    (dev,) = _probe(fake).snapshot().devices
    (proc,) = dev.processes
    assert proc.used_bytes is None
    assert "WDDM" in (proc.note or "")
    assert "this process" in (proc.note or "")


def test_process_list_not_supported_is_a_note() -> None:
    fake = FakeNvml(errors={"compute": CODES["not_supported"], "graphics": 3})
    (dev,) = _probe(fake).snapshot().devices
    assert dev.processes == ()
    assert any(n.startswith("compute processes: not supported") for n in dev.notes)
    assert dev.total_bytes == 81559 * MiB


def test_mig_parent_no_permission() -> None:
    fake = FakeNvml(mig=True, errors={"compute": CODES["no_permission"]})
    (dev,) = _probe(fake).snapshot().devices
    assert any("MIG is enabled" in n for n in dev.notes)
    assert any("permission denied" in n and "MIG" in n for n in dev.notes)


@pytest.mark.parametrize(
    "kind", [k for k in CODES if k not in FATAL_KINDS and k != "insufficient_size"]
)
def test_utilization_error_of_each_kind_is_none(kind: str) -> None:
    fake = FakeNvml(errors={"nvmlDeviceGetUtilizationRates": CODES[kind]})
    (dev,) = _probe(fake).snapshot().devices
    assert dev.utilization_percent is None
    assert any(n.startswith("utilization: ") for n in dev.notes)


@pytest.mark.parametrize("kind", sorted(FATAL_KINDS))
def test_fatal_error_mid_snapshot_raises(kind: str) -> None:
    fake = FakeNvml(errors={"nvmlDeviceGetName": CODES[kind]})
    with pytest.raises(BackendUnavailable):
        _probe(fake).snapshot()


def test_handle_failure_gives_placeholder_device() -> None:
    fake = FakeNvml(errors={"nvmlDeviceGetHandleByIndex": CODES["gpu_is_lost"]}, count=2)
    snap = _probe(fake).snapshot()
    assert [d.name for d in snap.devices] == ["unknown", "unknown"]
    assert all(d.total_bytes is None for d in snap.devices)
    assert "fallen off the bus" in snap.devices[0].notes[0]


def test_zero_devices_note() -> None:
    snap = _probe(FakeNvml(count=0)).snapshot()
    assert snap.devices == ()
    assert "NVML found no GPU" in snap.notes


def test_lazy_init_once_under_threads_and_shutdown(monkeypatch: pytest.MonkeyPatch) -> None:
    registered: list[Any] = []
    monkeypatch.setattr(nvml_mod.atexit, "register", registered.append)
    fake = FakeNvml()
    gate = NvmlGate(module=fake)
    assert fake.calls == []
    threads = [threading.Thread(target=gate.init) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert fake.calls.count("nvmlInit") == 1
    assert registered == [gate.shutdown]
    gate.get("name", "nvmlDeviceGetName", ("handle", 0))
    assert fake.calls.count("nvmlInit") == 1
    gate.shutdown()
    gate.shutdown()
    assert fake.calls.count("nvmlShutdown") == 1
    assert not gate.initialized
    gate.init()
    assert fake.calls.count("nvmlInit") == 2
    assert len(registered) == 1


def test_missing_function_in_module_is_a_reason() -> None:
    gate = NvmlGate(module=FakeNvml())
    result = gate.get("fan", "nvmlDeviceGetFanSpeed", ("handle", 0))
    assert result.value is None
    assert result.kind == "function_not_found"


def test_probe_all_uses_nvml_when_it_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml_mod, "_DEFAULT", [NvmlGate(module=FakeNvml())])
    snap = probe_all()
    assert snap.source == "nvml"
    assert snap.devices[0].total_bytes == 81559 * MiB


def test_probe_all_without_nvml_or_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(errors={"nvmlInit": CODES["driver_not_loaded"]})
    monkeypatch.setattr(nvml_mod, "_DEFAULT", [NvmlGate(module=fake)])
    snap = probe_all(try_torch=False)
    assert snap.source == "none"
    assert snap.devices == ()
    assert snap.notes[0] == "no NVIDIA GPU or driver found"
    assert any("driver is not loaded" in n for n in snap.notes)


def test_no_proc_filesystem_note(tmp_path: Path) -> None:
    fake = FakeNvml(compute=[(4242, 10 * MiB)])
    (dev,) = _probe(fake, tmp_path / "absent").snapshot().devices
    (proc,) = dev.processes
    assert proc.name is None
    assert "process details unavailable" in (proc.note or "")
    assert not any("PID namespace" in n for n in dev.notes)


def test_static_facts_are_read_once_and_again_after_a_restart() -> None:
    fake = FakeNvml()
    calls: list[str] = []
    for name in ("nvmlDeviceGetName", "nvmlDeviceGetMigMode", "nvmlDeviceGetMemoryInfo"):
        original = getattr(fake, name)

        def counted(*args: Any, _name: str = name, _fn: Any = original, **kwargs: Any) -> Any:
            calls.append(_name)
            return _fn(*args, **kwargs)

        setattr(fake, name, counted)
    probe = _probe(fake)
    first = probe.snapshot()
    second = probe.snapshot()
    assert first == second
    assert calls.count("nvmlDeviceGetName") == 1
    assert calls.count("nvmlDeviceGetMigMode") == 1
    assert calls.count("nvmlDeviceGetMemoryInfo") >= 2  # memory is read every time
    probe.gate.shutdown()
    probe.snapshot()
    assert calls.count("nvmlDeviceGetName") == 2
