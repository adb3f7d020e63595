"""``SequenceModel.largest_fitting`` when fitting is not monotone in the batch: the caching
allocator's reserved peak is a step function of the request sizes and can fall as they grow
(a block crossing the 1 MiB line leaves the small pool), so a fitting run can lie above a
failure; the search looks above the bisection's first failure, up to where the allocated
peak (monotone) leaves the target."""

from __future__ import annotations

from typing import Any

from memfit.estimate.torch._sequence import Fit, SequenceModel


class _Landscape(SequenceModel):
    """A sequence whose replay is a given landscape: fits at ``v <= 300`` and
    ``700 <= v <= 900``, allocated peak ``1000 * v`` bytes."""

    def replay(self, value: int, **kw: Any) -> Fit:
        fits = value <= 300 or 700 <= value <= 900
        if kw.get("limit_bytes") is None and kw.get("target_bytes") is None:
            fits = True
        return Fit(value, fits, 1000 * value, 1000 * value)


def _landscape() -> _Landscape:
    return _Landscape((True,), (0,), (0.0,), (1.0,))


def test_largest_fitting_finds_a_run_above_the_first_failure() -> None:
    got = _landscape().largest_fitting(1, 2000, limit_bytes=2_000_000, target_bytes=950_000)
    assert got is not None and got.value == 900 and got.fits


def test_largest_fitting_stops_where_the_allocated_peak_leaves_the_target() -> None:
    # allocated 1000 * v: nothing above 650 can fit a 650 kB target, so the run at 700-900
    # is not looked for (the landscape says it fits; a real replay would not)
    got = _landscape().largest_fitting(1, 2000, limit_bytes=2_000_000, target_bytes=650_000)
    assert got is not None and got.value == 300


def test_a_real_replay_of_a_small_pool_crossing_is_not_monotone() -> None:
    """The allocator model itself: two blocks of ``s`` bytes beside a 5 MiB block and a 2 MiB
    small segment half full. Up to 0.5 MiB both take the small segment's free half; up to
    1 MiB the second takes a new small segment; above 1 MiB both go into the 5 MiB block's
    20 MiB segment."""
    mib = 2**20
    seq = SequenceModel(
        allocs=(True, True, True, True, True),
        records=(0, 1, 2, 3, 4),
        intercepts=(5.0 * mib, 0.5 * mib, 0.5 * mib, 0.0, 0.0),
        slopes=(0.0, 0.0, 0.0, 1024.0, 1024.0),
    )
    reserved = {v: seq.replay(v).reserved_peak // mib for v in (256, 768, 2048)}
    assert reserved == {256: 22, 768: 24, 2048: 22}
    got = seq.largest_fitting(1, 8192, limit_bytes=23 * mib)
    assert got is not None and 2048 <= got.value <= 8192 and got.fits
