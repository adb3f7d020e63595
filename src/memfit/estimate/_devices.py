"""Several GPUs for the estimators: ``gpu="4xRTX 4090"`` and the collective terms per device.

:func:`memfit.estimate_torch` and :func:`memfit.estimate_jax` take the device spec
:func:`memfit.plan_devices` takes (``"8xH100"``, and a ``devices=`` mapping with the keys of a
workload's ``devices:`` block): the step is estimated on one card, as before, and each
device's figure (``device_used_peak``, ``device_used_bytes``) adds what a job on that many
cards holds besides: NCCL's communicators (:mod:`memfit.hardware.nccl`), and on device 0 the
extras :func:`memfit.core.multi_gpu.device_terms` names, each term with its basis.

>>> c = collectives("4xRTX 4090", framework="torch")
>>> c.card, c.count, c.topology, [t.name for t in c.terms]
('RTX 4090', 4, 'pcie', ['nccl_channel_buffers', 'nccl_dev_structs', 'nccl_comm_base'])
>>> collectives("RTX 4090", framework="torch") is None
True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pydantic

from memfit._checks import require, require_mapping
from memfit.core.multi_gpu import DeviceTerm, devices_terms, parse_gpu_count
from memfit.core.workload import DeviceSpec
from memfit.errors import ConfigError
from memfit.hardware.catalog import gpu as lookup_gpu
from memfit.hardware.nccl import NcclEstimate
from memfit.hardware.runtime import Runtime
from memfit.units import format_bytes

__all__ = ["Collectives", "collectives", "split_gpu"]

#: The keys ``devices=`` takes (a workload's ``devices:`` block less its count).
DEVICE_KEYS = tuple(k for k in DeviceSpec.model_fields if k != "count")


def split_gpu(gpu: str | None) -> tuple[str | None, int]:
    """``"4xRTX 4090"`` -> ``("RTX 4090", 4)``; a card without a count -> ``(card, 1)``.

    Raises:
        ConfigError: For a count of 0 or more than 4096.
    """
    if gpu is None:
        return None, 1
    parsed = parse_gpu_count(gpu)
    if parsed is None:
        return gpu, 1
    return parsed[1], parsed[0]


@dataclass(frozen=True)
class Collectives:
    """What ``count`` cards add to each device's figure.

    Attributes:
        card: The card's name as given (without the count).
        count: How many.
        topology: ``pcie``, ``nvlink`` or ``nvswitch``.
        strategy: ``ddp``, ``fsdp`` or ``pmap``.
        terms: The terms, each with its basis and source (:class:`DeviceTerm`).
        nccl: NCCL's estimate per communicator (transport, channels, notes).
    """

    card: str
    count: int
    topology: str
    strategy: str
    terms: tuple[DeviceTerm, ...]
    nccl: NcclEstimate | None

    @property
    def every_device_bytes(self) -> int:
        """What every device adds."""
        return sum(t.bytes for t in self.terms if not t.device0_only)

    @property
    def device0_bytes(self) -> int:
        """What device 0 adds on top of :attr:`every_device_bytes`."""
        return sum(t.bytes for t in self.terms if t.device0_only)

    def notes(self) -> list[str]:
        """One line per term, and NCCL's own notes, for an estimate's deviations."""
        out = [
            f"{self.count} x {self.card} ({self.topology}, {self.strategy}): each device adds "
            f"{format_bytes(self.every_device_bytes)} of collective terms"
            + (f", device 0 {format_bytes(self.device0_bytes)} more" if self.device0_bytes else "")
        ]
        for t in self.terms:
            where = "device 0" if t.device0_only else "every device"
            out.append(f"{t.name} ({t.basis}, {where}): {format_bytes(t.bytes)}: {t.detail}")
        if self.nccl is not None:
            out.extend(self.nccl.notes)
        return out

    def to_dict(self) -> dict[str, Any]:
        """Plain data."""
        return {
            "card": self.card,
            "count": self.count,
            "topology": self.topology,
            "strategy": self.strategy,
            "every_device_bytes": self.every_device_bytes,
            "device0_bytes": self.device0_bytes,
            "terms": [t.to_dict() for t in self.terms],
            "nccl": None if self.nccl is None else self.nccl.to_dict(),
        }


def _device_spec(count: int, framework: str, devices: Mapping[str, Any] | None) -> DeviceSpec:
    given = dict(devices or {})
    unknown = sorted(set(given) - set(DEVICE_KEYS))
    if unknown:
        raise ConfigError(
            f"unknown devices key {unknown[0]!r}",
            key_path=f"devices.{unknown[0]}",
            hint="the keys are " + ", ".join(DEVICE_KEYS),
        )
    strategy = given.pop("strategy", None) or ("pmap" if framework == "jax" else "ddp")
    if strategy == "single":
        raise ConfigError(
            "devices.strategy 'single' runs on one device",
            key_path="devices.strategy",
            hint="ddp or fsdp for torch, pmap for JAX",
        )
    try:
        return DeviceSpec.model_validate({"count": count, "strategy": strategy, **given})
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise ConfigError(
            f"devices: {first.get('msg', 'invalid')}",
            key_path=f"devices.{where}" if where else "devices",
            hint="see docs/workload.md, 'devices'",
        ) from None


def collectives(
    gpu: str | None,
    *,
    framework: str,
    devices: Mapping[str, Any] | None = None,
    runtime: Runtime | None = None,
    jaxlib: str | None = None,
) -> Collectives | None:
    """The collective terms of ``gpu`` (``"4xRTX 4090"``), or ``None`` for one card.

    Args:
        gpu: A catalog card with a count.
        framework: ``torch`` or ``jax`` (the default strategy: DDP, pmap).
        devices: A workload's ``devices:`` keys: ``strategy``, ``topology``, ``nccl``,
            ``nccl_env``, ``communicators``, ``set_device``, ``stray_init``, ``stray_bytes``,
            ``all_to_all``, ``p2p_peers`` (the rest are the framework's own settings).
        runtime: The target's runtime (sizes the stray contexts on device 0).
        jaxlib: For JAX, the jaxlib the GPU runs: its XLA decides how many communicators
            a device group joins (:func:`memfit.core.multi_gpu.default_communicators`).

    Raises:
        ConfigError: For a bad count, card or ``devices`` key (named).
    """
    require("gpu", gpu, "str", optional=True)
    require_mapping("devices", devices, optional=True)
    card, count = split_gpu(gpu)
    if card is None or count == 1:
        if devices:
            raise ConfigError(
                "devices= needs several GPUs",
                key_path="devices",
                hint='give the count with the card: gpu="4xRTX 4090"',
            )
        return None
    spec = lookup_gpu(card)
    dev = _device_spec(count, framework, devices)
    terms, est = devices_terms(
        spec, count, framework, dev, runtime, jaxlib=jaxlib if framework == "jax" else None
    )
    topology = est.topology if est is not None else (dev.topology or "pcie")
    return Collectives(card, count, topology, dev.strategy, tuple(terms), est)
