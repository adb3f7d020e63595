"""When the traced batch sizes cannot give the batch's slope (issue 32), read from the traced
allocation sequence as lines ``A + B * batch``."""

from __future__ import annotations

from memfit.cli.estimate import _gradients_note
from memfit.estimate.torch._sequence import SequenceModel
from memfit.estimate.torch._slope import MAX_TRACE_AT, check_slope

KiB = 2**10


def _model(events: list[tuple[bool, int, float, float]]) -> SequenceModel:
    return SequenceModel(
        allocs=tuple(e[0] for e in events),
        records=tuple(e[1] for e in events),
        intercepts=tuple(e[2] for e in events),
        slopes=tuple(e[3] for e in events),
    )


# weights 1 MiB; forward keeps 8 KiB per item, freed before an optimizer step whose
# temporaries (2 MiB) do not depend on the batch
STEP = _model([
    (True, 0, 1024 * KiB, 0.0),     # weights
    (True, 1, 0.0, 8 * KiB),        # activations: 8 KiB per item
    (False, 1, 0.0, 8 * KiB),
    (True, 2, 2048 * KiB, 0.0),     # the optimizer's temporaries
    (False, 2, 2048 * KiB, 0.0),
])  # fmt: skip


def test_a_flat_range_says_what_an_item_costs_and_where_to_trace() -> None:
    found = check_slope(STEP, [8, 16], 0.0)
    assert found is not None and found.per_item_bytes == 8 * KiB
    assert found.from_value == 256  # 1 MiB + 2 MiB = 1 MiB + 8 KiB * n at n = 256
    assert found.trace_at() == [512, 1024]
    assert "8.00 KiB" in found.text("batch_size") and "~ 256" in found.text("batch_size")
    assert check_slope(STEP, [512, 1024], 8 * KiB) is None  # past it: the line is the slope
    assert check_slope(None, [8, 16], 0.0) is None


def test_too_far_to_trace_is_said_not_traced() -> None:
    far = _model([
        (True, 0, 0.0, 1.0),                   # 1 B per item
        (False, 0, 0.0, 1.0),
        (True, 1, float(MAX_TRACE_AT) * 4, 0.0),  # a constant peak far above
    ])  # fmt: skip
    found = check_slope(far, [8, 16], 0.0)
    assert found is not None and found.trace_at() is None


def test_gradients_below_the_parameters_are_explained() -> None:
    point = {"breakdown": {"parameters": 1300 * KiB, "gradients": 20 * KiB}}
    note = _gradients_note(point)
    assert note is not None and "before the backward pass has made the rest" in note
    assert _gradients_note({"breakdown": {"parameters": 10, "gradients": 10}}) is None
    assert _gradients_note({"breakdown": {"parameters": 0, "gradients": 0}}) is None
