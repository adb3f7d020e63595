"""A stand-in for ``torch.cuda``'s memory figures, for probes and readers tested without a GPU."""

from __future__ import annotations


class FakeTorchCuda:
    """``torch.cuda`` with set figures: device free/total memory and the caching allocator's
    current and peak counts (the same counts in ``memory_stats``' flat form)."""

    def __init__(
        self,
        *,
        free: int,
        total: int,
        allocated: int,
        reserved: int,
        peak_allocated: int,
        peak_reserved: int,
        available: bool = True,
    ) -> None:
        self.available = available
        self.free, self.total = free, total
        self.allocated, self.reserved = allocated, reserved
        self.peak_allocated, self.peak_reserved = peak_allocated, peak_reserved

    def is_available(self) -> bool:
        return self.available

    def mem_get_info(self, index: int) -> tuple[int, int]:
        return self.free, self.total

    def memory_allocated(self, index: int) -> int:
        return self.allocated

    def memory_reserved(self, index: int) -> int:
        return self.reserved

    def max_memory_allocated(self, index: int) -> int:
        return self.peak_allocated

    def max_memory_reserved(self, index: int) -> int:
        return self.peak_reserved

    def memory_stats(self, index: int) -> dict[str, int]:  # torch.cuda's flat form
        return {
            "allocated_bytes.all.current": self.memory_allocated(index),
            "reserved_bytes.all.current": self.memory_reserved(index),
            "allocated_bytes.all.peak": self.max_memory_allocated(index),
            "reserved_bytes.all.peak": self.max_memory_reserved(index),
        }
