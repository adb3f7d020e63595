"""What a step compiled for several devices adds to its estimate: the breakdown line for the
devices besides device 0, and the notes (per-device figures, collectives, device 0's unplaced
arrays). Split out of :mod:`memfit.estimate.xla.step`, which builds the estimate."""

from __future__ import annotations

from typing import Any

__all__ = ["other_devices_term", "several_devices_notes"]


def other_devices_term(devices: int, buffers: int, device0: int) -> tuple[str, int, str]:
    """The breakdown line for devices 1..N-1: XLA's buffers only (the autotuner ran on
    device 0), reported as how much less than device 0 each holds."""
    others = "device 1 holds" if devices == 2 else f"devices 1-{devices - 1} each hold"
    return (
        f"{others} less than device 0 by (the first call's autotuning runs on device 0 only)",
        max(0, device0 - buffers),
        "XLA's GPU compiler autotunes with one device's stream executor (AutotuneConfig, "
        "xla/service/gpu/autotuning/autotuner_util.h; not measured on several GPUs); SPMD "
        "gives every device the same buffers",
    )


def several_devices_notes(result: Any) -> list[str]:
    """What the estimate of a step sharded over several devices says besides its terms."""
    from memfit.units import format_bytes

    notes = [
        f"compiled for {result.devices} devices (compile-only topology 1x1x{result.devices}, "
        "XLA's SPMD partitioning): every figure is per device; peak_bytes_in_use is device "
        "0's, which also holds the first call's autotuning"
    ]
    if result.collectives:
        moved = sum(size for _, size in result.collectives)
        kinds = sorted({op for op, _ in result.collectives})
        notes.append(
            f"{len(result.collectives)} collectives ({', '.join(kinds)}) move "
            f"{format_bytes(moved)} per device and call; their results are among XLA's "
            "buffers above. NCCL's own communication buffers (NCCL_BUFFSIZE, 4 MiB by default, "
            "per channel and peer, and its communicators) are allocated outside JAX's allocator: "
            "in nvidia-smi, not in memory_stats(), and not counted (their number of channels "
            "and peers depends on the machine's topology)"
        )
    notes.append(
        "device 0 also holds every array the program did not shard or place (JAX puts "
        "uncommitted arrays on jax.devices()[0]: keys, metrics, anything created outside a "
        "sharded jit); memfit cannot see those"
    )
    return notes
