"""Issue 22: YAML merge keys load as YAML allows; base-60 numbers are refused; an error inside
a variant points at the variant's line."""

from __future__ import annotations

import pytest

from memfit.core.workload import parse_workload
from memfit.errors import ConfigError

BASE = """family: custom
terms: {a: 'n * 1048576'}
knobs:
  n: &knob {min: 1, max: 8, default: 2}
"""


def test_merge_keys_load_and_explicit_keys_override() -> None:
    w = parse_workload(BASE + "  m:\n    <<: *knob\n    default: 4\nobjective: n\n")
    assert (w.knobs["m"].min, w.knobs["m"].max, w.knobs["m"].default) == (1, 8, 4)
    flow = parse_workload(BASE + "  m: {<<: *knob, max: 4}\n")
    assert (flow.knobs["m"].max, flow.knobs["m"].default) == (4, 2)


def test_a_key_given_twice_is_still_refused() -> None:
    with pytest.raises(ConfigError, match="duplicate key 'default'"):
        parse_workload(BASE + "  m: {<<: *knob, default: 4, default: 5}\n")


@pytest.mark.parametrize("value", ["1:30", "1:30:00", "1:30.5"])
def test_base_60_numbers_are_refused(value: str) -> None:
    text = f"family: custom\nterms: {{a: 'n * 1048576'}}\nsettings: {{t: {value}}}\n"
    with pytest.raises(ConfigError, match="base-60") as info:
        parse_workload(text + "knobs:\n  n: {min: 1, max: 8, default: 2}\n")
    assert info.value.key_path is not None and info.value.key_path.endswith(":3:15")
    assert "quote" in (info.value.hint or "")


def test_ordinary_numbers_still_load() -> None:
    w = parse_workload(BASE + "settings: {t: 90, big: 1_000}\n")
    assert w.settings == {"t": 90, "big": 1000}


def test_an_error_inside_a_variant_points_at_its_line() -> None:
    text = BASE + "variants:\n  big:\n    knobs:\n      n: {min: one}\n"
    with pytest.raises(ConfigError) as info:
        parse_workload(text, source="w.yaml", variant="big")
    assert "(w.yaml:8:" in info.value.message and "in variant 'big'" in info.value.message
    # the same error in the base points at the base's line
    with pytest.raises(ConfigError) as info:
        parse_workload(BASE.replace("min: 1,", "min: one,"), source="w.yaml")
    assert "(w.yaml:4:" in info.value.message and "variant" not in info.value.message
