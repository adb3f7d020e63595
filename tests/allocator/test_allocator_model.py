"""AllocatorModel against hand-worked allocation sequences (c10/cuda/CUDACachingAllocator.cpp)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memfit.allocator.model import AllocatorModel
from memfit.errors import ConfigError, OutOfMemory

KiB = 1024
MiB = 1024 * 1024


def test_small_requests_share_one_2mib_segment() -> None:
    m = AllocatorModel()
    m.malloc(1000)
    m.malloc(1000)
    assert m.allocated_bytes == 2048  # two 512-rounded blocks split from one segment
    assert m.reserved_bytes == 2 * MiB
    assert m.segment_count == 1


def test_zero_byte_request_takes_no_block() -> None:
    m = AllocatorModel()
    h = m.malloc(0)
    assert (m.allocated_bytes, m.reserved_bytes) == (0, 0)
    m.free(h)
    assert m.segment_count == 0


def test_freed_small_block_is_reused_not_reallocated() -> None:
    m = AllocatorModel()
    a = m.malloc(600 * KiB)
    m.free(a)
    m.malloc(600 * KiB)
    assert m.segment_count == 1
    assert m.reserved_bytes == 2 * MiB


def test_free_neighbours_coalesce_within_a_segment() -> None:
    m = AllocatorModel()
    a = m.malloc(512 * KiB)
    b = m.malloc(512 * KiB)
    m.malloc(1 * MiB)  # the segment is now full
    m.free(a)
    m.free(b)
    # Only a merged 1 MiB block can hold this without a second segment.
    m.malloc(1 * MiB)
    assert m.segment_count == 1
    assert m.allocated_bytes == 2 * MiB


def test_without_coalescing_neighbours_in_different_segments_do_not_merge() -> None:
    m = AllocatorModel()
    a = m.malloc(1 * MiB)  # segment 1: [a 1 MiB | free 1 MiB]
    m.malloc(1 * MiB)  # fills segment 1
    c = m.malloc(1 * MiB)  # segment 2
    m.malloc(1 * MiB)  # fills segment 2
    m.free(a)
    m.free(c)
    # Two free 1 MiB blocks in different segments: a 1 MiB request fits, nothing bigger exists.
    assert m.free_cached_bytes == 2 * MiB
    m.malloc(1 * MiB)
    assert m.segment_count == 2


def test_medium_request_splits_a_20mib_segment() -> None:
    m = AllocatorModel()
    m.malloc(3 * MiB)
    assert m.reserved_bytes == 20 * MiB
    assert m.allocated_bytes == 3 * MiB  # split: the 17 MiB rest is a free block
    m.malloc(17 * MiB)  # exactly the rest
    assert m.segment_count == 1
    assert m.allocated_bytes == 20 * MiB


def test_large_block_is_not_split_for_a_remainder_of_1mib_or_less() -> None:
    m = AllocatorModel()
    m.malloc(19 * MiB + 512 * KiB)  # own segment of 20 MiB, remainder 0.5 MiB
    assert m.reserved_bytes == 20 * MiB
    assert m.allocated_bytes == 20 * MiB  # the whole block counts as allocated


def test_large_request_gets_segment_rounded_to_2mib_and_split() -> None:
    m = AllocatorModel()
    m.malloc(10 * MiB + 1)
    assert m.reserved_bytes == 12 * MiB
    assert m.allocated_bytes == 10 * MiB + 512  # remainder ~2 MiB > 1 MiB: split


def test_best_fit_takes_the_smallest_free_block_that_holds_the_request() -> None:
    m = AllocatorModel()
    big = m.malloc(30 * MiB)
    small = m.malloc(12 * MiB)
    m.free(big)
    m.free(small)
    m.malloc(11 * MiB)
    # The 12 MiB block: no new segment, and the 1 MiB remainder is not split off.
    assert m.segment_count == 2
    assert m.allocated_bytes == 12 * MiB
    m.malloc(25 * MiB)  # the 30 MiB block is still there
    assert m.segment_count == 2


def test_max_split_size_keeps_oversize_blocks_for_large_requests() -> None:
    plain = AllocatorModel()
    limited = AllocatorModel(max_split_size=64 * MiB)
    for m in (plain, limited):
        m.free(m.malloc(100 * MiB))
        m.malloc(4 * MiB)
    assert plain.segment_count == 1  # splits the cached 100 MiB block
    assert limited.segment_count == 2  # may not: a new 20 MiB segment
    assert limited.reserved_bytes == 120 * MiB


def test_max_split_size_refuses_oversize_blocks_much_larger_than_the_request() -> None:
    m = AllocatorModel(max_split_size=64 * MiB)
    m.free(m.malloc(200 * MiB))
    m.malloc(100 * MiB)  # 200 >= 100 + 20 MiB: not taken
    assert m.segment_count == 2
    m2 = AllocatorModel(max_split_size=64 * MiB)
    m2.free(m2.malloc(110 * MiB))
    m2.malloc(100 * MiB)  # 110 < 100 + 20 MiB: taken whole (no split at or above the limit)
    assert m2.segment_count == 1
    assert m2.allocated_bytes == 110 * MiB


def test_max_split_size_must_exceed_20mib() -> None:
    with pytest.raises(ConfigError, match="more than 20 MiB"):
        AllocatorModel(max_split_size=20 * MiB)


def test_expandable_segments_grow_one_segment_per_pool_in_pages() -> None:
    m = AllocatorModel(expandable_segments=True)
    m.malloc(3 * MiB)
    assert m.reserved_bytes == 20 * MiB  # one 20 MiB page of the large pool
    m.malloc(18 * MiB)  # the free 17 MiB tail plus one more page
    assert m.reserved_bytes == 40 * MiB
    assert m.allocated_bytes == 21 * MiB
    m.malloc(1000)
    assert m.reserved_bytes == 42 * MiB  # one 2 MiB page of the small pool
    assert m.segment_count == 2


def test_expandable_segments_prefer_a_fitting_hole_to_the_growable_tail() -> None:
    m = AllocatorModel(expandable_segments=True)
    a = m.malloc(4 * MiB)
    m.malloc(4 * MiB)  # tail: 12 MiB free
    m.free(a)  # a 4 MiB hole at the start
    m.malloc(4 * MiB)
    assert m.reserved_bytes == 20 * MiB
    m.malloc(12 * MiB)  # exactly the tail
    assert m.reserved_bytes == 20 * MiB
    assert m.allocated_bytes == 20 * MiB


def test_expandable_segments_merge_freed_space_that_fresh_segments_keep_apart() -> None:
    plain, exp = AllocatorModel(), AllocatorModel(expandable_segments=True)
    for m in (plain, exp):
        a = m.malloc(12 * MiB)
        b = m.malloc(12 * MiB)
        m.free(a)
        m.free(b)
        m.malloc(20 * MiB)
    # Plain: two cached 12 MiB segments, neither holds 20 MiB -> a third segment.
    assert plain.reserved_bytes == (12 + 12 + 20) * MiB
    assert plain.segment_count == 3
    # Expandable: 2 pages mapped; the freed blocks merge into one 40 MiB block.
    assert exp.reserved_bytes == 40 * MiB
    assert exp.segment_count == 1


def test_double_free_is_an_error() -> None:
    m = AllocatorModel()
    h = m.malloc(10)
    m.free(h)
    with pytest.raises(ConfigError, match="already freed"):
        m.free(h)


def test_peaks_stay_after_frees() -> None:
    m = AllocatorModel()
    handles = [m.malloc(3 * MiB) for _ in range(3)]
    for h in handles:
        m.free(h)
    assert m.allocated_bytes == 0
    assert m.peak_allocated_bytes == 9 * MiB
    assert m.peak_reserved_bytes == m.reserved_bytes == 20 * MiB


def test_a_block_freed_on_one_stream_is_not_reused_on_another() -> None:
    m = AllocatorModel()
    a = m.malloc(4 * MiB, stream=1)
    m.free(a)
    m.malloc(4 * MiB, stream=2)  # stream 1's cached 20 MiB segment does not serve stream 2
    assert m.segment_count == 2
    assert m.reserved_bytes == 40 * MiB
    m.malloc(4 * MiB, stream=1)  # but it serves stream 1 again
    assert m.segment_count == 2


def test_at_the_limit_cached_segments_go_back_before_an_out_of_memory() -> None:
    m = AllocatorModel(limit_bytes=44 * MiB)
    a = m.malloc(12 * MiB)  # segment of 12 MiB
    b = m.malloc(12 * MiB)  # another 12 MiB: 24 MiB reserved
    m.free(a)
    m.free(b)  # both cached, whole: reserved stays 24 MiB
    assert m.reserved_bytes == 24 * MiB
    m.malloc(30 * MiB)  # 24 + 30 > 44: both cached segments are given back, then it fits
    assert m.reserved_bytes == 30 * MiB
    assert m.peak_reserved_bytes == 30 * MiB
    assert m.num_segment_frees == 2 and m.num_alloc_retries == 1
    with pytest.raises(OutOfMemory, match="cannot fit") as info:
        m.malloc(16 * MiB)  # 30 + 16 > 44 and nothing cached is whole: out of memory
    assert info.value.requested_bytes == 16 * MiB


def test_a_split_segment_is_not_given_back() -> None:
    m = AllocatorModel()
    keep = m.malloc(3 * MiB)  # splits a 20 MiB segment
    m.free(m.malloc(3 * MiB))
    m.empty_cache()
    assert m.reserved_bytes == 20 * MiB  # in use by `keep`
    m.free(keep)
    m.empty_cache()
    assert m.reserved_bytes == 0


def test_with_max_split_size_an_oversize_segment_goes_back_first() -> None:
    m = AllocatorModel(max_split_size=32 * MiB, limit_bytes=70 * MiB)
    big = m.malloc(40 * MiB)  # oversize: its own 40 MiB segment, never split
    mid = m.malloc(12 * MiB)  # a 12 MiB segment: 52 MiB reserved
    m.free(big)
    m.free(mid)
    # 24 MiB may not take the cached oversize block; a new 24 MiB segment would make 76 > 70:
    # release_available_cached_blocks gives back the oversize one (>= max_split_size) only.
    m.malloc(24 * MiB)
    assert m.reserved_bytes == 12 * MiB + 24 * MiB
    assert m.num_segment_frees == 1


def test_when_oversize_segments_do_not_free_enough_every_cached_segment_goes() -> None:
    m = AllocatorModel(max_split_size=32 * MiB, limit_bytes=100 * MiB)
    big = m.malloc(40 * MiB)
    small = m.malloc(3 * MiB)  # a 20 MiB segment
    m.free(big)
    m.free(small)
    # 60 MiB: 60 + 60 > 100. The 40 MiB oversize segment is released but is less than 60,
    # so (as in PyTorch) the next step gives back every cached unsplit segment.
    m.malloc(60 * MiB)
    assert m.reserved_bytes == 60 * MiB
    assert m.num_segment_frees == 2


def test_expandable_segments_unmap_their_free_tail_pages() -> None:
    m = AllocatorModel(expandable_segments=True)
    a = m.malloc(30 * MiB)  # maps two 20 MiB pages
    b = m.malloc(5 * MiB)  # fits in the mapped 40 MiB
    assert m.reserved_bytes == 40 * MiB
    m.free(b)
    m.empty_cache()  # the free tail [30, 40) MiB holds no whole page
    assert m.reserved_bytes == 40 * MiB
    m.free(a)
    m.empty_cache()
    assert m.reserved_bytes == 0
    m.malloc(2 * MiB)  # maps a large-pool page again
    assert m.reserved_bytes == 20 * MiB


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.booleans(), st.integers(min_value=1, max_value=40 * MiB)),
        min_size=1,
        max_size=60,
    ),
    expandable=st.booleans(),
)
def test_invariants_hold_for_any_sequence(ops: list[tuple[bool, int]], expandable: bool) -> None:
    m = AllocatorModel(expandable_segments=expandable)
    live: list[int] = []
    last_reserved = 0
    for is_free, n in ops:
        if is_free and live:
            m.free(live.pop(n % len(live)))
        else:
            live.append(m.malloc(n))
        assert 0 <= m.allocated_bytes <= m.reserved_bytes
        assert m.reserved_bytes >= last_reserved  # nothing is returned without empty_cache
        last_reserved = m.reserved_bytes
    for h in live:
        m.free(h)
    assert m.allocated_bytes == 0
    assert m.peak_allocated_bytes <= m.peak_reserved_bytes
