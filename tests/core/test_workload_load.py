"""Loading and validating workload files: bundled names, variants, and every kind of mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from memfit.core.workload import (
    KnobSpec,
    Workload,
    bundled_names,
    load_workload,
    parse_workload,
)
from memfit.errors import ConfigError

MINIMAL = """\
name: tiny
family: custom
terms:
  weights: 1MiB
  buffer: "num_envs * 1024"
knobs:
  num_envs: {min: 1, max: 64, powers_of_two: true, default: 8}
"""


def write(tmp_path: Path, text: str, name: str = "w.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_bundled_names_cover_the_three_reference_workloads() -> None:
    names = bundled_names()
    assert any("ppo" in n for n in names)
    assert any("dqn" in n for n in names)
    assert any("act" in n for n in names)
    assert {"brax_humanoid_ppo@quick", "brax_humanoid_ppo@production"} <= set(names)
    for name in names:
        assert isinstance(load_workload(name), Workload)


def test_variant_overrides_the_base_document() -> None:
    base = load_workload("brax_humanoid_ppo")
    quick = load_workload("brax_humanoid_ppo@quick")
    production = load_workload("brax_humanoid_ppo", variant="production")
    assert quick.name == "brax_humanoid_ppo@quick"
    assert quick.knobs["num_envs"].max == 1024
    assert base.knobs["num_envs"].max == 65536
    assert production.knobs["num_envs"].max == 131072
    # untouched parts of the base document stay
    assert quick.networks == base.networks


def test_unknown_variant_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="unknown variant 'nightly'") as info:
        load_workload("brax_humanoid_ppo@nightly")
    assert info.value.hint is not None and "quick" in info.value.hint


def test_unknown_bundled_name_suggests_the_nearest() -> None:
    with pytest.raises(ConfigError, match="no workload file") as info:
        load_workload("dqn_fire_rastr")
    assert info.value.hint == "did you mean 'dqn_fire_raster'?"


def test_loads_a_file_and_parses_sizes(tmp_path: Path) -> None:
    w = load_workload(write(tmp_path, MINIMAL + "env_state_bytes: 64KiB\n"))
    assert w.name == "tiny"
    assert w.env_state_bytes == 64 * 1024
    assert w.default_values() == {"num_envs": 8}
    assert w.source is not None and w.source.endswith("w.yaml")


def test_yaml_syntax_error_gives_file_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, "name: x\nfamily: custom\nknobs:\n  a: {min: 1, max: 4\n")
    with pytest.raises(ConfigError, match="YAML syntax error") as info:
        load_workload(path)
    assert info.value.key_path is not None
    file, line, column = info.value.key_path.rsplit(":", 2)
    assert file == str(path)
    assert int(line) >= 4 and int(column) >= 1


def test_unknown_top_level_key_suggests_the_right_one(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "precison: bf16\n")
    with pytest.raises(ConfigError, match="precison: unknown key") as info:
        load_workload(path)
    assert info.value.key_path == "precison"
    assert info.value.hint == "did you mean 'precision'?"
    assert ":8:1)" in info.value.message  # the line of the key in the file


def test_unknown_nested_key_has_its_path_and_did_you_mean(tmp_path: Path) -> None:
    text = MINIMAL.replace("default: 8}", "default: 8, maxx: 3}")
    with pytest.raises(ConfigError) as info:
        load_workload(write(tmp_path, text))
    assert info.value.key_path == "knobs.num_envs.maxx"
    assert info.value.hint == "did you mean 'max'?"


def test_unknown_key_inside_a_list_item(tmp_path: Path) -> None:
    text = MINIMAL + "constraints:\n  rules:\n    - {knob: num_envs, divisable_by: 8}\n"
    with pytest.raises(ConfigError) as info:
        load_workload(write(tmp_path, text))
    assert info.value.key_path == "constraints.rules[0].divisable_by"
    assert info.value.hint == "did you mean 'divisible_by'?"


def test_wrong_type_names_the_key_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_workload(write(tmp_path, MINIMAL + "action_dim: many\n"))
    assert info.value.key_path == "action_dim"
    assert "'many'" in info.value.message


def test_out_of_range_names_the_key_path_and_the_bound(tmp_path: Path) -> None:
    text = MINIMAL.replace("min: 1,", "min: 0,")
    with pytest.raises(ConfigError, match="greater than or equal to 1") as info:
        load_workload(write(tmp_path, text))
    assert info.value.key_path == "knobs.num_envs.min"


def test_bad_literal_says_what_is_allowed(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_workload(write(tmp_path, MINIMAL + "framework: tensorflow\n"))
    assert info.value.key_path == "framework"
    assert info.value.hint is not None and "'torch'" in info.value.hint


def test_family_needs_its_names() -> None:
    text = """\
family: ppo
observations: {vector: 4}
networks: {policy: {layers: [8, 2]}}
knobs:
  num_envs: {min: 1, max: 8}
  batch_size: {min: 1, max: 8}
  num_minibatches: {min: 1, max: 8}
"""
    with pytest.raises(ConfigError, match="needs unroll_length as a knob or a setting"):
        parse_workload(text)


def test_not_a_mapping_is_refused() -> None:
    with pytest.raises(ConfigError, match="must be a mapping"):
        parse_workload("- a\n- b\n")


def test_knob_domains() -> None:
    assert KnobSpec(min=3, max=40, powers_of_two=False, step=10).values() == (3, 13, 23, 33)
    assert KnobSpec(min=4, max=40, powers_of_two=True).values() == (4, 8, 16, 32)
    assert KnobSpec(choices=[30, 5, 5, 10]).values() == (5, 10, 30)
    assert KnobSpec(min=4, max=64, powers_of_two=True).describe() == "powers of two 4..64"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"min": 8, "max": 4}, "below min"),
        ({"min": 3, "max": 8, "powers_of_two": True}, "not a power of two"),
        ({"choices": [1, 2], "min": 1}, "either choices or min/max"),
        ({"min": 1}, "needs choices, or both min and max"),
        ({"min": 1, "max": 10**6}, "too many to search"),
    ],
)
def test_bad_knob_domains_are_refused(spec: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        KnobSpec.model_validate(spec)


def test_camera_size_may_name_a_knob_but_it_must_exist() -> None:
    text = """\
family: custom
terms: {a: 1}
observations:
  cameras: {count: 1, height: image_size, width: image_size}
"""
    with pytest.raises(ConfigError, match="neither a knob nor a setting"):
        parse_workload(text)
    ok = parse_workload(text + "knobs:\n  image_size: {choices: [64, 128]}\n")
    assert ok.observations.cameras is not None
    assert ok.observations.cameras.height == "image_size"
