"""memfit plan for several GPUs: per-device plans, the collective terms with their basis."""

from __future__ import annotations

import json

import pytest

from memfit.cli.main import main
from memfit.core.workload import load_workload
from memfit.errors import ConfigError
from memfit.hardware.runtime import LAZY_KERNEL_IMAGES_BYTES
from memfit.planning import plan
from memfit.planning_devices import plan_devices


def test_ddp_on_four_geforce_cards() -> None:
    result = plan_devices("dqn_fire_raster@ddp", "4xRTX 4090")
    assert result.count == 4 and result.topology == "pcie" and result.strategy == "ddp"
    [group] = result.devices
    assert group.devices == [0, 1, 2, 3]
    assert group.basis == {
        "nccl_channel_buffers": "analytic",
        "nccl_dev_structs": "analytic",
        "nccl_comm_base": "fitted",
    }
    assert group.breakdown["ddp_gradient_buckets"] > 0
    assert group.predicted_bytes == sum(group.breakdown.values())
    assert result.nccl is not None and result.nccl.transport == "SHM"


def test_the_single_gpu_plan_is_unchanged_by_the_multi_gpu_path() -> None:
    one = plan("dqn_fire_raster", "RTX 4090")
    assert "nccl_comm_base" not in one.breakdown
    assert load_workload("dqn_fire_raster").devices.count == 1


def test_stray_contexts_land_on_device_0() -> None:
    wl = load_workload("dqn_fire_raster@ddp")
    wl = wl.model_copy(update={"devices": wl.devices.model_copy(update={"set_device": False})})
    result = plan_devices(wl, "RTX 4090")
    assert [d.devices for d in result.devices] == [[0], [1, 2, 3]]
    zero, rest = result.devices
    # a stray process runs no step on device 0: its context without the kernel images
    own = zero.breakdown["cuda_context"] - LAZY_KERNEL_IMAGES_BYTES
    assert zero.breakdown["stray_cuda_contexts"] == 3 * own
    assert "stray_cuda_contexts" not in rest.breakdown


def test_stray_cause_and_tensors_from_the_workload() -> None:
    wl = load_workload("dqn_fire_raster@ddp")
    update = {"set_device": False, "stray_init": "nccl", "stray_bytes": "1GiB"}
    devices = type(wl.devices).model_validate({**wl.devices.model_dump(), **update})
    wl = wl.model_copy(update={"devices": devices})
    zero = plan_devices(wl, "RTX 4090", runtime="torch=2.0.0").devices[0]
    # eager (NCCL started CUDA), a CUDA 11.7 build: 900 MiB
    assert zero.breakdown["stray_cuda_contexts"] == 3 * 900 * 2**20
    assert zero.breakdown["stray_tensors"] == 3 * 2**30


def test_bad_counts_are_refused() -> None:
    with pytest.raises(ConfigError, match="count"):
        plan_devices("dqn_fire_raster", "4xRTX 4090", count=2)
    with pytest.raises(ConfigError, match="gpu"):
        plan_devices("dqn_fire_raster", "local", count=2)


def test_cli_prints_per_device_plans(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "dqn_fire_raster@ddp", "--gpu", "4xRTX 4090"]) == 0
    out = capsys.readouterr().out
    assert "4 x NVIDIA GeForce RTX 4090" in out
    assert "nccl_comm_base" in out and "fitted" in out and "analytic" in out
    # every term by its own basis: the one-device plan's terms by theirs
    base = plan_devices(load_workload("dqn_fire_raster@ddp"), "4xRTX 4090").base
    for name in base.breakdown:
        row = next(line for line in out.splitlines() if line.startswith(f"│ {name} "))
        assert f"│ {base.sources[name]} " in row, row
    assert "per-device plan" not in out
    assert main(["plan", "dqn_fire_raster@ddp", "--gpu", "4xRTX 4090", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["count"] == 4 and data["devices"][0]["fits"] is True


def test_cli_refuses_write_for_several(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "dqn_fire_raster", "--gpu", "2xRTX 4090", "--write", "x.yaml"]) == 2
    assert "--write" in capsys.readouterr().err


def test_brax_on_eight_h100_keeps_nccl_outside_the_pool() -> None:
    result = plan_devices("brax_humanoid_ppo", "8xH100", measure="recorded")
    assert result.topology == "nvswitch" and result.strategy == "pmap"
    zero = result.devices[0]
    assert zero.devices == [0]
    assert zero.breakdown["nccl_nvls"] > 0
    assert zero.predicted_bytes <= zero.budget_bytes
    fraction = float(next(v for k, v in result.environment.items() if "MEM_FRACTION" in k))
    assert fraction < 0.9


def test_env_advises_nccl_settings_for_several_cards(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["env", "--gpu", "8xH100", "--json"]) in (0, 1)
    data = json.loads(capsys.readouterr().out)
    advice = {s["variable"]: s for s in data["nccl"]["settings"]}
    assert advice["NCCL_NVLS_ENABLE"]["value"] == "0"
    # NCCL 2.21 on 8 x H100: 24 x 2 x 3 MiB x 8 = 1,152 MiB in 512 MiB granules, and the
    # 16 NVLS channels' device structures (a 2 MiB cuMem granule each)
    assert advice["NCCL_NVLS_ENABLE"]["saves_bytes"] == (1536 + 16 * 2) * 2**20
    assert main(["env", "--gpu", "H100", "--json"]) in (0, 1)
    assert "nccl" not in json.loads(capsys.readouterr().out)


def test_env_advice_on_pcie_names_what_each_setting_saves(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from memfit.hardware.nccl import nccl_memory

    assert main(["env", "--gpu", "4xL40S", "--json"]) in (0, 1)
    data = json.loads(capsys.readouterr().out)["nccl"]
    assert data["estimate"]["topology"] == "pcie" and data["estimate"]["transport"] == "P2P"
    advice = {s["variable"]: s for s in data["settings"]}
    # PCIe: 2 channels x 2 connections x (10 MiB + 2 MiB) move to host memory over SHM
    assert advice["NCCL_P2P_DISABLE"]["saves_bytes"] == 48 * 2**20
    assert "NCCL_NVLS_ENABLE" not in advice and "NCCL_MAX_NCHANNELS" not in advice
    base = nccl_memory(4, "pcie", capability=(8, 9)).total_bytes
    for name, item in advice.items():
        after = nccl_memory(4, "pcie", capability=(8, 9), env={name: item["value"]})
        assert item["saves_bytes"] == base - after.total_bytes > 0
        assert item["why"]


def test_a_jax_plan_takes_xla_s_communicators_from_the_recorded_jaxlib(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import memfit.planning_devices as pd

    wl = load_workload("brax_humanoid_ppo")
    assert wl.measurements is not None
    assert pd.target_jaxlib(wl) == wl.measurements.provenance.versions["jaxlib"]  # recorded
    one = {t.name: t.bytes for t in plan_devices(wl, "8xH100").terms}
    old = wl.measurements.provenance.model_copy(
        update={"versions": {**wl.measurements.provenance.versions, "jaxlib": "0.4.25"}}
    )
    wl_old = wl.model_copy(
        update={"measurements": wl.measurements.model_copy(update={"provenance": old})}
    )
    two = {t.name: t.bytes for t in plan_devices(wl_old, "8xH100").terms}
    # XLA before jaxlib 0.4.30 kept a clique per stream: two communicators per device group
    assert two["nccl_comm_base"] == 2 * one["nccl_comm_base"]
    assert two["nccl_nvls"] == 2 * one["nccl_nvls"]
    # neither recorded nor installed: unknown, the current XLA's one (and the note says so)
    bare = wl.model_copy(update={"measurements": None})
    monkeypatch.setattr(pd, "installed_jaxlib", lambda: None)
    assert pd.target_jaxlib(bare) is None
    monkeypatch.setattr(pd, "installed_jaxlib", lambda: "0.4.26")
    assert pd.target_jaxlib(bare) == "0.4.26"
