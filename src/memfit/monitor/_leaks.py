"""Leaks and fragmentation in a run's samples: pure functions, no device.

Leaks are found by :func:`detect_leak`, a pure function over ``(step, bytes)`` points: a
flat-then-growing (hinge) fit picks where growth starts, a Theil-Sen slope with Sen's
distribution-free confidence interval says whether it grows at all, and a minimum size (an
absolute floor and a multiple of the noise) plus a steadiness test over four quarters keep noise
and one-off jumps from raising an alarm.

>>> steps = list(range(200))
>>> leak = detect_leak(steps, [2**30 + 65536 * s for s in steps])
>>> round(leak.bytes_per_step), leak.start_step
(65536, 0)
>>> detect_leak(steps, [2**30 + (s % 7) * 4096 for s in steps]) is None
True
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memfit._plain import plain_fields
from memfit.errors import ConfigError
from memfit.units import MiB, format_bytes

__all__ = ["Leak", "UnusedReserve", "check_fragmentation", "detect_leak", "theil_sen"]


# -- leak detection (pure) ------------------------------------------------------------------


@dataclass(frozen=True)
class Leak:
    """Steady memory growth found in a run.

    Attributes:
        metric: The sample field that grows (``"allocated_bytes"``, ``"device_used_bytes"``).
        bytes_per_step: Growth rate (Theil-Sen slope), bytes per step.
        lower_bytes_per_step: Lower end of the confidence interval of the rate.
        upper_bytes_per_step: Upper end of the confidence interval of the rate.
        confidence: The interval's confidence level (``0.99``).
        start_step: First step of the growing stretch.
        last_step: Last step looked at.
        samples: Number of points in the growing stretch.
        growth_bytes: Growth over the stretch at the fitted rate.
        noise_bytes: Robust spread of the points around the fitted line (scaled MAD).
        current_bytes: Fitted value of the metric at ``last_step``.
        limit_bytes: The budget (or, without one, the device total) the growth runs into,
            or ``None`` when unknown.
        projected_oom_step: The step at which the fitted line reaches ``limit_bytes``, or
            ``None`` when there is no limit.
    """

    metric: str
    bytes_per_step: float
    lower_bytes_per_step: float
    upper_bytes_per_step: float
    confidence: float
    start_step: int
    last_step: int
    samples: int
    growth_bytes: int
    noise_bytes: int
    current_bytes: int
    limit_bytes: int | None
    projected_oom_step: int | None

    def describe(self) -> str:
        """One human line: what grows, how fast, since when, and when it would run out."""
        name = self.metric.removesuffix("_bytes").replace("_", " ")
        text = (
            f"possible memory leak: {name} grows {format_bytes(self.bytes_per_step)}/step "
            f"since step {self.start_step} ({self.confidence:.0%} interval "
            f"{format_bytes(self.lower_bytes_per_step)} to "
            f"{format_bytes(self.upper_bytes_per_step)}/step, "
            f"+{format_bytes(self.growth_bytes)} over {self.samples} samples)"
        )
        if self.projected_oom_step is not None and self.limit_bytes is not None:
            text += (
                f"; at this rate it reaches {format_bytes(self.limit_bytes)} "
                f"around step {self.projected_oom_step}"
            )
        return text

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON."""
        return plain_fields(self)


def theil_sen(
    xs: Sequence[float], ys: Sequence[float], *, confidence: float = 0.99
) -> tuple[float, float, float, float]:
    """Theil-Sen line through the points, with Sen's confidence interval of the slope.

    The slope is the median of the slopes between all pairs of points with different ``x``;
    the interval takes the order statistics of those pairwise slopes given by the normal
    approximation of Kendall's S (Sen 1968), so it holds without assuming Gaussian noise.

    Args:
        xs: The x values (steps). At least two must differ.
        ys: The y values (bytes), as many as ``xs``.
        confidence: Two-sided confidence level of the interval, in ``(0, 1)``.

    Returns:
        ``(slope, lower, upper, intercept)``; the intercept is the median of
        ``y - slope * x``.

    Raises:
        ConfigError: When the lengths differ, ``confidence`` is outside ``(0, 1)``, or there
            are fewer than two distinct ``x``.

    >>> theil_sen([0, 1, 2, 3, 4], [1, 3, 5, 7, 100])[0]
    2.0
    """
    if len(xs) != len(ys):
        raise ConfigError(
            f"xs and ys differ in length ({len(xs)} and {len(ys)})", key_path="theil_sen"
        )
    if not 0.0 < confidence < 1.0:
        raise ConfigError(
            f"confidence must be in (0, 1), not {confidence!r}",
            key_path="confidence",
            hint="use a level such as 0.99",
        )
    n = len(xs)
    slopes: list[float] = []
    for i in range(n):
        xi = xs[i]
        yi = ys[i]
        for j in range(i + 1, n):
            dx = xs[j] - xi
            if dx != 0:
                slopes.append((ys[j] - yi) / dx)
    if not slopes:
        raise ConfigError(
            "a slope needs at least two points with different x", key_path="theil_sen"
        )
    slopes.sort()
    count = len(slopes)
    slope = statistics.median(slopes)
    z = statistics.NormalDist().inv_cdf(0.5 + confidence / 2.0)
    c = z * math.sqrt(n * (n - 1) * (2 * n + 5) / 18.0)
    lower_rank = math.floor((count - c) / 2.0)  # 1-based rank of the lower bound
    upper_rank = math.ceil((count + c) / 2.0) + 1
    lower = slopes[min(max(lower_rank - 1, 0), count - 1)]
    upper = slopes[min(max(upper_rank - 1, 0), count - 1)]
    intercept = statistics.median(y - slope * x for x, y in zip(xs, ys, strict=True))
    return slope, lower, upper, intercept


def _thin(points: Sequence[tuple[int, float]], max_points: int) -> list[tuple[int, float]]:
    """At most ``max_points`` of ``points``, evenly spaced by index, the last one kept."""
    n = len(points)
    if n <= max_points:
        return list(points)
    stride = (n - 1) / (max_points - 1)
    return [points[round(i * stride)] for i in range(max_points)]


def _hinge_start(points: Sequence[tuple[int, float]], min_stretch: int) -> int:
    """Index where a flat-then-linear fit of ``points`` bends (least squares, every knot).

    For a knot at ``x_k`` the model is ``y = a + b * max(0, x - x_k)``; its residual sum of
    squares is ``Syy - Sxy**2 / Sxx`` of the hinged ``x``. Suffix sums make each knot O(1).
    Only knots that leave at least ``min_stretch`` points after them are tried.
    """
    n = len(points)
    last = n - min_stretch
    if last <= 0:
        return 0
    mean_y = sum(p[1] for p in points) / n
    xs = [float(p[0]) for p in points]
    ys = [p[1] - mean_y for p in points]
    syy = sum(y * y for y in ys)
    # suffix sums of x, x**2, x*y and y from index k to the end
    s1 = [0.0] * (n + 1)
    s2 = [0.0] * (n + 1)
    sxy = [0.0] * (n + 1)
    sy = [0.0] * (n + 1)
    for i in range(n - 1, -1, -1):
        s1[i] = s1[i + 1] + xs[i]
        s2[i] = s2[i + 1] + xs[i] * xs[i]
        sxy[i] = sxy[i + 1] + xs[i] * ys[i]
        sy[i] = sy[i + 1] + ys[i]
    best_index, best_sse = 0, math.inf
    for k in range(last + 1):
        knot = xs[k]
        m = n - k
        sum_x = s1[k] - m * knot
        sum_xx = s2[k] - 2.0 * knot * s1[k] + m * knot * knot
        cross = sxy[k] - knot * sy[k]
        var_x = sum_xx - sum_x * sum_x / n
        if var_x <= 0.0:
            continue
        sse = syy - cross * cross / var_x
        if sse < best_sse - 1e-9 * max(syy, 1.0):
            best_index, best_sse = k, sse
    return best_index


def _ols_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ``ys`` over ``xs`` (0 when the ``xs`` do not vary)."""
    n = len(xs)
    mean_x = sum(xs) / n
    mean_y = sum(ys) / n
    sxx = sum((x - mean_x) ** 2 for x in xs)
    if sxx == 0.0:
        return 0.0
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sxx


def _is_steady(points: Sequence[tuple[int, float]], slope: float) -> bool:
    """Does the middle of each quarter of ``points`` rise with ``slope``, not in one jump?"""
    n = len(points)
    quarter = n // 4
    if quarter < 2:
        return False
    centres: list[tuple[float, float]] = []
    for q in range(4):
        chunk = points[q * quarter : (q + 1) * quarter] if q < 3 else points[3 * quarter :]
        centres.append(
            (statistics.median(p[0] for p in chunk), statistics.median(p[1] for p in chunk))
        )
    for (x0, y0), (x1, y1) in itertools.pairwise(centres):
        if y1 - y0 < 0.25 * slope * (x1 - x0):
            return False
    return True


def detect_leak(
    steps: Sequence[int | None],
    values: Sequence[int | float | None],
    *,
    metric: str = "allocated_bytes",
    limit_bytes: int | None = None,
    confidence: float = 0.99,
    min_samples: int = 16,
    min_growth_bytes: int = MiB,
    noise_multiple: float = 6.0,
    max_points: int = 128,
) -> Leak | None:
    """Find steady growth in a series of memory readings; ``None`` when there is none.

    Points with a ``None`` step or value are skipped; when a step repeats, its last reading
    counts. The test, in order:

    1. at most ``max_points`` evenly spaced points are kept (cost is quadratic in them);
    2. a flat-then-linear (hinge) least-squares fit chooses where growth starts, so growth
       that begins mid-run is measured from its start, not diluted by the flat part;
    3. from there on, the Theil-Sen slope's lower confidence bound must be above zero;
    4. the growth over the stretch must reach ``min_growth_bytes`` and ``noise_multiple``
       times the robust noise (scaled median absolute deviation around the line);
    5. each quarter of the stretch must rise by at least a quarter of what the slope says,
       so one jump (a cache that grows once) is not a leak.

    Args:
        steps: Step of each reading.
        values: Bytes of each reading.
        metric: Name of the series, carried into the result.
        limit_bytes: The budget or device size; sets :attr:`Leak.projected_oom_step`.
        confidence: Confidence level of the slope interval.
        min_samples: Fewest points a growing stretch may have.
        min_growth_bytes: Smallest growth over the stretch that counts.
        noise_multiple: Growth must also exceed this many times the noise.
        max_points: Most points used.

    Returns:
        The :class:`Leak`, or ``None``.

    Raises:
        ConfigError: When ``steps`` and ``values`` differ in length, or a setting is out of
            range (``min_samples`` < 8, ``max_points`` < ``min_samples``, ``confidence``
            outside ``(0, 1)``).
    """
    if len(steps) != len(values):
        raise ConfigError(
            f"steps and values differ in length ({len(steps)} and {len(values)})",
            key_path="detect_leak",
        )
    if min_samples < 8:
        raise ConfigError(
            f"min_samples must be at least 8, not {min_samples}", key_path="min_samples"
        )
    if max_points < min_samples:
        raise ConfigError(
            f"max_points ({max_points}) must be at least min_samples ({min_samples})",
            key_path="max_points",
        )
    if not 0.0 < confidence < 1.0:
        raise ConfigError(
            f"confidence must be in (0, 1), not {confidence!r}", key_path="confidence"
        )
    by_step: dict[int, float] = {}
    for s, v in zip(steps, values, strict=True):
        if s is None or v is None:
            continue
        if isinstance(v, float) and not math.isfinite(v):
            continue
        by_step[int(s)] = float(v)
    points = sorted(by_step.items())
    if len(points) < min_samples:
        return None
    points = _thin(points, max_points)
    start = _hinge_start(points, max(min_samples, len(points) // 4))
    stretch = points[start:]
    xs = [float(p[0]) for p in stretch]
    ys = [p[1] for p in stretch]
    if _ols_slope(xs, ys) <= 0.0:  # cheap screen: no growth at all, skip the O(n^2) part
        return None
    slope, lower, upper, intercept = theil_sen(xs, ys, confidence=confidence)
    if lower <= 0.0 or slope <= 0.0:
        return None
    residuals = [y - (intercept + slope * x) for x, y in zip(xs, ys, strict=True)]
    centre = statistics.median(residuals)
    noise = 1.4826 * statistics.median(abs(r - centre) for r in residuals)
    span = xs[-1] - xs[0]
    growth = slope * span
    if growth < min_growth_bytes or growth < noise_multiple * noise:
        return None
    if not _is_steady(stretch, slope):
        return None
    last_step = stretch[-1][0]
    current = intercept + slope * last_step
    projected: int | None = None
    if limit_bytes is not None:
        if current >= limit_bytes:
            projected = last_step
        else:
            projected = last_step + math.ceil((limit_bytes - current) / slope)
    return Leak(
        metric=metric,
        bytes_per_step=slope,
        lower_bytes_per_step=lower,
        upper_bytes_per_step=upper,
        confidence=confidence,
        start_step=stretch[0][0],
        last_step=last_step,
        samples=len(stretch),
        growth_bytes=round(growth),
        noise_bytes=round(noise),
        current_bytes=round(current),
        limit_bytes=limit_bytes,
        projected_oom_step=projected,
    )


# -- fragmentation (pure) -------------------------------------------------------------------


@dataclass(frozen=True)
class UnusedReserve:
    """The caching allocator holds far more than the tensors ever needed at once.

    Attributes:
        step: Step of the sample it was seen in, or ``None``.
        reserved_bytes: Bytes the allocator holds.
        in_use_bytes: The peak of allocated bytes (or allocated bytes when no peak is known).
        slack_bytes: ``reserved_bytes - in_use_bytes``.
        fraction: ``slack_bytes / reserved_bytes``.
    """

    step: int | None
    reserved_bytes: int
    in_use_bytes: int
    slack_bytes: int
    fraction: float

    def describe(self) -> str:
        """One human line with the suggested fix."""
        return (
            f"fragmentation: the allocator reserves {format_bytes(self.reserved_bytes)} but "
            f"tensors never used more than {format_bytes(self.in_use_bytes)} at once "
            f"({format_bytes(self.slack_bytes)}, {self.fraction:.0%} reserved but unused); "
            "set PYTORCH_ALLOC_CONF=expandable_segments:True "
            "(PYTORCH_CUDA_ALLOC_CONF on older PyTorch) before torch starts"
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON."""
        return plain_fields(self)


def check_fragmentation(
    sample: dict[str, Any],
    *,
    min_slack_bytes: int = 512 * MiB,
    min_fraction: float = 0.3,
) -> UnusedReserve | None:
    """Is reserved memory far above what the tensors needed, in this sample?

    Between steps, allocated memory is low and reserved memory stays at the step's peak: that
    is caching, not fragmentation. So the comparison is reserved against the *peak* of
    allocated memory: when the allocator holds much more than was ever in use at once, its
    blocks are fragmented (the case ``expandable_segments`` fixes).

    Args:
        sample: A Recorder sample.
        min_slack_bytes: Smallest unused reserve that counts.
        min_fraction: Smallest unused share of the reserve that counts.

    Returns:
        A :class:`UnusedReserve`, or ``None`` (also when the sample lacks the figures).
    """
    reserved = sample.get("reserved_bytes")
    in_use = sample.get("peak_allocated_bytes")
    if in_use is None:
        in_use = sample.get("allocated_bytes")
    if reserved is None or in_use is None or reserved <= 0:
        return None
    slack = int(reserved) - int(in_use)
    fraction = slack / reserved
    if slack < min_slack_bytes or fraction < min_fraction:
        return None
    step = sample.get("step")
    return UnusedReserve(
        step=step if isinstance(step, int) else None,
        reserved_bytes=int(reserved),
        in_use_bytes=int(in_use),
        slack_bytes=slack,
        fraction=fraction,
    )
