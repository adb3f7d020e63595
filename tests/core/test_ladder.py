"""The pure out-of-memory ladder every guard climbs (memfit.core.ladder)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memfit.core import ladder
from memfit.errors import ConfigError


def _climb(config: ladder.LadderConfig, state: ladder.LadderState, n: int, fails: int) -> list:
    """Actions for one point of a batch that fails ``fails`` times in a row."""
    actions = []
    splits, failures, split_here = ladder.first_splits(config, state, n), 0, False
    for _ in range(fails):
        failures += 1
        size = -(-n // splits)
        state, action = ladder.on_oom(
            config, state, n=n, splits=splits, size=size, failures=failures, split_here=split_here
        )
        actions.append(action)
        if isinstance(action, ladder.Split):
            splits, failures, split_here = action.splits, 0, True
        elif isinstance(action, ladder.GiveUp):
            break
    return actions


def test_a_fresh_size_is_retried_once_then_split_then_split_again_without_retry() -> None:
    actions = _climb(ladder.LadderConfig(max_splits=4), ladder.LadderState(), 8, 10)
    assert actions == [
        ladder.Retry(transient=False),
        ladder.Split(2),
        ladder.Split(4),
        ladder.GiveUp(smallest=2),
    ]


def test_a_proven_size_gets_transient_retries_before_splitting() -> None:
    state = ladder.on_fit(ladder.LadderState(), 8)
    actions = _climb(ladder.LadderConfig(), state, 8, 5)
    assert actions[:3] == [ladder.Retry(transient=True)] * 3
    assert actions[3] == ladder.Split(2)


def test_the_retry_budget_follows_the_cured_failure_rate() -> None:
    config = ladder.LadderConfig()
    state = ladder.LadderState()
    assert ladder.transient_budget(config, state) == 3
    for _ in range(40):  # half of all attempts failed once and a retry cured them
        state = ladder.on_fit(state, 8, failures=1)
    assert ladder.transient_budget(config, state) == 10
    quiet = state
    for _ in range(400):  # hundreds of clean steps: the memory of those failures fades
        quiet, _ = ladder.end_step(config, ladder.on_fit(quiet, 8), splits=1, split_further=False)
    assert ladder.transient_budget(config, quiet) == 3


def test_grow_back_after_clean_steps_and_reset_after_a_give_up() -> None:
    config = ladder.LadderConfig(grow_back_after=3)
    state = ladder.LadderState(splits=8)
    grown = []
    for _ in range(6):
        state, grow = ladder.end_step(config, state, splits=state.splits, split_further=False)
        grown.append(grow)
    assert grown[2] == ladder.GrowBack(4, 8) and grown[5] == ladder.GrowBack(2, 4)
    assert ladder.after_give_up(ladder.LadderState(splits=64, completed=64)).splits == 32
    assert ladder.after_give_up(ladder.LadderState(splits=4, completed=1)).splits == 1


def test_divisor_ladders_keep_one_chunk_shape() -> None:
    config = ladder.LadderConfig(divisors=True, max_splits=6)
    assert ladder.next_splits(config, 1, 12) == 2
    assert ladder.next_splits(config, 4, 12) == 6
    assert ladder.next_splits(config, 6, 12) is None  # 12 is over max_splits
    assert ladder.first_splits(config, ladder.LadderState(splits=5), 12) == 6


def test_bad_settings_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="max_splits"):
        ladder.LadderConfig(max_splits=0)
    with pytest.raises(ConfigError, match="transient_retries"):
        ladder.LadderConfig(transient_retries=-1)


@given(
    n=st.integers(1, 500),
    splits=st.integers(1, 64),
    max_splits=st.integers(1, 64),
    fits=st.integers(0, 500),
    failures=st.integers(1, 30),
    divisors=st.booleans(),
    split_here=st.booleans(),
)
def test_every_action_is_a_legal_move(
    n: int,
    splits: int,
    max_splits: int,
    fits: int,
    failures: int,
    divisors: bool,
    split_here: bool,
) -> None:
    config = ladder.LadderConfig(max_splits=max_splits, divisors=divisors)
    state = ladder.LadderState(fits=fits)
    splits = min(splits, n, max_splits)
    size = -(-n // splits)
    _, action = ladder.on_oom(
        config, state, n=n, splits=splits, size=size, failures=failures, split_here=split_here
    )
    budget = ladder.transient_budget(config, state) if size <= fits else 1
    if isinstance(action, ladder.Split):
        assert splits < action.splits <= min(max_splits, n)
        assert not divisors or n % action.splits == 0
    elif isinstance(action, ladder.GiveUp):
        assert ladder.next_splits(config, splits, n) is None or size == 1
    else:
        assert failures <= budget
    assert config.transient_retries <= ladder.transient_budget(config, state) <= config.max_retries
