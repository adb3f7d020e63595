"""Issue 22: ``memfit show`` gives a workload to copy; ``plan --write`` gives one to plan again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from _cli_run import run, run_json, user_error

from memfit.core.workload import load_workload
from memfit.units import GiB


@pytest.mark.parametrize("name", ["dqn_fire_raster", "brax_humanoid_ppo", "act_dual_camera"])
def test_show_prints_the_bundled_yaml_with_its_variants(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str
) -> None:
    code, out, err = run(capsys, "show", name)
    assert code == 0 and "variants:" in out and f"memfit show {name} >" in err
    copy = tmp_path / "mine.yaml"
    copy.write_text(out)
    # the copy is the bundled workload: same plan, same variants
    assert load_workload(str(copy)).model_dump(exclude={"source", "name"}) == load_workload(
        name
    ).model_dump(exclude={"source", "name"})
    data = run_json(capsys, "show", name, "--json")
    assert data["yaml"] == out and data["variants"]
    variant = data["variants"][0]
    a = run_json(capsys, "plan", f"{copy}@{variant}", "--gpu", "RTX 4090", "--json")
    b = run_json(capsys, "plan", f"{name}@{variant}", "--gpu", "RTX 4090", "--json")
    assert a["knobs"] == b["knobs"] and a["predicted_bytes"] == b["predicted_bytes"]


def test_show_refuses_unknown_names_and_variants(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "show", "dqn_fire_rastr")
    user_error(code, err, "did you mean 'dqn_fire_raster'")
    code, _, err = run(capsys, "show", "dqn_fire_raster@nightly")
    user_error(code, err, "unknown variant", "device_replay")
    code, _, err = run(capsys, "show", "../pyproject")
    user_error(code, err, "no bundled workload")


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("dqn_fire_raster", ["--gpu", "3.68GiB", "--host-memory", "16GiB"]),
        ("dqn_fire_raster@device_replay", ["--gpu", "RTX 4060"]),
        ("brax_humanoid_ppo", ["--gpu", "RTX 4070", "--set", "unroll_length=20"]),
        ("act_dual_camera", ["--gpu", "8GiB"]),
    ],
)
def test_plan_write_gives_a_file_plan_loads_again(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, args: list[str]
) -> None:
    target = tmp_path / "fitted.yaml"
    first = run_json(capsys, "plan", name, *args, "--write", str(target), "--json")
    again_args = [a for a in args if a not in ("--set", "unroll_length=20")]
    if "--host-memory" in again_args:  # the file records it: no need to give it again
        i = again_args.index("--host-memory")
        del again_args[i : i + 2]
    again = run_json(capsys, "plan", str(target), *again_args, "--json")
    assert again["knobs"] == first["knobs"]
    assert again["predicted_bytes"] == first["predicted_bytes"]
    assert again["host_bytes"] == first["host_bytes"]
    written = yaml.safe_load(target.read_text())
    if first["host_memory_bytes"] is not None:
        assert written["host_memory_bytes"] == first["host_memory_bytes"]
        assert again["host_memory_bytes"] == first["host_memory_bytes"]
    if "--host-memory" in args:
        assert written["host_memory_bytes"] == 16 * GiB
        assert "# host RAM the plan relied on: 16.00 GiB" in target.read_text()


def test_plan_write_keeps_set_settings(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    target = tmp_path / "fitted.yaml"
    code, out, err = run(
        capsys, "plan", "brax_humanoid_ppo", "--gpu", "RTX 4070", "--set", "unroll_length=20",
        "--write", str(target), "--json",
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["knobs"]["unroll_length"] == 20
    assert yaml.safe_load(target.read_text())["knobs"]["unroll_length"]["choices"] == [20]


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("dqn_fire_raster", ["--gpu", "3.68GiB", "--margin", "10%"]),
        ("brax_humanoid_ppo@quick", ["--gpu", "RTX 4060"]),
        ("dqn_fire_raster", ["--gpu", "cpu", "--host-memory", "16GiB"]),
    ],
)
def test_a_written_plan_reloads_as_written_without_gpu(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, args: list[str]
) -> None:
    """Issue 32: ``memfit plan fitted.yaml``, as the README writes it, asked for --gpu
    although the file records its GPU. It plans for what the file records."""
    target = tmp_path / "fitted.yaml"
    first = run_json(capsys, "plan", name, *args, "--write", str(target), "--json")
    written = yaml.safe_load(target.read_text())
    assert written["planned_for"]["gpu"] == args[1]
    code, out, err = run(capsys, "plan", str(target), "--json")
    assert code == 0, err
    again = json.loads(out)
    for key in ("gpu", "knobs", "predicted_bytes", "budget_bytes", "environment"):
        assert again[key] == first[key], key
    code, out, err = run(capsys, "plan", str(target))
    assert code == 0 and f"note: planning for {args[1]}, as {target} records" in err
    # on a GPU the process's baseline and the OS reserve leave the 16 GiB host too little
    # for the buffer the CPU plan chose (issue 41): give that machine more RAM
    other = run_json(
        capsys, "plan", str(target), "--gpu", "RTX 4090", "--host-memory", "24GiB", "--json"
    )
    assert other["gpu"] == "NVIDIA GeForce RTX 4090"  # --gpu still decides when given
    code, _, err = run(capsys, "plan", name)  # a file that records nothing: the usage error
    assert code == 2 and "give exactly one of --gpu" in err
