"""The pure leak detector on synthetic series: planted leaks found, noise left alone."""

from __future__ import annotations

import random

import pytest

from memfit.errors import ConfigError
from memfit.monitor._leaks import check_fragmentation, detect_leak, theil_sen

MiB = 2**20
GiB = 2**30


def _noisy(seed: int, kind: str, n: int = 400) -> list[float]:
    rng = random.Random(seed)
    out = []
    for s in range(n):
        value = float(GiB)
        if kind == "gauss":
            value += rng.gauss(0, 4 * MiB)
        elif kind == "uniform":
            value += rng.randrange(0, 8 * MiB)
        elif kind == "jump":  # a cache that grows once, halfway
            value += (64 * MiB if s > n // 2 else 0) + rng.gauss(0, 2 * MiB)
        elif kind == "warmup":  # optimizer state created over the first steps
            value += min(s, 20) * 8 * MiB + rng.gauss(0, 2 * MiB)
        elif kind == "spikes":  # rare large temporaries
            value += (rng.random() < 0.05) * rng.randrange(0, 200 * MiB)
        elif kind == "sawtooth":  # grows and is emptied every 50 steps
            value += (s % 50) * MiB
        else:
            raise ValueError(kind)
        out.append(value)
    return out


@pytest.mark.parametrize("kind", ["gauss", "uniform", "jump", "warmup", "spikes", "sawtooth"])
def test_twenty_seeded_noisy_series_raise_no_alarm(kind: str) -> None:
    alarms = [seed for seed in range(20) if detect_leak(range(400), _noisy(seed, kind))]
    assert alarms == []


@pytest.mark.parametrize("seed", range(10))
def test_planted_leak_after_a_flat_start_is_found_with_its_slope(seed: int) -> None:
    rng = random.Random(seed)
    rate = 64 * 1024
    values = [GiB + max(0, s - 150) * rate + rng.gauss(0, 256 * 1024) for s in range(400)]
    leak = detect_leak(range(400), values, limit_bytes=4 * GiB)
    assert leak is not None
    assert leak.bytes_per_step == pytest.approx(rate, rel=0.10)
    assert leak.lower_bytes_per_step <= rate <= leak.upper_bytes_per_step * 1.05
    assert 120 <= leak.start_step <= 180
    assert leak.last_step == 399


def test_projected_oom_step_of_an_exact_line() -> None:
    steps = list(range(100))
    values = [GiB + MiB * s for s in steps]
    leak = detect_leak(steps, values, limit_bytes=2 * GiB)
    assert leak is not None
    assert leak.bytes_per_step == pytest.approx(MiB)
    # 1 GiB + 1 MiB * step reaches 2 GiB at step 1024
    assert leak.projected_oom_step == 1024
    assert leak.current_bytes == GiB + 99 * MiB
    assert "1024" in leak.describe()
    assert leak.to_dict()["projected_oom_step"] == 1024


def test_no_limit_means_no_projection() -> None:
    leak = detect_leak(range(100), [GiB + MiB * s for s in range(100)])
    assert leak is not None
    assert leak.projected_oom_step is None
    assert leak.limit_bytes is None


def test_already_over_the_limit_projects_the_last_step() -> None:
    leak = detect_leak(range(100), [GiB + MiB * s for s in range(100)], limit_bytes=GiB)
    assert leak is not None
    assert leak.projected_oom_step == 99


def test_growth_below_the_minimum_size_is_not_a_leak() -> None:
    # 1 KiB per step over 100 steps: 100 KiB, below the 1 MiB floor
    values = [GiB + 1024 * s for s in range(100)]
    assert detect_leak(range(100), values) is None
    assert detect_leak(range(100), values, min_growth_bytes=64 * 1024) is not None


def test_shrinking_and_flat_series_are_not_leaks() -> None:
    assert detect_leak(range(100), [GiB - MiB * s for s in range(100)]) is None
    assert detect_leak(range(100), [GiB] * 100) is None


def test_too_few_points_and_missing_values() -> None:
    assert detect_leak(range(10), [GiB + MiB * s for s in range(10)]) is None
    steps: list[int | None] = [*range(60), None]
    values: list[int | float | None] = [GiB + MiB * s if s % 3 else None for s in range(60)]
    values.append(5 * GiB)
    leak = detect_leak(steps, values)
    assert leak is not None
    assert leak.bytes_per_step == pytest.approx(MiB)
    assert leak.samples == 40


def test_repeated_steps_keep_the_last_reading() -> None:
    steps = [s // 2 for s in range(200)]
    values = [GiB + (MiB * (s // 2) if s % 2 else 0) for s in range(200)]
    leak = detect_leak(steps, values)
    assert leak is not None
    assert leak.bytes_per_step == pytest.approx(MiB)


def test_many_points_are_thinned_but_the_slope_holds() -> None:
    steps = list(range(0, 50_000, 5))
    leak = detect_leak(steps, [GiB + 100 * s for s in steps], max_points=64)
    assert leak is not None
    assert leak.bytes_per_step == pytest.approx(100)
    assert leak.samples <= 64


def test_bad_settings_raise_config_errors() -> None:
    with pytest.raises(ConfigError, match="differ in length"):
        detect_leak([1, 2], [1])
    with pytest.raises(ConfigError, match="min_samples"):
        detect_leak(range(10), range(10), min_samples=3)
    with pytest.raises(ConfigError, match="max_points"):
        detect_leak(range(10), range(10), max_points=10)
    with pytest.raises(ConfigError, match="confidence"):
        detect_leak(range(10), range(10), confidence=1.5)


def test_theil_sen_ignores_an_outlier_and_brackets_the_slope() -> None:
    xs = list(range(30))
    ys = [3.0 * x + 7 for x in xs]
    ys[10] = 1e9
    slope, lower, upper, intercept = theil_sen(xs, ys)
    assert slope == pytest.approx(3.0)
    assert lower <= 3.0 <= upper
    assert intercept == pytest.approx(7.0)


def test_theil_sen_interval_covers_the_true_slope_most_of_the_time() -> None:
    covered = 0
    for seed in range(100):
        rng = random.Random(seed)
        xs = list(range(40))
        ys = [2.0 * x + rng.gauss(0, 5) for x in xs]
        _, lower, upper, _ = theil_sen(xs, ys, confidence=0.9)
        covered += lower <= 2.0 <= upper
    assert covered >= 80  # 90% nominal


def test_theil_sen_rejects_degenerate_input() -> None:
    with pytest.raises(ConfigError, match="two points"):
        theil_sen([1, 1, 1], [1, 2, 3])
    with pytest.raises(ConfigError, match="length"):
        theil_sen([1, 2], [1])
    with pytest.raises(ConfigError, match="confidence"):
        theil_sen([1, 2], [1, 2], confidence=0)


def test_fragmentation_compares_reserved_with_the_peak() -> None:
    caching = {
        "step": 5,
        "allocated_bytes": GiB,
        "peak_allocated_bytes": 3 * GiB,
        "reserved_bytes": 3 * GiB + 100 * MiB,
    }
    assert check_fragmentation(caching) is None  # reserve matches the step's peak
    fragmented = {
        "step": 6,
        "allocated_bytes": GiB,
        "peak_allocated_bytes": 2 * GiB,
        "reserved_bytes": 5 * GiB,
    }
    frag = check_fragmentation(fragmented)
    assert frag is not None
    assert frag.slack_bytes == 3 * GiB
    assert frag.fraction == pytest.approx(0.6)
    assert "expandable_segments" in frag.describe()
    assert check_fragmentation({"reserved_bytes": None, "allocated_bytes": 1}) is None
