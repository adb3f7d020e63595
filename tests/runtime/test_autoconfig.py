"""``memfit.autoconfig``: read the device now, plan the rest (simulated devices, no GPU)."""

from __future__ import annotations

import os

import pytest

import memfit
from memfit.backends.simulated import SimulatedDevice
from memfit.core.plan import plan_for_gpu
from memfit.core.workload import load_workload
from memfit.errors import BackendUnavailable, InfeasiblePlan
from memfit.hardware.catalog import gpu
from memfit.hardware.runtime import LAZY_KERNEL_IMAGES_BYTES
from memfit.runtime.autoconfig import autoconfig, read_device
from memfit.units import GiB


def test_reads_a_probe_and_plans_what_is_left() -> None:
    # an 8 GB card on which Isaac Sim (in this process) already holds 4 GiB
    device = SimulatedDevice("8GiB", name="NVIDIA GeForce RTX 3070", used_by_others=4 * GiB)
    cfg = memfit.autoconfig("act_dual_camera", probe=device, overrides={"num_envs": 2})
    assert cfg.reading.free_bytes == 4 * GiB and cfg.reading.source == "probe"
    # the simulator's terms are in the used memory now, not in the plan
    assert "simulator_base" not in cfg.plan.breakdown
    assert "renderer_cameras" not in cfg.plan.breakdown
    # the context is in the used memory; the kernel images its first step loads are not yet
    assert cfg.plan.breakdown["cuda_context"] == LAZY_KERNEL_IMAGES_BYTES
    assert any("kernel images its first step loads" in n for n in cfg.notes)
    assert cfg.knobs == {"num_envs": 2} and cfg.plan.fits
    assert cfg.plan.budget_bytes == 8 * GiB - 4 * GiB - int(8 * GiB * 0.05)
    assert any("simulator and its renderer are running" in n for n in cfg.notes)
    data = cfg.to_dict()
    assert data["reading"]["free_bytes"] == 4 * GiB and data["knobs"] == {"num_envs": 2}


def test_more_free_memory_plans_more() -> None:
    small = autoconfig(
        "act_dual_camera@no_sim", probe=SimulatedDevice("8GiB", used_by_others="6GiB")
    )
    large = autoconfig(
        "act_dual_camera@no_sim", probe=SimulatedDevice("8GiB", used_by_others="1GiB")
    )
    assert int(small.knobs["num_envs"]) < int(large.knobs["num_envs"])
    # the same as a plan made with the other processes taken off and the context counted
    # but for the kernel images the first step loads
    expected = plan_for_gpu(
        load_workload("act_dual_camera@no_sim"),
        gpu(8 * GiB),
        other_processes_bytes=GiB,
        context_bytes=LAZY_KERNEL_IMAGES_BYTES,
    )
    assert large.knobs == expected.knobs


def test_the_seed_dqn_user_auto_detects_and_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        monkeypatch.setenv(name, "")
    monkeypatch.setattr("memfit.runtime.allocator_env.torch_cuda_initialized", lambda: False)
    with memfit.simulate_gpu("3.68GiB"):
        cfg = autoconfig("dqn_fire_raster@device_replay", apply=True)
    assert cfg.reading.source == "simulated" and cfg.reading.total_bytes == round(3.68 * GiB)
    assert 50_000 <= int(cfg.knobs["buffer_size"]) <= 110_000
    assert cfg.applied["PYTORCH_ALLOC_CONF"] == "expandable_segments:True"
    assert os.environ["PYTORCH_ALLOC_CONF"] == "expandable_segments:True"


def test_settings_are_not_applied_after_torch_started(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("memfit.runtime.allocator_env.torch_cuda_initialized", lambda: True)
    cfg = autoconfig("dqn_fire_raster@device_replay", probe=SimulatedDevice("4GiB"), apply=True)
    assert cfg.applied == {}
    assert any("not applied" in n for n in cfg.notes)


def test_nothing_left_is_infeasible() -> None:
    with pytest.raises(InfeasiblePlan):
        autoconfig("act_dual_camera@no_sim",
                   probe=SimulatedDevice("8GiB", used_by_others="7.9GiB"))  # fmt: skip


def test_no_device_says_how_to_rehearse(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("memfit.backends.local_probe", lambda **_: (None, ["no NVIDIA driver"]))
    with pytest.raises(BackendUnavailable, match="no device to read") as info:
        read_device()
    assert info.value.hint is not None and "SimulatedDevice" in info.value.hint
    # a script that lets the error propagate shows str(exc) alone: the way out is there too
    assert "probe=memfit.backends.SimulatedDevice('8GiB')" in str(info.value)


def test_the_reading_holds_the_one_record_of_memory_now() -> None:
    from types import SimpleNamespace

    from memfit.backends.live import Reading
    from memfit.runtime.autoconfig import _rank_readings

    device = SimulatedDevice("8GiB", name="NVIDIA GeForce RTX 3070", used_by_others=3 * GiB)
    reading = read_device(probe=device)
    assert isinstance(reading.now, Reading) and reading.now.device == reading.name
    assert reading.now.free_bytes == reading.free_bytes == 5 * GiB
    assert reading.now.device_used_bytes == 3 * GiB and reading.total_bytes == 8 * GiB
    with memfit.simulate_gpu("2GiB"):
        sim = read_device()
    assert sim.source == "simulated" and sim.now.budget_bytes == sim.total_bytes == 2 * GiB
    # another rank's JAX pool comes back as a budget, the plan's total all the same
    dist = SimpleNamespace(gather_ints=lambda own: [own, [6 * GiB, GiB, 1, 1]])
    mine, pool = _rank_readings(reading, dist)
    assert (mine.name, mine.total_bytes, mine.free_bytes, mine.pool) == (
        "rank 0",
        8 * GiB,
        5 * GiB,
        False,
    )
    assert pool.now.budget_bytes == pool.total_bytes == 6 * GiB and pool.now.total_bytes is None
    assert pool.pool and pool.context_counted and pool.source == "rank"
