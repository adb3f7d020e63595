"""``memfit plan``, ``memfit check`` and ``memfit examples`` through the CLI entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from _cli_run import run, run_json
from _plan_fields import PLAN_FIELDS

from memfit.core.workload import load_workload
from memfit.planning import TIER_GPUS


def test_plan_human_output(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "plan", "dqn_fire_raster@device_replay", "--gpu", "RTX 4070")
    assert code == 0, err
    assert "replay_buffer" in out
    assert "Limited by: replay_buffer" in out
    assert "buffer_size" in out
    assert "PYTORCH_ALLOC_CONF=expandable_segments:True" in out


def test_plan_json_is_exactly_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(
        capsys, "plan", "brax_humanoid_ppo", "--gpu", "RTX 4070", "--margin", "10%", "--json"
    )
    assert list(data) == PLAN_FIELDS
    assert data["fits"] is True
    assert sum(data["breakdown"].values()) == data["predicted_bytes"] <= data["budget_bytes"]
    assert set(data["knobs"]) == {"num_envs", "unroll_length", "batch_size", "num_minibatches"}


def test_plan_with_set_and_size(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(
        capsys, "plan", "brax_humanoid_ppo", "--gpu", "24GiB", "--set", "num_envs=4096", "--json"
    )
    assert data["knobs"]["num_envs"] == 4096


def test_plan_write_fitted_yaml(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    target = tmp_path / "fitted.yaml"
    code, _, err = run(capsys, "plan", "act_dual_camera", "--gpu", "8GiB", "--write", str(target))
    assert code == 0
    assert "Wrote" in err
    text = target.read_text()
    fitted = yaml.safe_load(text)
    # a workload file (issue 22: memfit plan FILE loads it again), every knob pinned
    assert fitted["name"] == "act_dual_camera" and fitted["family"]
    assert len(fitted["knobs"]["num_envs"]["choices"]) == 1
    assert "# run with: export PYTORCH_ALLOC_CONF=expandable_segments:True" in text


def test_all_gpus_tier_table(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "plan", "dqn_fire_raster", "--all-gpus", "--json")
    plans = data["plans"]
    assert len(plans) == len(TIER_GPUS)
    totals = [p["gpu_total_bytes"] for p in plans]
    assert totals == sorted(totals) and all(isinstance(t, int) for t in totals)
    assert all(list(p)[: len(PLAN_FIELDS)] == PLAN_FIELDS for p in plans)
    sizes = [p["knobs"]["buffer_size"] for p in plans if p["fits"]]
    assert sizes and all(isinstance(s, int) for s in sizes)
    code, out, _ = run(capsys, "plan", "dqn_fire_raster", "--all-gpus")
    assert code == 0
    assert "tier table" in out and "H100" in out


def test_infeasible_plan_exits_1_with_error_and_hint(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "plan", "act_dual_camera", "--gpu", "600MiB")
    assert code == 1
    assert out == ""
    assert "Error:" in err and "Hint:" in err
    assert "Traceback" not in err
    code, out, _ = run(capsys, "plan", "act_dual_camera", "--gpu", "600MiB", "--json")
    assert code == 1
    assert json.loads(out)["error"] == "InfeasiblePlan"


def test_pinned_plan_that_does_not_fit_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(
        capsys,
        "plan",
        "dqn_fire_raster@device_replay",
        "--gpu",
        "3.7GB",
        "--set",
        "buffer_size=200000",
        "--set",
        "batch_size=64",
    )
    assert code == 1
    assert "does not fit" in out
    assert "Error:" in err and "replay_buffer" in err


def test_plan_needs_a_gpu_choice(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "plan", "dqn_fire_raster")
    assert code == 2
    assert "--all-gpus" in err


def test_unknown_gpu_and_unknown_knob(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "plan", "dqn_fire_raster", "--gpu", "RTX 9999 Super")
    assert code == 1 and "Error:" in err and "Traceback" not in err
    code, _, err = run(capsys, "plan", "dqn_fire_raster", "--gpu", "T4", "--set", "bufer_size=8")
    assert code == 1
    assert "did you mean 'buffer_size'?" in err


def test_yaml_syntax_error_through_the_cli(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("family: custom\nterms: {a: 1\nknobs: {}\n", encoding="utf-8")
    code, _, err = run(capsys, "check", str(path))
    assert code == 1
    assert f"{path}:" in err.replace("\n", "")
    assert "YAML syntax error" in err
    assert "Traceback" not in err


def test_unknown_key_and_wrong_type_through_the_cli(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "w.yaml"
    path.write_text("family: custom\nterms: {a: 1}\nknbos: {}\n", encoding="utf-8")
    code, _, err = run(capsys, "plan", str(path), "--gpu", "T4")
    assert code == 1
    assert "did you mean 'knobs'?" in err
    path.write_text(
        "family: custom\nterms: {a: 1}\nknobs:\n  n: {min: one, max: 4}\n", encoding="utf-8"
    )
    code, _, err = run(capsys, "plan", str(path), "--gpu", "T4")
    assert code == 1
    assert "knobs.n.min" in err
    assert "Traceback" not in err


def test_check_reports_the_nearest_fixes(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--set", "num_envs=512", "--set", "batch_size=128", "--set", "num_minibatches=2"]
    code, out, err = run(capsys, "check", "brax_humanoid_ppo", *args)
    assert code == 1
    assert "num_minibatches=4" in out and "batch_size=256" in out
    assert "Hint: try --set num_minibatches=4" in err
    code, out, _ = run(capsys, "check", "brax_humanoid_ppo", *args, "--json")
    assert code == 1
    data = json.loads(out)
    assert data["ok"] is False
    assert data["violations"][0]["suggestions"][:2] == [
        {"num_minibatches": 4},
        {"batch_size": 256},
    ]
    code, out, _ = run(capsys, "check", "brax_humanoid_ppo")
    assert code == 0
    assert "every rule holds" in out


def test_examples(capsys: pytest.CaptureFixture[str]) -> None:
    names = [e["name"] for e in run_json(capsys, "examples", "--json")["examples"]]
    assert any("ppo" in n for n in names)
    assert any("dqn" in n for n in names)
    assert any("act" in n for n in names)
    code, out, _ = run(capsys, "examples")
    assert code == 0 and "dqn_fire_raster" in out


@pytest.mark.parametrize("as_json", [False, True])
def test_tier_table_exits_1_when_nothing_fits(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, as_json: bool
) -> None:
    path = tmp_path / "huge.yaml"
    path.write_text(
        "family: custom\nterms: {weights: 200GiB, per_env: 'n * 1024'}\n"
        "knobs:\n  n: {min: 1, max: 8}\nobjective: n\n",
        encoding="utf-8",
    )
    code, out, err = run(capsys, "plan", str(path), "--all-gpus", *(["--json"] if as_json else []))
    assert code == 1
    assert "fits on none of the" in err and "Hint:" in err
    if as_json:
        rows = json.loads(out)["plans"]
        assert rows and not any(r["fits"] for r in rows)


def test_camera_workload_num_envs_takes_any_count(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 32: act_dual_camera took only powers of two for num_envs, so 3 envs that fit
    an 8 GB card were refused; Isaac Lab takes any count, and so does the workload."""
    w = load_workload("act_dual_camera")
    assert w.knobs["num_envs"].values() == tuple(range(1, 1025))
    pinned = run_json(capsys, "plan", "act_dual_camera", "--gpu", "RTX 4060 Ti 8GB",
                      "--set", "num_envs=3", "--json")  # fmt: skip
    assert pinned["fits"] and pinned["knobs"]["num_envs"] == 3
    best = run_json(capsys, "plan", "act_dual_camera", "--gpu", "RTX 4060 Ti 8GB", "--json")
    assert best["knobs"]["num_envs"] >= 3  # not held to 2 by the next power of two


def test_a_jax_plans_context_line_leaves_torch_out(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 32: JAX plans said "torch unknown" in the context line; JAX brings its own CUDA
    libraries, so the line names CUDA and the driver, and the --runtime keys a JAX job uses."""
    code, out, _ = run(capsys, "plan", "brax_humanoid_ppo", "--gpu", "RTX 4070")
    [line] = [x for x in out.splitlines() if x.strip().startswith("cuda_context:")]
    assert code == 0 and "torch unknown" not in line and "CUDA unknown, driver unknown" in line
    assert "--runtime cuda=...,module_loading=lazy|eager" in line
    code, out, _ = run(capsys, "plan", "dqn_fire_raster", "--gpu", "RTX 4070")
    [line] = [x for x in out.splitlines() if x.strip().startswith("cuda_context:")]
    assert "--runtime torch=...,cuda=..." in line
