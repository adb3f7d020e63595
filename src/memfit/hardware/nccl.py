"""NCCL's device memory per rank: channel buffers, NVLS, point-to-point, by topology and version.

A communicator holds, on every GPU it spans (NVIDIA/nccl ``src/init.cc``,
``src/transport/p2p.cc``, ``src/transport/nvls.cc``):

* **channel buffers** (``nccl_channel_buffers``): each collective channel connects a rank to
  its ring neighbours and, with more than two ranks, to both neighbours of its tree (a chain
  inside one node). Each receiving connection holds one buffer per protocol: LL
  (``NCCL_LL_BUFFSIZE``, default 8 lines x 512 threads x 8 steps x 16 B = 512 KiB), LL128
  (``NCCL_LL128_BUFFSIZE``, default 120 x 640 x 8 x 8 B = 4,915,200 B) and Simple
  (``NCCL_BUFFSIZE``, default 4 MiB). Over P2P each side is one allocation behind a 4 KiB
  header (``ncclSendMem``/``ncclRecvMem``), rounded up to ``CUDA_IPC_MIN`` (2 MiB) in every
  release (``src/transport/p2p.cc``: ``ALIGN_SIZE(sendSize, CUDA_IPC_MIN)``,
  ``ALIGN_SIZE(recvSize, CUDA_IPC_MIN)``), whether cudaMalloc'd (before 2.19) or a cuMem
  allocation (2.19 on, NVIDIA/nccl#1685's 10485760- and 2097152-byte allocations): 10 MiB
  received and 2 MiB sent, or with P2P read (two compute capability 8.0 GPUs over NVLink,
  ``ncclTopoCheckP2p``) the Simple buffer on the sender, 6 MiB each way; 12 MiB a connection
  either way with the default sizes. Over P2P (PCIe or NVLink) the buffers are in device
  memory; over SHM (``NCCL_P2P_DISABLE=1``, or GeForce cards, whose driver refuses peer
  access over PCIe) they are in host memory.
* **NVLS** (``nccl_nvls``): on NVSwitch systems of Hopper and newer, the multicast buffers of
  NVLink SHARP: ``channels x 2 x buffer x local ranks``, where buffer is ``NCCL_BUFFSIZE + 2
  MiB`` (2.17 to 2.20), ``NCCL_NVLS_CHUNKSIZE x 8 steps + 2 MiB`` (2.21) or ``NCCL_NVLS_CHUNKSIZE
  x 8 steps`` (2.22 on), and channels are the NVLS channels (16; 32 on Blackwell from 2.26)
  except in 2.20-2.21, which size them by the collective channels (24 on 8 x H100); rounded
  up to the multicast granularity (512 MiB on H100) before 2.26, to 2 MiB from 2.26.
* **point-to-point** (``nccl_p2p_buffers``): send/recv and all-to-all connect every peer over
  its own channels, lazily, at the first such call.
* **device structures** (``nccl_dev_structs``): the communicator's small device arrays, each
  its own ``ncclCudaCalloc``/``ncclCudaCallocAsync`` (``src/init.cc`` ``devCommSetup``:
  ``devCommAndChans``, and ``rankToLocalRank`` from 2.23; ``src/channel.cc`` ``initChannel``:
  ``sharedRes->devPeers[c]``, ``channel->devPeers`` and ``devRingUserRanks`` for every
  channel set up, the collective channels and the point-to-point channels
  ``ncclTopoComputeP2pChannels`` initialises up to ``pow2Up(channels)``; ``initNvlsChannel``:
  ``nvlsDevPeers`` per NVLS channel). With cuMem (``NCCL_CUMEM_ENABLE``, on from 2.19) each is
  a ``cuMemCreate`` rounded up to the 2 MiB granularity (``ncclCuMemAlloc``: ``ALIGN_SIZE(size,
  granularity)``), so 24 channels on 8 x H100 hold 226 MiB of structures of a few KiB each;
  with ``cudaMalloc`` they are a few KiB, counted as none.
* **the work FIFO** (``nccl_work_fifo``): in pinned host memory unless GDRCopy is on
  (``NCCL_GDRCOPY_ENABLE=1`` with ``NCCL_GDRCOPY_FIFO_ENABLE``'s default 1), then in device
  memory: ``NCCL_WORK_FIFO_DEPTH`` x 512 B (64 Ki entries, 32 MiB) before 2.22,
  ``NCCL_WORK_FIFO_BYTES`` (1 MiB) from 2.22.
* **the communicator's base** (``nccl_comm_base``): the rest, which NCCL's source does not
  itemise as device allocations. Its figure is fitted on the calibration part of
  ``tests/data/published_truth/multi_gpu/readings.yaml`` (NVIDIA/nccl#964, NCCL 2.14, whose
  cudaMalloc'd structures are counted as none), not derived, and it is not split by transport,
  card or release: what was checked and ruled out (the driver's local memory for NCCL's
  kernels, which is reserved once per context, not per communicator, as NCCL never sets
  ``cudaLimitStackSize`` by default, ``NCCL_SET_STACK_SIZE=0`` in every tag; P2P allocations
  beyond the buffers; a peer's IPC mapping; torch's streams and events) is in
  docs/benchmarks.md, "Several GPUs". NCCL's kernel images are not
  split out of it: every communicator's init touches every NCCL kernel
  (``ncclInitKernelsForDevice``: ``cudaFuncGetAttributes`` and ``cudaFuncSetAttribute`` on each
  kernel of ``ncclDevKernelList``, 2.18 on; ``ncclKernMaxLocalSize`` in ``ncclInit``, 2.14),
  which loads them under lazy loading as well, and they are registered with NCCL's own static
  CUDA runtime (``CUDARTLIB ?= cudart_static``), so a framework's eager context measured
  without NCCL does not hold them either: they are in a process once per device whatever the
  loading mode, and their size (a property of the binary) is not in the source.

Every figure that depends on a version is a row of ``rules_nccl.json`` with its source.

>>> est = nccl_memory(8, "nvswitch", capability=(9, 0), nccl=(2, 21))
>>> [t.name for t in est.terms]
['nccl_channel_buffers', 'nccl_nvls', 'nccl_dev_structs', 'nccl_comm_base']
>>> nccl_memory(4, "pcie", p2p=False).terms[0].bytes
0
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from memfit._checks import parse_int
from memfit.errors import ConfigError
from memfit.hardware.rules import rule
from memfit.units import MiB

__all__ = [
    "COMM_BASE_BYTES",
    "ENV_EFFECTS",
    "GRANULE",
    "JAX_NCCL_RELEASES",
    "MAX_CHANNELS",
    "NCCL_DEFAULT_VERSION",
    "TOPOLOGIES",
    "NcclEstimate",
    "NcclSettings",
    "NcclTerm",
    "channels_set_up",
    "nccl_memory",
    "p2p_channels_per_peer",
    "parse_nccl_version",
    "recommend_tight",
]

#: The topologies one node's GPUs can have.
TOPOLOGIES = ("pcie", "nvlink", "nvswitch")
#: The NCCL version assumed where none is given (torch 2.5 to 2.7's wheels).
NCCL_DEFAULT_VERSION = (2, 21)
#: NCCL releases a ``jax[cuda12]`` install may hold: JAX's CUDA plugin asks for
#: ``nvidia-nccl-cu12>=2.18.1`` with no upper bound (``jax_plugins/cuda/plugin_setup.py``,
#: ``with-cuda`` extra), so pip takes the newest release at install time; torch's wheels
#: pin one instead. One release per minor line published as ``nvidia-nccl-cu12`` wheels.
JAX_NCCL_RELEASES: tuple[tuple[int, ...], ...] = (
    (2, 18, 3),
    (2, 19, 3),
    (2, 20, 5),
    (2, 21, 5),
    (2, 23, 4),
    (2, 25, 1),
    (2, 26, 2),
    (2, 27, 3),
)
#: The device-memory granule of cuMem allocations (and of the driver's large pages).
GRANULE = 2 * MiB
#: Default LL buffer: NCCL_LL_LINES_PER_THREAD x NCCL_LL_MAX_NTHREADS x NCCL_STEPS x 16 B.
LL_BYTES = 8 * 512 * 8 * 16
#: Default LL128 buffer: NCCL_LL128_ELEMS_PER_THREAD x NCCL_LL128_MAX_NTHREADS x NCCL_STEPS x 8 B.
LL128_BYTES = 120 * 640 * 8 * 8
#: Default Simple buffer (DEFAULT_BUFFSIZE, 4 MiB).
SIMPLE_BYTES = 4 * MiB
#: The header in front of a P2P connection's buffers: sizeof(ncclSendMem) and
#: sizeof(ncclRecvMem), each a union padded to MEM_ALIGN (src/include/comm.h).
CONN_HEADER_BYTES = 4096
#: CUDA_IPC_MIN (src/include/comm.h): p2p.cc rounds each side of a P2P connection up to it.
CUDA_IPC_MIN = 2 * MiB
#: NVLS_MEM_ALIGN_SIZE: the per-buffer extra of the 2.17-2.22 NVLS layout.
NVLS_ALIGN_BYTES = 2 * MiB
#: NCCL_NVLS_CHUNKSIZE's default (128 KiB) in the later NVLS layout.
NVLS_CHUNK_BYTES = 128 * 1024
#: NCCL_STEPS.
STEPS = 8
#: MAXCHANNELS: the most channels a communicator sets up.
MAX_CHANNELS = 32
#: NCCL_WORK_SIZE: one work FIFO entry before 2.22 (src/include/device.h).
WORK_ENTRY_BYTES = 512
#: NCCL_WORK_FIFO_DEPTH's default (entries, before 2.22).
WORK_FIFO_DEPTH = 64 * 1024
#: NCCL_WORK_FIFO_BYTES' default (2.22 on).
WORK_FIFO_BYTES = 1 * MiB
#: What a communicator holds besides its buffers and its device structures, per rank: fitted
#: on the calibration part of tests/data/published_truth/multi_gpu/readings.yaml
#: (NVIDIA/nccl#964: a 2-rank communicator on 4 x A100 NVLink with NCCL 2.14 takes 544 MB, of
#: which 12 channels x 12 MiB are buffers (a 6 MiB send and a 6 MiB receive allocation each,
#: P2P read, rounded to CUDA_IPC_MIN as p2p.cc does), and the device structures a few KiB:
#: 544 - 144 = 400 MiB. 384 MiB until 2026-11-29, then 397 MiB with the buffers taken at
#: their byte size over 16 channels, until the same day's reading of p2p.cc's rounding.
COMM_BASE_BYTES = 400 * MiB
_COMM_BASE_SOURCE = (
    "fitted on the calibration readings (NVIDIA/nccl#964: 544 MB per 2-rank communicator on "
    "4 x A100 NVLink with NCCL 2.14, less its 12 channels of 12 MiB buffers (144 MiB); its "
    "device structures are cudaMalloc'd there, a few KiB); NCCL's source does not itemise the "
    "rest: its work FIFO is pinned host memory, its kernel images are loaded once per process "
    "and device, the driver's local memory for its kernels is reserved once per context, and "
    "its P2P allocations are the buffers"
)

#: The device structures' cuMem granules from which ``memfit env`` suggests cudaMalloc instead.
_CUMEM_ADVICE_BYTES = 64 * MiB

#: Every NCCL variable the model reads, and what it changes.
ENV_EFFECTS: dict[str, str] = {
    "NCCL_BUFFSIZE": "Simple protocol buffer per connection (default 4 MiB); also the NVLS "
    "buffer of 2.17-2.20. A smaller one saves the difference per channel and connection, "
    "at some bandwidth.",
    "NCCL_LL_BUFFSIZE": "LL protocol buffer per connection (default 512 KiB).",
    "NCCL_LL128_BUFFSIZE": "LL128 protocol buffer per connection (default 4,915,200 B; keep it "
    "120 x a power of two, NVIDIA/nccl#1739).",
    "NCCL_MAX_NCHANNELS": "caps the collective (and point-to-point) channels: buffers scale "
    "linearly with them (sjeaugey in NVIDIA/nccl#986).",
    "NCCL_MIN_NCHANNELS": "raises the collective channel count to at least this.",
    "NCCL_NVLS_ENABLE": "0 turns NVLink SHARP off: no multicast buffers (NeMo-Framework-Launcher "
    "sets it for memory).",
    "NCCL_NVLS_NCHANNELS": "NVLS channels (default 16; 32 on Blackwell from 2.26); in 2.20-2.21 "
    "the NVLS buffers follow the collective channels, raised to at least this.",
    "NCCL_NVLS_CHUNKSIZE": "NVLS step size from 2.21 (default 128 KiB; 8 steps per buffer).",
    "NCCL_P2P_READ_ENABLE": "1 puts the Simple buffer of every P2P connection on the sender "
    "(default: only between two compute capability 8.0 GPUs over NVLink), 0 on the receiver; "
    "each side is then rounded up to 2 MiB apart.",
    "NCCL_P2P_DISABLE": "1 sends intra-node traffic through host shared memory (SHM): the "
    "buffers leave the GPU, bandwidth drops.",
    "NCCL_P2P_LEVEL": "the farthest path P2P may take (LOC, NVL, PIX, PXB, PHB, SYS); LOC, or NVL "
    "between PCIe cards, sends intra-node traffic through SHM: the buffers leave the GPU. "
    "Without it NCCL's default is SYS on AMD hosts, PXB on Arm and current Intel hosts "
    "(src/graph/paths.cc ncclTopoCheckP2p), so PCIe cards that meet only through an Intel "
    "CPU already use SHM; memfit counts P2P on PCIe unless told, an upper bound.",
    "NCCL_SHM_DISABLE": "1 with P2P unavailable falls back to the network transport (sockets): "
    "buffers in host memory.",
    "NCCL_CUMEM_ENABLE": "1 (default from 2.19) makes every device allocation its own cuMem "
    "allocation in whole 2 MiB granules: each of the communicator's "
    "small device structures (3 per channel set up, 1 per NVLS channel, 1-2 per communicator; "
    "226 MiB on 8 x H100). 0 goes back to cudaMalloc, where the structures take a few KiB "
    "(and buffers can no longer be registered through cuMem).",
    "NCCL_MAX_P2P_NCHANNELS": "caps the point-to-point channels a communicator sets up at init "
    "(default 32; it sets up pow2Up(collective channels)), each with 3 device structures, and "
    "so the channels send/recv and all-to-all connect to each peer (12 MiB each).",
    "NCCL_MIN_P2P_NCHANNELS": "raises the point-to-point channels set up at init (default 1).",
    "NCCL_GDRCOPY_ENABLE": "1 (default 0) with NCCL_GDRCOPY_FIFO_ENABLE's default 1 moves the "
    "work FIFO from pinned host memory to device memory (GDRCopy).",
    "NCCL_GDRCOPY_FIFO_ENABLE": "0 keeps the work FIFO in host memory even with GDRCopy on.",
    "NCCL_WORK_FIFO_DEPTH": "work FIFO entries of 512 B before 2.22 (default 65536: 32 MiB); "
    "device memory only with GDRCopy's FIFO.",
    "NCCL_WORK_FIFO_BYTES": "work FIFO size from 2.22 (default 1 MiB); device memory only with "
    "GDRCopy's FIFO.",
}


def parse_nccl_version(text: str | tuple[int, ...] | None) -> tuple[int, ...]:
    """An NCCL version from ``"2.21.5"``, ``(2, 21, 5)`` or ``None`` (the default).

    Raises:
        ConfigError: When the text is not a version.

    >>> parse_nccl_version("2.19.3")
    (2, 19, 3)
    """
    if text is None:
        return NCCL_DEFAULT_VERSION
    if isinstance(text, tuple):
        return tuple(parse_int("nccl", p, lo=0) for p in text)
    parts = str(text).strip().split("+")[0].split(".")
    if len(parts) < 2:
        raise ConfigError(
            f"not an NCCL version: {text!r}", key_path="nccl", hint="write it as 2.21 or 2.21.5"
        )
    return tuple(parse_int("nccl", p, lo=0, hint="write it as 2.21 or 2.21.5") for p in parts)


@dataclass(frozen=True)
class NcclSettings:
    """The NCCL variables that change its device memory (``None``: NCCL's default)."""

    buffsize: int | None = None
    ll_buffsize: int | None = None
    ll128_buffsize: int | None = None
    max_nchannels: int | None = None
    min_nchannels: int | None = None
    nvls_enable: bool | None = None
    nvls_nchannels: int | None = None
    nvls_chunksize: int | None = None
    p2p_disable: bool = False
    p2p_read: bool | None = None
    p2p_level: int | None = None
    shm_disable: bool = False
    cumem_enable: bool | None = None
    max_p2p_nchannels: int | None = None
    min_p2p_nchannels: int | None = None
    gdrcopy_fifo: bool = False
    work_fifo_depth: int | None = None
    work_fifo_bytes: int | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None) -> NcclSettings:
        """Read the ``NCCL_*`` variables of :data:`ENV_EFFECTS` from an environment.

        Raises:
            ConfigError: For a value that is not a whole number (naming the variable).

        >>> NcclSettings.from_env({"NCCL_BUFFSIZE": "2097152", "NCCL_NVLS_ENABLE": "0"}).buffsize
        2097152
        """
        env = env or {}

        def num(name: str, lo: int = 0) -> int | None:
            value = env.get(name)
            return None if value is None else parse_int(name, value, lo=lo)

        def flag(name: str) -> bool | None:
            value = num(name)
            return None if value is None else value != 0

        return cls(
            buffsize=num("NCCL_BUFFSIZE", 1),
            ll_buffsize=num("NCCL_LL_BUFFSIZE", 1),
            ll128_buffsize=num("NCCL_LL128_BUFFSIZE", 1),
            max_nchannels=num("NCCL_MAX_NCHANNELS", 1),
            min_nchannels=num("NCCL_MIN_NCHANNELS", 1),
            nvls_enable=flag("NCCL_NVLS_ENABLE"),
            nvls_nchannels=num("NCCL_NVLS_NCHANNELS", 1),
            nvls_chunksize=num("NCCL_NVLS_CHUNKSIZE", 1),
            p2p_disable=bool(flag("NCCL_P2P_DISABLE")),
            p2p_read=flag("NCCL_P2P_READ_ENABLE"),
            p2p_level=_p2p_level(env.get("NCCL_P2P_LEVEL")),
            shm_disable=bool(flag("NCCL_SHM_DISABLE")),
            cumem_enable=flag("NCCL_CUMEM_ENABLE"),
            max_p2p_nchannels=num("NCCL_MAX_P2P_NCHANNELS", 1),
            min_p2p_nchannels=num("NCCL_MIN_P2P_NCHANNELS", 1),
            # the FIFO moves to device memory only with GDRCopy on and its FIFO use not off
            gdrcopy_fifo=bool(flag("NCCL_GDRCOPY_ENABLE"))
            and flag("NCCL_GDRCOPY_FIFO_ENABLE") is not False,
            work_fifo_depth=num("NCCL_WORK_FIFO_DEPTH", 1),
            work_fifo_bytes=num("NCCL_WORK_FIFO_BYTES", 1),
        )


@dataclass(frozen=True)
class NcclTerm:
    """One part of a communicator's device memory on one rank.

    Attributes:
        name: ``nccl_channel_buffers``, ``nccl_nvls``, ``nccl_p2p_buffers``,
            ``nccl_dev_structs``, ``nccl_work_fifo`` or ``nccl_comm_base``.
        bytes: Device bytes per rank.
        basis: ``"analytic"`` (from NCCL's source) or ``"fitted"``.
        detail: How the figure was made (counts and sizes).
        source: Where the figure's rules were read.
    """

    name: str
    bytes: int
    basis: str
    detail: str
    source: str

    def to_dict(self) -> dict[str, Any]:
        """Plain data."""
        return {
            "name": self.name,
            "bytes": self.bytes,
            "basis": self.basis,
            "detail": self.detail,
            "source": self.source,
        }


@dataclass(frozen=True)
class NcclEstimate:
    """NCCL's device memory per rank for one communicator.

    Attributes:
        ranks: Ranks in the communicator.
        topology: ``pcie``, ``nvlink`` or ``nvswitch``.
        nccl: The NCCL version assumed.
        transport: ``P2P``, ``SHM`` or ``NET`` (within the node).
        channels: Collective channels.
        terms: The parts, each with its basis.
        notes: What a reader needs to know (settings that changed the figure).
    """

    ranks: int
    topology: str
    nccl: tuple[int, ...]
    transport: str
    channels: int
    terms: tuple[NcclTerm, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def total_bytes(self) -> int:
        """Sum of the terms."""
        return sum(t.bytes for t in self.terms)

    def to_dict(self) -> dict[str, Any]:
        """Plain data."""
        return {
            "ranks": self.ranks,
            "topology": self.topology,
            "nccl": ".".join(str(p) for p in self.nccl),
            "transport": self.transport,
            "channels": self.channels,
            "total_bytes": self.total_bytes,
            "terms": [t.to_dict() for t in self.terms],
            "notes": list(self.notes),
        }


#: NCCL's path types, nearest first (src/graph/topo.h: PATH_LOC 0, PATH_NVL 1, PATH_PIX 3,
#: PATH_PXB 4, PATH_PHB 6, PATH_SYS 7 in current releases; NCCL_P2P_LEVEL takes the names,
#: or the older numbers 0-5 in this order).
P2P_LEVELS = ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS")


def _p2p_level(value: str | None) -> int | None:
    """``NCCL_P2P_LEVEL`` as an index of :data:`P2P_LEVELS` (``None``: unset).

    Raises:
        ConfigError: For a value that is neither a level's name nor 0-5.
    """
    if value is None:
        return None
    text = value.strip().upper()
    if text in P2P_LEVELS:
        return P2P_LEVELS.index(text)
    return parse_int(
        "NCCL_P2P_LEVEL", text, lo=0, hi=len(P2P_LEVELS) - 1, hint="one of " + ", ".join(P2P_LEVELS)
    )


def _round_up(n: int, granule: int) -> int:
    return -(-n // granule) * granule


def _transport(topology: str, p2p: bool | None, settings: NcclSettings) -> str:
    level = settings.p2p_level
    # LOC: no P2P at all; NVL: P2P over NVLink only, so PCIe cards go through SHM
    below = level is not None and (level == 0 or (level == 1 and topology == "pcie"))
    if settings.p2p_disable or below or (p2p is False and topology == "pcie"):
        return "NET" if settings.shm_disable else "SHM"
    return "P2P"


def _pow2_up(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _nvls_channels(
    version: tuple[int, ...], capability: tuple[int, int] | None, settings: NcclSettings
) -> int:
    """The NVLS channels (``NCCL_NVLS_NCHANNELS`` or the release's default), clamped as NCCL
    clamps them to [``NCCL_MIN_NCHANNELS``, ``NCCL_MAX_NCHANNELS``] (minCTAs..maxCTAs)."""
    nvls_channels = settings.nvls_nchannels or int(
        rule("nccl", "nvls.channels", nccl=version, capability=capability)
    )
    if settings.max_nchannels is not None:
        nvls_channels = min(nvls_channels, settings.max_nchannels)
    if settings.min_nchannels is not None:
        nvls_channels = max(nvls_channels, settings.min_nchannels)
    return nvls_channels


def channels_set_up(channels: int, settings: NcclSettings | None = None) -> int:
    """The channels a communicator sets up at init: its collective channels and the
    point-to-point channels ``ncclTopoComputeP2pChannels`` (``src/graph/paths.cc``) adds,
    ``pow2Up(max(min(channels, NCCL_MAX_P2P_NCHANNELS), NCCL_MIN_P2P_NCHANNELS))``, at most
    MAXCHANNELS (32).

    >>> channels_set_up(24), channels_set_up(16), channels_set_up(2)
    (32, 16, 2)
    """
    settings = settings or NcclSettings()
    p2p = min(channels, settings.max_p2p_nchannels or MAX_CHANNELS)
    p2p = max(p2p, settings.min_p2p_nchannels or 1)
    return max(channels, min(_pow2_up(p2p), MAX_CHANNELS))


def p2p_channels_per_peer(
    channels: int,
    topology: str,
    capability: tuple[int, int] | None = None,
    settings: NcclSettings | None = None,
    *,
    nccl: str | tuple[int, ...] | None = None,
) -> int:
    """The channels a send/recv or all-to-all connects to each peer, as NCCL computes them in
    every release read (``src/graph/paths.cc`` ``ncclTopoComputeP2pChannels``, v2.14.3 to
    v2.27.3): ``p2pnChannels = pow2Up(max(min(channels, NCCL_MAX_P2P_NCHANNELS),
    NCCL_MIN_P2P_NCHANNELS))`` and ``p2pnChannelsPerPeer = min(pow2Up(min(that before
    rounding, the fewest channels of any pair of the node's GPUs)), p2pnChannels)``, where a
    pair's channels are ``2 x max(1, bw / nvlBw)`` over NVLink, i.e. twice the NVLinks on the
    path (``ncclTopoGetNchannels``; ``src/graph/topo.cc`` links a GPU with ``count x nvlBw``),
    and 2 over PCIe. The first send to a peer connects ``p2pnChannelsPerPeer`` channels of
    ``connIndex`` 1 to it, the first receive as many (``src/enqueue.cc``).

    Over NVSwitch the path holds the module's links to the fabric
    (``rules_nccl.json`` ``p2p.nvswitch_links``: 18 on H100, 12 on A100, 6 on V100). Directly
    linked GPUs (``nvlink``) have as many links between a pair as the board gives, which memfit
    does not know: the collective channels are taken (no pair is the limit), an upper bound.

    >>> p2p_channels_per_peer(24, "nvswitch", (9, 0)), p2p_channels_per_peer(24, "nvswitch", (8, 0))
    (32, 32)
    >>> p2p_channels_per_peer(2, "pcie"), p2p_channels_per_peer(12, "nvlink", (8, 0))
    (2, 16)
    """
    settings = settings or NcclSettings()
    version = parse_nccl_version(nccl)
    p2p = min(channels, settings.max_p2p_nchannels or MAX_CHANNELS)
    p2p = max(p2p, settings.min_p2p_nchannels or 1)
    p2p_channels = min(_pow2_up(p2p), MAX_CHANNELS)
    if topology == "pcie":
        pair = 2
    elif topology == "nvswitch":
        links = int(rule("nccl", "p2p.nvswitch_links", nccl=version, capability=capability))
        pair = 2 * max(1, links)
    else:
        pair = p2p
    return min(_pow2_up(min(p2p, pair)), p2p_channels)


def _dev_structs_term(
    version: tuple[int, ...], channels: int, nvls_channels: int, settings: NcclSettings
) -> NcclTerm:
    """The communicator's small device structures, each its own 2 MiB cuMem allocation."""
    per_comm = int(rule("nccl", "dev_structs.per_comm", nccl=version))
    set_up = channels_set_up(channels, settings)
    count = per_comm + 3 * set_up + nvls_channels
    nvls = f" + {nvls_channels} NVLS channels x 1 (nvlsDevPeers)" if nvls_channels else ""
    return NcclTerm(
        "nccl_dev_structs",
        count * GRANULE,
        "analytic",
        f"({per_comm} per communicator + {set_up} channels set up x 3 (devPeers, the shared "
        f"devPeers, devRingUserRanks){nvls}) = {count} allocations of a few KiB, each a cuMem "
        f"allocation of one 2 MiB granule (NCCL_CUMEM_ENABLE)",
        "NVIDIA/nccl src/init.cc (devCommSetup), src/channel.cc (initChannel, initNvlsChannel), "
        "src/graph/paths.cc (ncclTopoComputeP2pChannels), src/include/alloc.h (ncclCuMemAlloc: "
        "ALIGN_SIZE(size, granularity), CU_MEM_ALLOC_GRANULARITY_MINIMUM) of 2.19-2.27",
    )


def _work_fifo_term(version: tuple[int, ...], settings: NcclSettings) -> NcclTerm:
    """The work FIFO in device memory (GDRCopy's FIFO only)."""
    if rule("nccl", "work_fifo.sized_by", nccl=version) == "bytes":
        size = settings.work_fifo_bytes or WORK_FIFO_BYTES
        how = f"NCCL_WORK_FIFO_BYTES {size} B"
    else:
        depth = settings.work_fifo_depth or WORK_FIFO_DEPTH
        size = depth * WORK_ENTRY_BYTES
        how = f"NCCL_WORK_FIFO_DEPTH {depth} x {WORK_ENTRY_BYTES} B"
    return NcclTerm(
        "nccl_work_fifo",
        _round_up(size, GRANULE),
        "analytic",
        f"{how}, in device memory with GDRCopy's FIFO (NCCL_GDRCOPY_ENABLE=1)",
        "NVIDIA/nccl src/init.cc devCommSetup (ncclGdrCudaCalloc of the work FIFO when "
        "ncclGdrCopy and NCCL_GDRCOPY_FIFO_ENABLE, else ncclCudaHostCalloc), "
        "src/include/gdrwrap.h",
    )


def _nvls_term(
    version: tuple[int, ...],
    capability: tuple[int, int] | None,
    channels: int,
    local: int,
    simple: int,
    settings: NcclSettings,
) -> NcclTerm:
    """NVLS's multicast buffers per rank, as ``src/transport/nvls.cc`` of ``version`` sizes
    them (``rules_nccl.json``'s ``nvls.*`` rows)."""
    nvls_channels = _nvls_channels(version, capability, settings)
    if rule("nccl", "nvls.channels_from", nccl=version) == "collective":
        count = max(channels, nvls_channels)
        which = f"{count} collective channels (at least the {nvls_channels} NVLS channels)"
    else:
        count = nvls_channels
        which = f"{count} NVLS channels"
    chunk = settings.nvls_chunksize or NVLS_CHUNK_BYTES
    formula = rule("nccl", "nvls.buffer_formula", nccl=version)
    if formula == "chunk":
        buff = chunk * STEPS
        how = f"{chunk} B chunk x {STEPS} steps"
    elif formula == "chunk_and_align":
        buff = chunk * STEPS + NVLS_ALIGN_BYTES
        how = f"{chunk} B chunk x {STEPS} steps + 2 MiB"
    else:
        buff = simple + NVLS_ALIGN_BYTES
        how = f"NCCL_BUFFSIZE {simple} B + 2 MiB"
    raw = count * 2 * buff * local
    gran = int(rule("nccl", "nvls.multicast_granularity", nccl=version))
    credit = int(rule("nccl", "nvls.credit_bytes", nccl=version))
    tail = f" + {credit // MiB} MiB of credits" if credit else ""
    return NcclTerm(
        "nccl_nvls",
        _round_up(raw, gran) + credit,
        "analytic",
        f"{which} x 2 x ({how}) x {local} local ranks = {raw // MiB} MiB, in "
        f"{gran // MiB} MiB granules{tail} (NCCL {'.'.join(str(p) for p in version)})",
        "NVIDIA/nccl src/transport/nvls.cc (ncclNvlsSetup, ncclNvlsBufferSetup, "
        "nvlsAllocateMem) of each release; vllm-project/vllm#9699, NVIDIA/nccl-tests#216 "
        "(NVLS INFO lines)",
    )


def nccl_memory(
    ranks: int,
    topology: str,
    *,
    nccl: str | tuple[int, ...] | None = None,
    capability: tuple[int, int] | None = None,
    local_ranks: int | None = None,
    p2p: bool | None = None,
    all_to_all: bool = False,
    p2p_peers: int | None = None,
    env: Mapping[str, str] | None = None,
) -> NcclEstimate:
    """NCCL's device memory per rank for one communicator of ``ranks`` GPUs.

    Args:
        ranks: GPUs in the communicator (2 or more; 1 gives no terms).
        topology: How the node's GPUs are linked: ``"pcie"``, ``"nvlink"`` (direct links or
            bridges) or ``"nvswitch"``.
        nccl: NCCL's version (``"2.21.5"``); default :data:`NCCL_DEFAULT_VERSION`.
        capability: The GPU's compute capability (NVLS needs 9.0 or newer).
        local_ranks: Ranks on this node (default: all).
        p2p: Whether the GPUs may access each other's memory; ``False`` for GeForce cards over
            PCIe (their driver refuses it), ``None``: yes.
        all_to_all: The job calls send/recv or all-to-all (point-to-point buffers per peer).
        p2p_peers: With ``all_to_all``, the peers each rank sends to and receives from (NCCL
            connects a peer at the first send or receive with it, in each direction):
            ``None``: every other rank (all-to-all); 1 for a ring shift (XLA's
            collective-permute over a ring, one send and one receive); 2 for a pipeline
            stage (activations forward, gradients back).
        env: The job's environment (its ``NCCL_*`` variables, :data:`ENV_EFFECTS`).

    Returns:
        The estimate, its terms per rank.

    Raises:
        ConfigError: For an unknown topology, fewer than 1 rank, or a bad NCCL variable.
    """
    ranks = parse_int("ranks", ranks, lo=1, hint="the number of GPUs")
    if topology not in TOPOLOGIES:
        raise ConfigError(
            f"unknown topology {topology!r}", key_path="topology", hint=f"one of {TOPOLOGIES}"
        )
    version = parse_nccl_version(nccl)
    settings = NcclSettings.from_env(env)
    local = ranks if local_ranks is None else parse_int("local_ranks", local_ranks, lo=1)
    peers = max(ranks - 1, 1)
    if p2p_peers is not None:
        peers = parse_int(
            "p2p_peers",
            p2p_peers,
            lo=1,
            hi=peers,
            hint=f"the peers each rank sends to and receives from, 1 to {peers}",
        )
    transport = _transport(topology, p2p, settings)
    notes: list[str] = []
    if ranks == 1:
        return NcclEstimate(ranks, topology, version, transport, 0, (), ())

    if topology == "pcie":
        channels = int(rule("nccl", "channels.pcie", nccl=version, capability=capability))
    elif topology == "nvlink":
        channels = int(rule("nccl", "channels.nvlink", nccl=version, capability=capability))
    else:
        channels = int(rule("nccl", "channels.nvswitch", nccl=version, capability=capability))
    if settings.min_nchannels is not None and channels < settings.min_nchannels:
        channels = settings.min_nchannels
        notes.append(f"NCCL_MIN_NCHANNELS raises the channels to {channels}")
    if settings.max_nchannels is not None and channels > settings.max_nchannels:
        channels = settings.max_nchannels
        notes.append(f"NCCL_MAX_NCHANNELS caps the channels at {channels}")

    cumem = settings.cumem_enable
    if cumem is None:
        cumem = bool(rule("nccl", "cumem.default", nccl=version))
    ll = settings.ll_buffsize or LL_BYTES
    ll128 = settings.ll128_buffsize or LL128_BYTES
    simple = settings.buffsize or SIMPLE_BYTES
    # p2p.cc puts each side of a connection in one allocation behind a 4 KiB header and rounds
    # it up to CUDA_IPC_MIN (2 MiB) in every release, cudaMalloc'd or cuMem: with P2P read the
    # Simple buffer sits on the sender (two compute capability 8.0 GPUs over NVLink)
    read = settings.p2p_read
    if read is None:
        read = capability == (8, 0) and topology in ("nvlink", "nvswitch")
    recv_conn = _round_up(CONN_HEADER_BYTES + ll + ll128 + (0 if read else simple), CUDA_IPC_MIN)
    send_conn = _round_up(CONN_HEADER_BYTES + (simple if read else 0), CUDA_IPC_MIN)
    # ring: one receiving and one sending connection per channel; the tree (a chain in a
    # node) adds the other direction with more than two ranks
    conns = 1 if ranks == 2 else 2
    on_device = transport == "P2P"
    per_channel = conns * (recv_conn + send_conn)
    terms: list[NcclTerm] = []
    buffers = channels * per_channel if on_device else 0
    where = "device memory" if on_device else f"host memory ({transport} transport)"
    if not on_device:
        notes.append(
            f"the channel buffers are in host memory: the {transport} transport "
            + ("(GeForce cards refuse peer access over PCIe)" if p2p is False else "")
        )
    if on_device and topology == "pcie" and settings.p2p_level is None:
        notes.append(
            "P2P assumed between the PCIe cards, an upper bound: on an Intel or Arm host NCCL "
            "uses P2P only through a shared PCIe switch (PXB), else SHM, which keeps the "
            "channel buffers in host memory (NCCL_P2P_LEVEL=NVL plans that)"
        )
    terms.append(
        NcclTerm(
            "nccl_channel_buffers",
            buffers,
            "analytic",
            (
                f"{channels} channels x {conns} connection(s) x ({recv_conn // 1024} KiB "
                f"received (LL {ll} + LL128 {ll128}{'' if read else f' + Simple {simple}'} B) + "
                f"{send_conn // 1024} KiB sent{f' (Simple {simple} B, P2P read)' if read else ''})"
                f", each side with its 4 KiB header rounded up to 2 MiB"
                f"{' (cuMem)' if cumem else ' (cudaMalloc, CUDA_IPC_MIN)'}, in {where}"
            )
            if on_device
            else f"{channels} channels x {conns} connection(s) of LL {ll} + LL128 {ll128} + "
            f"Simple {simple} B, in {where}: none on the device",
            "NVIDIA/nccl src/init.cc (DEFAULT_LL_BUFFSIZE, DEFAULT_LL128_BUFFSIZE, "
            "DEFAULT_BUFFSIZE), src/transport/p2p.cc (ALIGN_SIZE(sendSize/recvSize, "
            "CUDA_IPC_MIN), P2P read), src/graph/paths.cc (ncclTopoCheckP2p: read for 8.0 over "
            "NVLink), src/graph/connect.cc (rings and trees); NVIDIA/nccl#1685 (10485760 and "
            "2097152-byte allocations)",
        )
    )
    nvls_on = settings.nvls_enable is not False and topology == "nvswitch" and local > 2
    nvls_channels = 0
    if nvls_on and bool(rule("nccl", "nvls.available", nccl=version, capability=capability)):
        terms.append(_nvls_term(version, capability, channels, local, simple, settings))
        nvls_channels = _nvls_channels(version, capability, settings)
    elif topology == "nvswitch" and settings.nvls_enable is False:
        notes.append("NCCL_NVLS_ENABLE=0: no NVLS multicast buffers")
    if all_to_all and on_device:
        per_peer = p2p_channels_per_peer(channels, topology, capability, settings, nccl=version)
        terms.append(
            NcclTerm(
                "nccl_p2p_buffers",
                peers * per_peer * (recv_conn + send_conn),
                "analytic",
                f"{peers} peers x {per_peer} channels per peer (p2pnChannelsPerPeer) x one "
                f"receiving connection of {recv_conn / MiB:g} MiB and one sending of "
                f"{send_conn / MiB:g} MiB (connIndex 1: every protocol's buffer, each side "
                "with its 4 KiB header rounded up to 2 MiB, as the collective channels), made "
                "at the first send/recv or all-to-all with each peer",
                "NVIDIA/nccl src/graph/paths.cc (ncclTopoComputeP2pChannels, "
                "ncclTopoGetNchannels), src/enqueue.cc (p2pnChannelsPerPeer channels of "
                "connIndex 1 connected per peer and direction), src/transport/p2p.cc; "
                "NVIDIA/nccl#1685 (32 channels per pair on 8 x H100, 10485760- and "
                "2097152-byte allocations)",
            )
        )
    if cumem:
        terms.append(_dev_structs_term(version, channels, nvls_channels, settings))
    else:
        notes.append(
            "the communicator's device structures are cudaMalloc'd (NCCL before 2.19 or "
            "NCCL_CUMEM_ENABLE=0): a few KiB, counted as none"
        )
    if settings.gdrcopy_fifo:
        terms.append(_work_fifo_term(version, settings))
    terms.append(
        NcclTerm(
            "nccl_comm_base",
            COMM_BASE_BYTES,
            "fitted",
            "per communicator, whatever the transport, card or release: the rest of "
            "NVIDIA/nccl#964's 2-rank communicator (NCCL 2.14) beyond its channel buffers, not "
            "itemised by NCCL's source",
            _COMM_BASE_SOURCE,
        )
    )
    if bool(rule("nccl", "runtime_connect.default", nccl=version)):
        notes.append(
            "NCCL_RUNTIME_CONNECT (default from 2.22) connects an algorithm's buffers at its "
            "first use: the figure counts rings, trees and NVLS all, an upper bound"
        )
    return NcclEstimate(ranks, topology, version, transport, channels, tuple(terms), tuple(notes))


def largest_nccl_memory(
    ranks: int,
    topology: str,
    releases: tuple[tuple[int, ...], ...] = JAX_NCCL_RELEASES,
    **kwargs: Any,
) -> NcclEstimate:
    """:func:`nccl_memory` for an unknown NCCL: the largest figure among ``releases`` (the
    safe side: under-prediction is an OOM), with a note naming the release taken.

    On 8 x H100 that is NCCL 2.20, whose NVLS buffers follow the 24 collective channels at
    ``NCCL_BUFFSIZE`` + 2 MiB each (2,560 MiB against 2.21's 1,536 MiB).

    >>> largest_nccl_memory(8, "nvswitch", capability=(9, 0)).nccl
    (2, 20, 5)

    Raises:
        ConfigError: As :func:`nccl_memory`.
    """
    if "nccl" in kwargs:
        raise ConfigError("largest_nccl_memory takes no NCCL version", key_path="nccl")
    estimates = [nccl_memory(ranks, topology, nccl=v, **kwargs) for v in releases]
    worst = max(estimates, key=lambda e: e.total_bytes)
    low, high = (".".join(str(p) for p in v[:2]) for v in (releases[0], releases[-1]))
    taken = ".".join(str(p) for p in worst.nccl)
    note = (
        f"NCCL's version unknown (jax[cuda12] asks for nvidia-nccl-cu12>=2.18.1, no upper "
        f"bound): the largest figure of NCCL {low}-{high}, {taken}'s; give devices.nccl"
    )
    return NcclEstimate(
        worst.ranks,
        worst.topology,
        worst.nccl,
        worst.transport,
        worst.channels,
        worst.terms,
        (*worst.notes, note),
    )


def recommend_tight(estimate: NcclEstimate) -> dict[str, str]:
    """NCCL settings that shrink a communicator's device memory on a tight card, each with
    what it costs (bandwidth), for ``memfit env``-style advice.

    >>> sorted(recommend_tight(nccl_memory(8, "nvswitch", capability=(9, 0))))
    ['NCCL_BUFFSIZE', 'NCCL_CUMEM_ENABLE', 'NCCL_MAX_NCHANNELS', 'NCCL_NVLS_ENABLE']
    >>> sorted(recommend_tight(nccl_memory(4, "pcie")))
    ['NCCL_BUFFSIZE', 'NCCL_P2P_DISABLE']
    """
    out: dict[str, str] = {}
    names = {t.name for t in estimate.terms if t.bytes}
    structs = sum(t.bytes for t in estimate.terms if t.name == "nccl_dev_structs")
    if structs >= _CUMEM_ADVICE_BYTES:
        # cudaMalloc packs the few-KiB structures instead of a 2 MiB granule each
        out["NCCL_CUMEM_ENABLE"] = "0"
    if "nccl_nvls" in names:
        out["NCCL_NVLS_ENABLE"] = "0"
    if "nccl_channel_buffers" in names and estimate.channels > 2:
        out["NCCL_MAX_NCHANNELS"] = str(max(2, estimate.channels // 2))
    if "nccl_channel_buffers" in names:
        out["NCCL_BUFFSIZE"] = str(2 * MiB)
    if "nccl_channel_buffers" in names and estimate.topology == "pcie":
        # over PCIe the buffers may live in host memory instead (SHM), at bandwidth
        out["NCCL_P2P_DISABLE"] = "1"
    return out
