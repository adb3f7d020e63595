"""NCCL's device memory per rank: each term, each topology, the variables that change it."""

from __future__ import annotations

import pytest

from memfit.errors import ConfigError
from memfit.hardware.nccl import (
    COMM_BASE_BYTES,
    ENV_EFFECTS,
    LL128_BYTES,
    LL_BYTES,
    NcclSettings,
    channels_set_up,
    nccl_memory,
    p2p_channels_per_peer,
    parse_nccl_version,
    recommend_tight,
)
from memfit.units import MiB


def _terms(est: object) -> dict[str, int]:
    return {t.name: t.bytes for t in est.terms}  # type: ignore[attr-defined]


def test_default_protocol_buffers_are_nccls() -> None:
    assert LL_BYTES == 512 * 1024
    assert LL128_BYTES == 4_915_200


def test_one_rank_holds_nothing() -> None:
    assert nccl_memory(1, "pcie").terms == ()


@pytest.mark.parametrize(
    ("ranks", "topology", "capability", "nccl", "expected_mib"),
    [
        # PCIe: 2 channels; 4 ranks: ring + tree (2 connections), 10 MiB + 2 MiB (cuMem)
        (4, "pcie", (8, 9), "2.21", 2 * 2 * 12),
        # 2 ranks: the tree shares the ring's connection
        (2, "pcie", (8, 9), "2.21", 2 * 1 * 12),
        # NVLink without a switch: 12 channels; before 2.19 cudaMalloc'd, each side still
        # rounded up to CUDA_IPC_MIN (2 MiB): 6 + 6 MiB with P2P read (8.0 over NVLink)
        (2, "nvlink", (8, 0), "2.18", 12 * 12),
        (4, "nvlink", (8, 0), "2.18", 12 * 2 * 12),
        # Hopper over NVLink bridges: 24 channels (nccl#1161's log), no P2P read: 10 + 2 MiB
        (2, "nvlink", (9, 0), "2.18", 24 * 12),
        # A100 on an NVSwitch board: 24 channels (nccl-tests#100's log); before Ampere 16
        (8, "nvswitch", (8, 0), "2.18", 24 * 2 * 12),
        (8, "nvswitch", (7, 0), "2.18", 16 * 2 * 12),
        # NVSwitch, Hopper: 24 channels
        (8, "nvswitch", (9, 0), "2.21", 24 * 2 * 12),
    ],
)
def test_channel_buffers_by_topology(
    ranks: int, topology: str, capability: tuple[int, int], nccl: str, expected_mib: float
) -> None:
    est = nccl_memory(ranks, topology, capability=capability, nccl=nccl)
    assert _terms(est)["nccl_channel_buffers"] == expected_mib * MiB
    assert _terms(est)["nccl_comm_base"] == COMM_BASE_BYTES


@pytest.mark.parametrize(
    ("nccl", "ranks", "capability", "expected_mib"),
    [
        # 2.17-2.19: NVLS channels (16) x 2 x (NCCL_BUFFSIZE + 2 MiB) x ranks, in 512 MiB:
        # the 1073741824-byte bind of NVIDIA/nccl-tests#216 (2.19.3, 4 ranks)
        ("2.19.3", 4, (9, 0), 1024),
        # 2.20: the collective channels (24) size them: vllm#9699's 2415919104 B, rounded up
        ("2.20.5", 8, (9, 0), 2560),
        # 2.21: 128 KiB chunk x 8 steps + 2 MiB, still the collective channels
        ("2.21.5", 8, (9, 0), 1536),
        # 2.22-2.25: 16 x 2 x 1 MiB x 8 = 256 MiB in 512 MiB granules, + a 2 MiB credit granule
        ("2.23", 8, (9, 0), 512 + 2),
        # 2.26 on: 2 MiB granules (the 268435456-byte bind of the later 8 x H100 log)
        ("2.26", 8, (9, 0), 256 + 2),
        # Blackwell from 2.26: 32 NVLS channels
        ("2.26", 8, (10, 0), 512 + 2),
    ],
)
def test_nvls_follows_the_version(
    nccl: str, ranks: int, capability: tuple[int, int], expected_mib: int
) -> None:
    est = nccl_memory(ranks, "nvswitch", capability=capability, nccl=nccl)
    assert _terms(est)["nccl_nvls"] == expected_mib * MiB


@pytest.mark.parametrize(
    ("capability", "nccl", "topology", "ranks"),
    [
        ((8, 0), "2.21", "nvswitch", 8),
        ((9, 0), "2.16", "nvswitch", 8),
        ((9, 0), "2.21", "nvlink", 8),
        ((9, 0), "2.21", "nvswitch", 2),
    ],
)
def test_no_nvls_without_hopper_a_switch_new_nccl_and_three_ranks(
    capability: tuple[int, int], nccl: str, topology: str, ranks: int
) -> None:
    assert "nccl_nvls" not in _terms(nccl_memory(ranks, topology, capability=capability, nccl=nccl))


def test_variables_change_the_figures() -> None:
    base = nccl_memory(8, "nvswitch", capability=(9, 0), nccl="2.21")
    off = nccl_memory(8, "nvswitch", capability=(9, 0), nccl="2.21", env={"NCCL_NVLS_ENABLE": "0"})
    assert "nccl_nvls" not in _terms(off)
    assert any("NCCL_NVLS_ENABLE=0" in n for n in off.notes)
    capped = nccl_memory(
        8, "nvswitch", capability=(9, 0), nccl="2.21", env={"NCCL_MAX_NCHANNELS": "4"}
    )
    assert capped.channels == 4
    assert _terms(capped)["nccl_channel_buffers"] == 4 * 2 * 12 * MiB
    raised = nccl_memory(4, "pcie", env={"NCCL_MIN_NCHANNELS": "8"})
    assert raised.channels == 8
    small = nccl_memory(
        8, "nvswitch", capability=(9, 0), nccl="2.20", env={"NCCL_BUFFSIZE": str(1 * MiB)}
    )
    # 512 KiB + 4,915,200 B + 1 MiB in 2 MiB granules = 8 MiB; NVLS (2.20) 24 x 2 x 3 MiB x 8
    assert _terms(small)["nccl_channel_buffers"] == 24 * 2 * (8 + 2) * MiB
    assert _terms(small)["nccl_nvls"] == 1536 * MiB
    assert (
        _terms(small)["nccl_nvls"]
        < _terms(nccl_memory(8, "nvswitch", capability=(9, 0), nccl="2.20"))["nccl_nvls"]
    )
    # from 2.21 NCCL_BUFFSIZE no longer sizes NVLS
    later = nccl_memory(
        8, "nvswitch", capability=(9, 0), nccl="2.21", env={"NCCL_BUFFSIZE": str(1 * MiB)}
    )
    assert _terms(later)["nccl_nvls"] == _terms(base)["nccl_nvls"]
    nocumem = nccl_memory(4, "pcie", nccl="2.21", env={"NCCL_CUMEM_ENABLE": "0"})
    # cudaMalloc: p2p.cc still rounds each side up to CUDA_IPC_MIN; only the structures go
    assert _terms(nocumem)["nccl_channel_buffers"] == 2 * 2 * 12 * MiB
    assert "nccl_dev_structs" not in _terms(nocumem)
    chunk = nccl_memory(
        8, "nvswitch", capability=(9, 0), nccl="2.26", env={"NCCL_NVLS_CHUNKSIZE": "262144"}
    )
    assert _terms(chunk)["nccl_nvls"] == (16 * 2 * 2 * 8 + 2) * MiB
    nch = nccl_memory(
        8, "nvswitch", capability=(9, 0), nccl="2.26", env={"NCCL_NVLS_NCHANNELS": "8"}
    )
    assert _terms(nch)["nccl_nvls"] == (8 * 2 * 1 * 8 + 2) * MiB
    # 2.21 sizes NVLS by the collective channels, raised to at least NCCL_NVLS_NCHANNELS
    more = nccl_memory(
        8, "nvswitch", capability=(9, 0), nccl="2.21", env={"NCCL_NVLS_NCHANNELS": "32"}
    )
    assert _terms(more)["nccl_nvls"] == 1536 * MiB  # 32 x 2 x 3 MiB x 8 = 1536 MiB


def test_shm_and_net_keep_the_buffers_off_the_gpu() -> None:
    shm = nccl_memory(4, "pcie", p2p=False)
    assert shm.transport == "SHM" and _terms(shm)["nccl_channel_buffers"] == 0
    disabled = nccl_memory(4, "nvlink", env={"NCCL_P2P_DISABLE": "1"})
    assert disabled.transport == "SHM" and _terms(disabled)["nccl_channel_buffers"] == 0
    net = nccl_memory(4, "pcie", env={"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"})
    assert net.transport == "NET"


def test_p2p_level_below_the_path_moves_the_buffers_to_host_memory() -> None:
    # NVL allows P2P over NVLink only: PCIe cards go through SHM, NVLink ones keep P2P
    pcie = nccl_memory(4, "pcie", env={"NCCL_P2P_LEVEL": "NVL"})
    assert pcie.transport == "SHM" and _terms(pcie)["nccl_channel_buffers"] == 0
    nvl = nccl_memory(4, "nvlink", env={"NCCL_P2P_LEVEL": "nvl"})
    assert nvl.transport == "P2P" and _terms(nvl)["nccl_channel_buffers"] > 0
    assert nccl_memory(4, "nvlink", env={"NCCL_P2P_LEVEL": "0"}).transport == "SHM"
    # a level as far as the CPU keeps P2P (memfit's upper bound on PCIe, which it notes)
    assert nccl_memory(4, "pcie", env={"NCCL_P2P_LEVEL": "SYS"}).transport == "P2P"
    assert any("upper bound" in n for n in nccl_memory(4, "pcie").notes)
    assert not any("upper bound" in n for n in pcie.notes)
    with pytest.raises(ConfigError, match="NCCL_P2P_LEVEL"):
        nccl_memory(4, "pcie", env={"NCCL_P2P_LEVEL": "FAR"})


# a setup in which each variable changes the device memory, and the value that does
_CHANGES = {
    "NCCL_BUFFSIZE": ((8, "nvswitch", "2.20"), str(1 * MiB)),
    "NCCL_LL_BUFFSIZE": ((4, "pcie", "2.21"), str(64 * MiB)),
    "NCCL_LL128_BUFFSIZE": ((4, "pcie", "2.21"), str(120 * 2**16)),
    "NCCL_MAX_NCHANNELS": ((8, "nvswitch", "2.21"), "4"),
    "NCCL_MIN_NCHANNELS": ((4, "pcie", "2.21"), "8"),
    "NCCL_NVLS_ENABLE": ((8, "nvswitch", "2.21"), "0"),
    "NCCL_NVLS_NCHANNELS": ((8, "nvswitch", "2.26"), "8"),
    "NCCL_NVLS_CHUNKSIZE": ((8, "nvswitch", "2.26"), str(256 * 1024)),
    "NCCL_P2P_DISABLE": ((4, "nvlink", "2.21"), "1"),
    "NCCL_P2P_LEVEL": ((4, "pcie", "2.21"), "NVL"),
    "NCCL_SHM_DISABLE": ((4, "pcie", "2.21"), "1"),
    "NCCL_CUMEM_ENABLE": ((4, "pcie", "2.21"), "0"),
    "NCCL_P2P_READ_ENABLE": ((4, "pcie", "2.21"), "1"),
    "NCCL_MAX_P2P_NCHANNELS": ((8, "nvswitch", "2.21"), "16"),
    "NCCL_MIN_P2P_NCHANNELS": ((4, "pcie", "2.21"), "8"),
    # the FIFO is host memory unless GDRCopy's FIFO puts it on the device
    "NCCL_GDRCOPY_ENABLE": ((4, "pcie", "2.21"), "1"),
    "NCCL_GDRCOPY_FIFO_ENABLE": ((4, "pcie", "2.21"), "0"),
    "NCCL_WORK_FIFO_DEPTH": ((4, "pcie", "2.21"), str(1024)),
    "NCCL_WORK_FIFO_BYTES": ((4, "pcie", "2.26"), str(64 * MiB)),
}
# the variables that matter only with another one set, and that one (with its value)
_WITH = {
    # with the default sizes a P2P connection is 12 MiB either way (6 + 6 or 10 + 2)
    "NCCL_P2P_READ_ENABLE": {"NCCL_BUFFSIZE": str(1 * MiB)},
    "NCCL_GDRCOPY_FIFO_ENABLE": {"NCCL_GDRCOPY_ENABLE": "1"},
    "NCCL_WORK_FIFO_DEPTH": {"NCCL_GDRCOPY_ENABLE": "1"},
    "NCCL_WORK_FIFO_BYTES": {"NCCL_GDRCOPY_ENABLE": "1"},
}


@pytest.mark.parametrize("name", sorted(ENV_EFFECTS))
def test_every_explained_variable_is_honoured(name: str) -> None:
    (ranks, topology, version), value = _CHANGES[name]
    env = {name: value}
    if name == "NCCL_SHM_DISABLE":  # it matters only where P2P is off
        env["NCCL_P2P_DISABLE"] = "1"
        base = nccl_memory(ranks, topology, nccl=version, env={"NCCL_P2P_DISABLE": "1"})
        assert nccl_memory(ranks, topology, nccl=version, env=env).transport != base.transport
        return
    with_ = _WITH.get(name, {})
    base = nccl_memory(ranks, topology, capability=(9, 0), nccl=version, env=with_)
    changed = nccl_memory(ranks, topology, capability=(9, 0), nccl=version, env={**with_, **env})
    assert changed.total_bytes != base.total_bytes


def test_point_to_point_connects_every_peer() -> None:
    est = nccl_memory(8, "nvswitch", capability=(9, 0), nccl="2.21", all_to_all=True)
    assert _terms(est)["nccl_p2p_buffers"] == 7 * 32 * 12 * MiB
    pcie = nccl_memory(4, "pcie", all_to_all=True)
    assert _terms(pcie)["nccl_p2p_buffers"] == 3 * 2 * 12 * MiB


@pytest.mark.parametrize(
    ("channels", "topology", "capability", "env", "expected"),
    [
        # 8 x H100: 24 collective channels, 36 a pair over 18 NVLinks: pow2Up(24) (nccl#1685)
        (24, "nvswitch", (9, 0), {}, 32),
        # 8 x A100: 24 collective channels, 24 a pair over 12 NVLinks: 32 (was 16, assumed)
        (24, "nvswitch", (8, 0), {}, 32),
        # DGX-2 (V100): 16 collective channels, 12 a pair over 6 NVLinks: pow2Up(12) = 16
        (16, "nvswitch", (7, 0), {}, 16),
        (2, "pcie", None, {}, 2),  # 2 channels a pair over PCIe
        (12, "nvlink", (8, 0), {}, 16),  # the pair's links unknown: pow2Up(collective)
        (24, "nvswitch", (9, 0), {"NCCL_MAX_P2P_NCHANNELS": "8"}, 8),
        (24, "nvswitch", (9, 0), {"NCCL_MAX_P2P_NCHANNELS": "6"}, 8),  # pow2Up(6)
        (4, "nvswitch", (9, 0), {}, 4),  # NCCL_MAX_NCHANNELS=4 caps the channels first
    ],
)
def test_p2p_channels_per_peer_follow_nccls_formula(
    channels: int,
    topology: str,
    capability: tuple[int, int] | None,
    env: dict[str, str],
    expected: int,
) -> None:
    settings = NcclSettings.from_env(env)
    assert p2p_channels_per_peer(channels, topology, capability, settings) == expected


def test_p2p_buffers_follow_the_channels_per_peer_as_a_class() -> None:
    # A100 NVSwitch: 32 a peer, 12 MiB a connection pair with P2P read (6 + 6)
    a100 = nccl_memory(8, "nvswitch", capability=(8, 0), nccl="2.21", all_to_all=True)
    assert _terms(a100)["nccl_p2p_buffers"] == 7 * 32 * 12 * MiB
    capped = nccl_memory(
        8, "nvswitch", capability=(9, 0), all_to_all=True, env={"NCCL_MAX_NCHANNELS": "4"}
    )
    assert _terms(capped)["nccl_p2p_buffers"] == 7 * 4 * 12 * MiB
    # NCCL_BUFFSIZE moves the receiving side: 4 KiB + 512 KiB + 4,915,200 B + 1 MiB -> 8 MiB
    small = nccl_memory(
        8, "nvswitch", capability=(9, 0), all_to_all=True, env={"NCCL_BUFFSIZE": str(MiB)}
    )
    assert _terms(small)["nccl_p2p_buffers"] == 7 * 32 * (8 + 2) * MiB


@pytest.mark.parametrize(("peers", "pattern"), [(1, "ring shift"), (2, "pipeline stage")])
def test_send_recv_patterns_connect_only_their_peers(peers: int, pattern: str) -> None:
    est = nccl_memory(8, "nvswitch", capability=(9, 0), all_to_all=True, p2p_peers=peers)
    assert _terms(est)["nccl_p2p_buffers"] == peers * 32 * 12 * MiB, pattern
    full = nccl_memory(8, "nvswitch", capability=(9, 0), all_to_all=True)
    assert _terms(full)["nccl_p2p_buffers"] == 7 * 32 * 12 * MiB
    with pytest.raises(ConfigError, match="p2p_peers"):
        nccl_memory(8, "nvswitch", all_to_all=True, p2p_peers=8)


def test_every_variable_is_explained_and_bad_values_are_refused() -> None:
    assert all(text for text in ENV_EFFECTS.values())
    with pytest.raises(ConfigError, match="NCCL_BUFFSIZE"):
        NcclSettings.from_env({"NCCL_BUFFSIZE": "4M"})
    with pytest.raises(ConfigError, match="topology"):
        nccl_memory(4, "infiniband")
    with pytest.raises(ConfigError, match="nccl"):
        parse_nccl_version("two")
    assert parse_nccl_version("2.21.5+cuda12.4") == (2, 21, 5)


def test_recommendations_for_a_tight_card() -> None:
    tight = recommend_tight(nccl_memory(8, "nvswitch", capability=(9, 0)))
    assert tight["NCCL_NVLS_ENABLE"] == "0"
    assert int(tight["NCCL_MAX_NCHANNELS"]) < 24
    applied = nccl_memory(8, "nvswitch", capability=(9, 0), env=tight)
    assert applied.total_bytes < nccl_memory(8, "nvswitch", capability=(9, 0)).total_bytes / 3


def test_an_unknown_nccl_takes_the_largest_release() -> None:
    from memfit.hardware.nccl import JAX_NCCL_RELEASES, largest_nccl_memory

    worst = largest_nccl_memory(8, "nvswitch", capability=(9, 0))
    each = [nccl_memory(8, "nvswitch", nccl=v, capability=(9, 0)) for v in JAX_NCCL_RELEASES]
    assert worst.total_bytes == max(e.total_bytes for e in each)
    assert worst.nccl == (2, 20, 5) and "2.20.5's" in worst.notes[-1]
    # on PCIe NVLS is absent: the largest is a release whose send connections take granules
    pcie = largest_nccl_memory(4, "pcie")
    assert pcie.total_bytes == max(
        nccl_memory(4, "pcie", nccl=v).total_bytes for v in JAX_NCCL_RELEASES
    )
    with pytest.raises(ConfigError, match="no NCCL version"):
        largest_nccl_memory(8, "nvswitch", nccl="2.21")


def test_device_structures_are_a_granule_each_under_cumem() -> None:
    # NCCL 2.21 on 8 x H100: devCommAndChans, 32 channels set up (24 collective, p2p up to
    # pow2Up(24)) x 3, 16 NVLS channels x 1: 113 cuMem allocations of 2 MiB
    est = nccl_memory(8, "nvswitch", capability=(9, 0), nccl="2.21")
    assert _terms(est)["nccl_dev_structs"] == (1 + 32 * 3 + 16) * 2 * MiB
    assert next(t for t in est.terms if t.name == "nccl_dev_structs").basis == "analytic"
    # 2.23 adds rankToLocalRank; NVLS off drops the nvlsDevPeers
    later = nccl_memory(8, "nvswitch", capability=(9, 0), nccl="2.23")
    assert _terms(later)["nccl_dev_structs"] == (2 + 32 * 3 + 16) * 2 * MiB
    off = nccl_memory(8, "nvswitch", capability=(9, 0), nccl="2.21", env={"NCCL_NVLS_ENABLE": "0"})
    assert _terms(off)["nccl_dev_structs"] == (1 + 32 * 3) * 2 * MiB
    # PCIe: 2 channels, 2 set up
    assert _terms(nccl_memory(4, "pcie", nccl="2.21"))["nccl_dev_structs"] == 7 * 2 * MiB
    # cudaMalloc (before 2.19, or NCCL_CUMEM_ENABLE=0): a few KiB, no term, said in a note
    for old in (
        nccl_memory(2, "nvlink", nccl="2.14"),
        nccl_memory(4, "pcie", env={"NCCL_CUMEM_ENABLE": "0"}),
    ):
        assert "nccl_dev_structs" not in _terms(old)
        assert any("cudaMalloc" in n for n in old.notes)


def test_channels_set_up_follow_the_p2p_channels() -> None:
    assert [channels_set_up(c) for c in (1, 2, 3, 12, 16, 24, 32)] == [1, 2, 4, 16, 16, 32, 32]
    capped = NcclSettings.from_env({"NCCL_MAX_P2P_NCHANNELS": "8"})
    assert channels_set_up(24, capped) == 24  # the collective channels are set up regardless
    raised = NcclSettings.from_env({"NCCL_MIN_P2P_NCHANNELS": "8"})
    assert channels_set_up(2, raised) == 8


def test_work_fifo_is_on_the_device_only_with_gdrcopy() -> None:
    assert "nccl_work_fifo" not in _terms(nccl_memory(4, "pcie", nccl="2.21"))
    gdr = {"NCCL_GDRCOPY_ENABLE": "1"}
    # before 2.22: 65536 entries x 512 B; from 2.22 NCCL_WORK_FIFO_BYTES, 1 MiB (a granule)
    assert _terms(nccl_memory(4, "pcie", nccl="2.21", env=gdr))["nccl_work_fifo"] == 32 * MiB
    assert _terms(nccl_memory(4, "pcie", nccl="2.22", env=gdr))["nccl_work_fifo"] == 2 * MiB
    fifo_off = {**gdr, "NCCL_GDRCOPY_FIFO_ENABLE": "0"}
    assert "nccl_work_fifo" not in _terms(nccl_memory(4, "pcie", nccl="2.21", env=fifo_off))


def test_the_fitted_base_is_unchanged_and_reproduces_its_calibration() -> None:
    # NVIDIA/nccl#964 (NCCL 2.14, cudaMalloc, 4 x A100 NVLink): 12 channels x 12 MiB (144 MiB)
    # + the fitted base (400 MiB) = 544 MiB; 3 and 4 ranks: 2 connections a channel, 688 MiB
    est = nccl_memory(2, "nvlink", nccl="2.14", capability=(8, 0))
    assert est.channels == 12
    assert _terms(est)["nccl_channel_buffers"] == 144 * MiB
    assert est.total_bytes == 544 * MiB
    assert _terms(est)["nccl_comm_base"] == COMM_BASE_BYTES == 400 * MiB
    assert nccl_memory(3, "nvlink", nccl="2.14", capability=(8, 0)).total_bytes == 688 * MiB
    assert nccl_memory(4, "nvlink", nccl="2.14", capability=(8, 0)).total_bytes == 688 * MiB


@pytest.mark.parametrize(
    ("env", "read", "recv_mib", "send_mib"),
    [
        # src/transport/p2p.cc: recvSize = 4 KiB header + LL + LL128 (+ Simple unless read),
        # sendSize = 4 KiB header (+ Simple if read), each ALIGN_SIZE'd to CUDA_IPC_MIN
        ({}, False, 10, 2),
        ({}, True, 6, 6),
        ({"NCCL_BUFFSIZE": str(1 * MiB)}, False, 8, 2),
        ({"NCCL_BUFFSIZE": str(1 * MiB)}, True, 6, 2),
        # a Simple buffer of exactly 2 MiB on the sender still needs the header: 4 MiB
        ({"NCCL_BUFFSIZE": str(2 * MiB)}, True, 6, 4),
    ],
)
def test_a_p2p_connection_rounds_each_side_to_cuda_ipc_min(
    env: dict[str, str], read: bool, recv_mib: int, send_mib: int
) -> None:
    settings = {**env, "NCCL_P2P_READ_ENABLE": "1" if read else "0"}
    for nccl in ("2.14", "2.18", "2.21"):  # cudaMalloc and cuMem alike
        est = nccl_memory(2, "pcie", nccl=nccl, env=settings)
        assert _terms(est)["nccl_channel_buffers"] == 2 * (recv_mib + send_mib) * MiB
        assert f"{recv_mib * 1024} KiB received" in est.terms[0].detail


def test_p2p_read_is_nccls_default_only_for_two_8_0_gpus_over_nvlink() -> None:
    def detail(capability: tuple[int, int], topology: str) -> str:
        return nccl_memory(2, topology, nccl="2.21", capability=capability).terms[0].detail

    assert "P2P read" in detail((8, 0), "nvlink")
    assert "P2P read" in detail((8, 0), "nvswitch")
    assert "P2P read" not in detail((8, 6), "nvlink")  # ncclTopoCheckP2p: cudaCompCap == 80
    assert "P2P read" not in detail((9, 0), "nvswitch")
    assert "P2P read" not in detail((8, 0), "pcie")


def test_the_shm_transport_keeps_the_buffers_off_the_device_but_not_the_base() -> None:
    # the base is not split by transport: nothing in NCCL's source ties it to P2P (see
    # docs/benchmarks.md, "Several GPUs"), so a communicator over SHM keeps it
    shm = nccl_memory(2, "pcie", nccl="2.18", env={"NCCL_P2P_LEVEL": "LOC"})
    assert shm.transport == "SHM"
    assert _terms(shm) == {"nccl_channel_buffers": 0, "nccl_comm_base": COMM_BASE_BYTES}


def test_tight_advice_names_cumem_only_where_its_granules_add_up() -> None:
    assert (
        recommend_tight(nccl_memory(8, "nvswitch", capability=(9, 0)))["NCCL_CUMEM_ENABLE"] == "0"
    )
    assert "NCCL_CUMEM_ENABLE" not in recommend_tight(nccl_memory(4, "pcie"))
