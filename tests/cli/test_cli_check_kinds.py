"""Issue 22: ``memfit check`` tells a workload's declared range (a note) from a framework's
rule (a violation), and says which is which."""

from __future__ import annotations

import json

import pytest
from _cli_run import run, run_json

from memfit.core.constraints import check
from memfit.core.workload import load_workload


def test_range_and_rule_are_told_apart() -> None:
    w = load_workload("brax_humanoid_ppo")
    found = check(w, {"num_envs": 131072, "batch_size": 128, "num_minibatches": 2})
    kinds = {(v.kind, v.source) for v in found}
    assert kinds == {("range", "workload"), ("rule", "brax_ppo")}


def test_a_declared_range_alone_is_a_note(capsys: pytest.CaptureFixture[str]) -> None:
    # 131072 envs keep Brax's rules (batch_size * num_minibatches = 131072) but are outside
    # the workload's powers of two 256..65536
    args = ["--set", "num_envs=131072", "--set", "batch_size=4096", "--set", "num_minibatches=32"]
    code, out, err = run(capsys, "check", "brax_humanoid_ppo", *args)
    assert code == 0, err
    assert "every rule holds" in out
    assert "outside this workload's declared range, not a framework rule" in out
    assert "num_envs=65536" in out and "widen knobs.num_envs" in out
    data = run_json(capsys, "check", "brax_humanoid_ppo", *args, "--json")
    assert data["ok"] is True and data["violations"] == []
    [note] = data["range_notes"]
    assert note["kind"] == "range" and note["knobs"] == {"num_envs": 131072}


def test_a_framework_rule_is_a_violation_and_named(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--set", "num_envs=131072", "--set", "batch_size=128", "--set", "num_minibatches=2"]
    code, out, err = run(capsys, "check", "brax_humanoid_ppo", *args)
    assert code == 1
    assert "broken rules (violations)" in out and "Brax PPO's rule" in out
    assert "(Brax PPO's rule)" in err and "Note: num_envs = 131072" in out
    data = json.loads(run(capsys, "check", "brax_humanoid_ppo", *args, "--json")[1])
    assert [v["source"] for v in data["violations"]] == ["brax_ppo"]
    assert [v["kind"] for v in data["range_notes"]] == ["range"]
