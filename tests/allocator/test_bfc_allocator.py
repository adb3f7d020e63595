"""The BFC allocator model (``memfit.allocator.bfc``) against tsl's rules and its own
invariants, under random sequences of requests and frees."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memfit.allocator.bfc import BfcAllocator, round_up
from memfit.errors import ConfigError, OutOfMemory

MiB = 2**20


def _check_invariants(pool: BfcAllocator) -> None:
    in_use = 0
    for region in pool._regions:
        address = region.chunks[0].address
        for before, chunk in zip([None, *region.chunks], region.chunks, strict=False):
            assert chunk.address == address, "the chunks of a region tile it"
            assert chunk.size > 0
            address += chunk.size
            if before is not None:
                assert not (before.owner is None and chunk.owner is None), "free chunks merge"
            if chunk.owner is not None:
                in_use += chunk.size
    assert in_use == pool.bytes_in_use
    assert pool.peak_bytes_in_use >= pool.bytes_in_use
    assert pool.pool_bytes == sum(sum(c.size for c in r.chunks) for r in pool._regions)
    assert pool.pool_bytes <= pool.limit_bytes


def test_a_chunk_under_twice_the_request_is_handed_out_whole() -> None:
    pool = BfcAllocator(1024 * MiB, preallocate=True)
    a = pool.allocate(40 * MiB)
    pool.allocate(MiB)  # keeps the hole from merging with the pool's free tail
    pool.free(a)
    pool.allocate(21 * MiB)  # 40 < 2 x 21: whole
    assert pool.bytes_in_use == 41 * MiB
    b = pool.allocate(5 * MiB)  # the tail: split
    assert pool.bytes_in_use == 46 * MiB
    pool.free(b)
    assert pool.bytes_in_use == 41 * MiB


def test_a_chunk_is_split_when_128_mib_or_more_would_be_left() -> None:
    pool = BfcAllocator(4096 * MiB, preallocate=True)
    a = pool.allocate(300 * MiB)
    pool.allocate(MiB)
    pool.free(a)
    pool.allocate(170 * MiB)  # 300 < 2 x 170, but 130 MiB would be left: split
    assert pool.bytes_in_use == 171 * MiB


def test_the_smallest_fitting_chunk_is_taken() -> None:
    pool = BfcAllocator(1024 * MiB, preallocate=True)
    big, _, small, _ = (pool.allocate(n * MiB) for n in (30, 1, 12, 1))
    pool.free(big)
    pool.free(small)
    pool.allocate(10 * MiB)  # the 12 MiB hole, whole
    assert pool.bytes_in_use == 14 * MiB


def test_a_growing_pool_doubles_its_regions() -> None:
    pool = BfcAllocator(1 << 40, preallocate=False)
    pool.allocate(MiB)
    assert pool.pool_bytes == 2 * MiB
    pool.allocate(2 * MiB)  # no room in the first: a 4 MiB region
    assert pool.pool_bytes == 6 * MiB
    pool.allocate(9 * MiB)  # doubled past 8 MiB to 16 MiB, and not again after
    assert pool.pool_bytes == 22 * MiB
    pool.allocate(17 * MiB)  # 16 MiB would not fit: 32 MiB
    assert pool.pool_bytes == 54 * MiB
    # the first two regions split (at least twice the request), the last two whole
    assert pool.bytes_in_use == (1 + 2 + 16 + 32) * MiB


def test_a_preallocated_pool_is_one_region_of_the_limit() -> None:
    pool = BfcAllocator(3000 * MiB, preallocate=True)
    pool.allocate(1)
    assert pool.pool_bytes == 3000 * MiB and pool.bytes_in_use == 256


def test_out_of_memory_and_bad_input() -> None:
    pool = BfcAllocator(64 * MiB, preallocate=False)
    pool.allocate(40 * MiB)
    with pytest.raises(OutOfMemory):
        pool.allocate(30 * MiB)
    with pytest.raises(ConfigError) as err:
        pool.free(12345)
    assert err.value.key_path == "ident"
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigError) as err:
            BfcAllocator(bad, preallocate=True)  # type: ignore[arg-type]
        assert err.value.key_path == "limit_bytes"


def test_round_up() -> None:
    assert [round_up(n) for n in (0, 1, 255, 256, 257, 513)] == [256, 256, 256, 256, 512, 768]


@settings(max_examples=150, deadline=None)
@given(
    preallocate=st.booleans(),
    steps=st.lists(
        st.tuples(st.booleans(), st.integers(1, 64 * MiB), st.integers(0, 1000)),
        min_size=1,
        max_size=60,
    ),
)
def test_random_requests_and_frees_keep_the_invariants(
    preallocate: bool, steps: list[tuple[bool, int, int]]
) -> None:
    pool = BfcAllocator(2048 * MiB, preallocate=preallocate)
    live: dict[int, int] = {}
    for is_free, size, pick in steps:
        if is_free and live:
            ident = sorted(live)[pick % len(live)]
            pool.free(ident)
            del live[ident]
        else:
            live[pool.allocate(size)] = size
        _check_invariants(pool)
        # a request holds its rounded bytes, or a whole chunk under twice them
        assert pool.bytes_in_use >= sum(round_up(n) for n in live.values())
        assert pool.bytes_in_use < sum(2 * round_up(n) for n in live.values()) + 1
    for ident in list(live):
        pool.free(ident)
    _check_invariants(pool)
    assert pool.bytes_in_use == 0
    assert all(len(region.chunks) == 1 for region in pool._regions), "all merged back"
