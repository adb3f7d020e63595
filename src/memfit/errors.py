"""One exception hierarchy for memfit.

Every error memfit raises on purpose is a :class:`MemfitError`. Each carries a short
``message`` (what went wrong) and an optional ``hint`` (what to do about it); the CLI prints
them as ``Error: ...`` and ``Hint: ...`` on stderr and exits 1.

Errors from other libraries are translated at the boundary with ``raise ... from exc`` so the
original cause stays attached for ``--debug``.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = [
    "BackendUnavailable",
    "ConfigError",
    "EstimateError",
    "InfeasiblePlan",
    "MemfitError",
    "OutOfMemory",
    "did_you_mean",
]


class MemfitError(Exception):
    """Base class of every error memfit raises on purpose.

    Args:
        message: What went wrong, in one sentence.
        hint: What the user can do about it, or ``None``.
    """

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def to_dict(self) -> dict[str, Any]:
        """The error as plain data, for ``--json`` output."""
        return {"error": type(self).__name__, "message": self.message, "hint": self.hint}


class ConfigError(MemfitError, ValueError):
    """Bad user input: a size, a workload file, a setting, a knob value.

    Args:
        message: What is wrong.
        key_path: Where it is (``"knobs.num_envs.max"``, ``"PYTORCH_CUDA_ALLOC_CONF"``,
            ``"workload.yaml:12:3"``), or ``None``.
        hint: What to do about it.
    """

    def __init__(
        self, message: str, *, key_path: str | None = None, hint: str | None = None
    ) -> None:
        # A path of thousands of characters is shown by its ends (key_path keeps it whole).
        shown = key_path if not key_path or len(key_path) <= 160 else (
            f"{key_path[:60]}...({len(key_path):,} characters)...{key_path[-60:]}"
        )  # fmt: skip
        full = f"{shown}: {message}" if shown else message
        super().__init__(full, hint=hint)
        self.key_path = key_path

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        data["key_path"] = self.key_path
        return data


class InfeasiblePlan(MemfitError):
    """No configuration of the workload fits the budget.

    Args:
        message: What does not fit.
        smallest_bytes: The footprint of the smallest valid configuration.
        budget_bytes: What the GPU leaves for the job.
        binding_term: The memory term (or rule) that breaks the budget.
        hint: What to change.
    """

    def __init__(
        self,
        message: str,
        *,
        smallest_bytes: int | None,
        budget_bytes: int,
        binding_term: str | None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.smallest_bytes = smallest_bytes
        self.budget_bytes = budget_bytes
        self.binding_term = binding_term

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        data.update(
            smallest_bytes=self.smallest_bytes,
            budget_bytes=self.budget_bytes,
            binding_term=self.binding_term,
        )
        return data


class BackendUnavailable(MemfitError):
    """A hardware backend or framework is not there (no driver, no CUDA, package missing)."""


class EstimateError(MemfitError):
    """A step could not be traced or compiled for an estimate (names the op or the cause)."""


class OutOfMemory(MemfitError):
    """Out of memory even after everything memfit may try.

    Args:
        message: What ran out.
        device: The device (``"cuda:0"``, ``"simulated"``), or ``None``.
        requested_bytes: The allocation that failed, if known.
        free_bytes: Free memory on the device when it failed, if known.
        peak_bytes: The peak seen in the failing attempt, if known.
        budget_bytes: The budget in force, if known.
        tried: What was tried, in order (``["retry", "split x2", ...]``).
        hint: What the user can do.
    """

    def __init__(
        self,
        message: str,
        *,
        device: str | None = None,
        requested_bytes: int | None = None,
        free_bytes: int | None = None,
        peak_bytes: int | None = None,
        budget_bytes: int | None = None,
        tried: Sequence[str] = (),
        hint: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        # An exception's constructor never raises: the framework (or a user's handler) may
        # build one from whatever it has at the worst moment, and an error raised here would
        # hide the out-of-memory. Odd values are kept as well as they can be: a number of
        # bytes that is not a whole number is unknown (None), a device that is not a name is
        # named by str(), one item of what was tried is a list of one.
        self.device = _text_or_none(device)
        self.requested_bytes = _bytes_or_none(requested_bytes)
        self.free_bytes = _bytes_or_none(free_bytes)
        self.peak_bytes = _bytes_or_none(peak_bytes)
        self.budget_bytes = _bytes_or_none(budget_bytes)
        self.tried = _tried_list(tried)

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        data.update(
            device=self.device,
            requested_bytes=self.requested_bytes,
            free_bytes=self.free_bytes,
            peak_bytes=self.peak_bytes,
            budget_bytes=self.budget_bytes,
            tried=list(self.tried),
        )
        return data


def _text_or_none(value: object) -> str | None:
    """``value`` as a name: itself when a ``str``, else its ``str()`` (``torch.device``),
    else ``None``."""
    if value is None or isinstance(value, str):
        return value
    try:
        return str(value)
    except Exception:  # a __str__ that fails: the device is unknown
        return None


def _bytes_or_none(value: object) -> int | None:
    """``value`` as a whole number of bytes (a numpy integer too), or ``None`` (unknown)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    index = getattr(type(value), "__index__", None)
    if index is None:
        return None
    try:
        return int(index(value))
    except Exception:  # an __index__ that fails: unknown
        return None


def _items(values: Iterable[object]) -> list[object]:
    """The items of ``values``; of an iterable that fails part way, the ones it gave."""
    out: list[object] = []
    try:
        for item in values:
            out.append(item)
    except Exception:  # a generator that fails part way: what it gave
        return out
    return out


def _tried_list(tried: object) -> list[str]:
    """What was tried, as a list of text: one string is one item, a non-iterable is one
    item, an iterable that fails part way keeps what it gave."""
    if isinstance(tried, (str, bytes)) or not isinstance(tried, Iterable):
        items: list[object] = [] if tried is None else [tried]
    else:
        items = _items(tried)
    out: list[str] = []
    for item in items:
        if isinstance(item, bytes):
            out.append(item.decode("utf-8", "replace"))
        else:
            out.append(_text_or_none(item) or "?")
    return out


# --------------------------------------------------------------------------------------------
# Hints


def did_you_mean(
    word: str, known: Iterable[str], *, otherwise: str | None = None, cutoff: float = 0.6
) -> str | None:
    """A hint for a misspelt name: ``"did you mean 'num_envs'?"``, else ``otherwise``.

    >>> did_you_mean("num_env", ["batch_size", "num_envs"])
    "did you mean 'num_envs'?"
    >>> did_you_mean("zzz", ["num_envs"], otherwise="known: num_envs")
    'known: num_envs'
    """
    close = difflib.get_close_matches(word, sorted(known), n=1, cutoff=cutoff)
    return f"did you mean {close[0]!r}?" if close else otherwise
