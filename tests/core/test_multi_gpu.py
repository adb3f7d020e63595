"""Several GPUs: the framework's terms, device 0, per-device plans."""

from __future__ import annotations

import pytest

from memfit.core.families.common import ddp_terms, fsdp_terms
from memfit.core.multi_gpu import (
    compose,
    default_topology,
    device_terms,
    form_factor,
    parse_gpu_count,
    stray_context,
)
from memfit.errors import ConfigError
from memfit.hardware.catalog import gpu
from memfit.hardware.runtime import parse_runtime

MiB = 2**20


def test_gpu_counts() -> None:
    assert parse_gpu_count("4xRTX 4090") == (4, "RTX 4090")
    assert parse_gpu_count(" 2 x A100 80GB") == (2, "A100 80GB")
    assert parse_gpu_count("H100") is None
    with pytest.raises(ConfigError, match="--gpu"):
        parse_gpu_count("0xH100")


@pytest.mark.parametrize(
    ("name", "count", "expected"),
    [
        ("H100", 8, "nvswitch"),
        ("H100", 2, "nvlink"),
        ("A100 80GB", 8, "nvswitch"),
        ("RTX 4090", 4, "pcie"),
        ("L40S", 4, "pcie"),
        # the catalog's form factor decides (issue 44): "V100" is the SXM2 module, whose
        # 8-GPU boards (DGX-1, HGX-1) are NVLink-linked without NVSwitch
        ("V100", 8, "nvlink"),
        ("V100 32GB", 2, "nvlink"),
        ("A100 PCIe 40GB", 8, "pcie"),
        ("A100 80GB PCIe", 4, "pcie"),
        ("H100 PCIe", 2, "pcie"),
        ("H200 NVL", 4, "pcie"),
        ("H200", 8, "nvswitch"),
        ("B200", 8, "nvswitch"),
        ("P100-PCIE-16GB", 2, "pcie"),
    ],
)
def test_default_topology(name: str, count: int, expected: str) -> None:
    assert default_topology(gpu(name), count) == expected


def test_form_factor_from_the_catalog() -> None:
    # the name decides before an alias: "v100-pcie-16gb" is an alias of the SXM2 entry
    assert form_factor(gpu("v100-pcie-16gb")) == "sxm"
    assert form_factor(gpu("H100")) == "sxm"  # by its alias "h100 sxm"
    assert form_factor(gpu("H100 NVL")) == "pcie"
    assert form_factor(gpu("RTX 4090")) is None


def test_ddp_buckets_and_views() -> None:
    assert [t.tensors for t in ddp_terms(4000, False)] == [(4000,)]
    assert ddp_terms(4000, True) == []


@pytest.mark.parametrize(
    ("sharding", "gathers"), [("full_shard", 2), ("hybrid_shard", 2), ("shard_grad_op", 1)]
)
def test_fsdp_gathered_buffers(sharding: str, gathers: int) -> None:
    terms = {t.name: t.tensors for t in fsdp_terms([100, 400, 50], 2, sharding)}
    assert terms["fsdp_all_gather"] == (800,) * gathers
    assert terms["fsdp_reduce_scatter"] == (800,)


def test_device0_terms() -> None:
    terms, est = device_terms(
        gpu("RTX 4090"),
        4,
        framework="torch",
        strategy="ddp",
        set_device=False,
        context_bytes=500,
    )
    stray = {t.name: t for t in terms}["stray_cuda_contexts"]
    assert stray.bytes == 3 * 500 and stray.device0_only
    assert est is not None and est.transport == "SHM"
    jax_terms, _ = device_terms(
        gpu("H100"), 8, framework="jax", strategy="pmap", device0_state_bytes=1000
    )
    assert {t.name for t in jax_terms if t.device0_only} == {"device0_unreplicated_state"}
    assert device_terms(gpu("H100"), 1, framework="jax", strategy="single") == ([], None)


def test_compose_keeps_device0_apart_only_when_it_differs() -> None:
    terms, _ = device_terms(gpu("L40S"), 4, framework="torch", strategy="ddp")
    plans = compose(4, {"parameters": 100}, 10**12, terms)
    assert [p.devices for p in plans] == [[0, 1, 2, 3]]
    assert plans[0].predicted_bytes == 100 + sum(t.bytes for t in terms)
    assert plans[0].basis["nccl_comm_base"] == "fitted"
    assert plans[0].basis["nccl_channel_buffers"] == "analytic"


def test_a_workload_may_say_gpus() -> None:
    from pathlib import Path

    from memfit.core.workload import parse_workload

    text = (
        Path(__file__).resolve().parents[2] / "src/memfit/workloads/dqn_fire_raster.yaml"
    ).read_text(encoding="utf-8")
    block = "family: offpolicy\ngpus: {count: 4, strategy: ddp, topology: nvlink}"
    wl = parse_workload(text.replace("family: offpolicy", block, 1))
    assert (wl.devices.count, wl.devices.topology) == (4, "nvlink")
    with pytest.raises(ConfigError, match=r"gpus\.count"):
        parse_workload(text.replace("family: offpolicy", "family: offpolicy\ngpus: {count: 0}", 1))


@pytest.mark.parametrize(
    ("jaxlib", "expected"),
    [
        # XLA kept a clique per stream (sync, async) until per-stream comms went off
        ("0.4.13", 2),
        ("0.4.29", 2),
        # from 0.4.30 one clique per device group; unknown: the current XLA's one
        ("0.4.30", 1),
        ("0.7.2", 1),
        (None, 1),
    ],
)
def test_jax_communicators_follow_the_jaxlib(jaxlib: str | None, expected: int) -> None:
    from memfit.core.multi_gpu import default_communicators

    assert default_communicators("jax", "pmap", jaxlib)[0] == expected
    assert default_communicators("torch", "fsdp", jaxlib)[0] == 1
    h100 = gpu("H100")
    jax_terms, est = device_terms(
        h100, 8, framework="jax", strategy="pmap", jaxlib=jaxlib, nccl="2.21.5"
    )
    torch_terms, _ = device_terms(h100, 8, framework="torch", strategy="ddp")
    assert est is not None and est.ranks == 8 and est.topology == "nvswitch"
    for j, t in zip(jax_terms, torch_terms, strict=True):
        assert j.name == t.name and j.bytes == expected * t.bytes
        if expected > 1:
            assert j.detail.startswith("2 communicators (XLA's per-stream cliques of jaxlib")
        else:
            assert j.detail.startswith("1 communicator (XLA's one clique per device group")
        assert not t.detail.startswith("1 communicator")
    given, _ = device_terms(h100, 8, framework="jax", strategy="pmap", communicators=3)
    assert given[0].bytes == 3 * torch_terms[0].bytes
    assert "devices.communicators (given)" in given[0].detail
    with pytest.raises(ConfigError, match="jaxlib"):
        default_communicators("jax", "pmap", "zero.four")


def test_the_workload_may_give_the_communicators() -> None:
    from memfit.core.workload import DeviceSpec

    assert DeviceSpec(count=8, strategy="pmap", communicators=4).communicators == 4
    with pytest.raises(ValueError, match="communicators"):
        DeviceSpec(count=8, strategy="pmap", communicators=0)


@pytest.mark.parametrize(
    ("runtime", "init", "mib"),
    [
        # torch 2.0 (a CUDA 11.7 wheel): NCCL starts CUDA before torch sets LAZY -> eager;
        # lazily, a V100 context once started: 5 MiB + 80 SMs x 2,048 threads x 2 KiB
        ("torch=2.0.0", "nccl", 900),
        ("torch=2.0.0", "unknown", 900),  # unknown: the larger
        ("torch=2.0.0", "torch", 325),  # torch's own lazy init first
        ("torch=2.0.0,module_loading=lazy", "nccl", 325),  # the variable set beforehand
        ("torch=2.0.0,cuda=12.2", "nccl", 325),  # CUDA 12.2's default is lazy
        ("torch=2.6.0", "nccl", 325),  # its default wheel is CUDA 12.4
        ("torch=1.7.1", "torch", 880),  # before 1.13 every context is eager
    ],
)
def test_stray_context_follows_what_started_cuda(runtime: str, init: str, mib: int) -> None:
    size, why = stray_context(gpu("V100"), parse_runtime(runtime), init)
    assert size == mib * MiB
    assert ("larger" in why) == (init == "unknown" and mib == 900)


def test_stray_context_refuses_an_unknown_cause() -> None:
    with pytest.raises(ConfigError) as info:
        stray_context(gpu("V100"), None, "barrier")
    assert info.value.key_path == "devices.stray_init"


def test_stray_tensors_are_per_other_process_in_segments() -> None:
    terms, _ = device_terms(
        gpu("V100"),
        4,
        framework="torch",
        strategy="ddp",
        set_device=False,
        context_bytes=300 * MiB,
        context_detail="lazy",
        stray_bytes=3 * MiB + 1,
    )
    by = {t.name: t for t in terms}
    assert by["stray_tensors"].bytes == 3 * 4 * MiB and by["stray_tensors"].device0_only
    assert by["stray_cuda_contexts"].detail.endswith(": lazy")
    none, _ = device_terms(gpu("V100"), 4, framework="torch", strategy="ddp", set_device=False)
    assert "stray_tensors" not in {t.name for t in none}


def test_send_recv_peers_reach_nccl_through_the_devices_keys() -> None:
    # a pipeline stage on 8 x H100 connects its 2 neighbours, not the 7 others of an all-to-all
    _, stage = device_terms(
        gpu("H100"), 8, framework="torch", strategy="ddp", all_to_all=True, p2p_peers=2
    )
    _, a2a = device_terms(gpu("H100"), 8, framework="torch", strategy="ddp", all_to_all=True)
    assert stage is not None and a2a is not None
    p2p = {t.name: t.bytes for t in stage.terms}["nccl_p2p_buffers"]
    assert p2p == 2 * 32 * 12 * MiB
    assert {t.name: t.bytes for t in a2a.terms}["nccl_p2p_buffers"] == 7 * 32 * 12 * MiB
    # 2 GPUs have one peer whatever the workload says
    _, pair = device_terms(
        gpu("H100"), 2, framework="torch", strategy="ddp", all_to_all=True, p2p_peers=2
    )
    assert {t.name: t.bytes for t in pair.terms}["nccl_p2p_buffers"] == 32 * 12 * MiB  # type: ignore[union-attr]
