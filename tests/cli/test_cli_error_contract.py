"""The CLI error contract, for a careless user's input: Error and Hint, exit codes, one JSON.

The contract (DESIGN.md): a problem prints ``Error:`` and ``Hint:`` on stderr and exits 1 (usage
errors exit 2); it names the key path or the line; never a traceback, never "internal error" for
a user's mistake; with ``--json`` stdout holds exactly one JSON document.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from _cli_run import run, user_error

from memfit._userfiles import read_user_text
from memfit.core.plan import plan_for_gpu as core_plan
from memfit.core.workload import parse_workload
from memfit.errors import ConfigError, EstimateError, InfeasiblePlan
from memfit.hardware.catalog import anonymous_gpu

DQN = Path(__file__).resolve().parents[2] / "src" / "memfit" / "workloads" / "dqn_fire_raster.yaml"


def one_json(out: str) -> object:
    return json.loads(out)


def write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


# --- workload files ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "where"),
    [
        (b"\x7fELF\x02\x01\xff\x00\x01", ":1:7"),
        (b"name: caf\xe9\nfamily: offpolicy\n", ":1:10"),
    ],
)
def test_binary_or_latin1_workload_is_a_user_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: bytes, where: str
) -> None:
    path = write(tmp_path, "job.yaml", content)
    code, _, err = run(capsys, "plan", str(path), "--gpu", "T4")
    user_error(code, err)
    assert "not UTF-8" in err and where in err


def test_directory_as_workload(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    folder = tmp_path / "job.yaml"
    folder.mkdir()
    code, _, err = run(capsys, "check", str(folder))
    user_error(code, err)
    assert "not of a folder" in err


def test_duplicate_key_is_an_error_with_its_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    text = DQN.read_text(encoding="utf-8") + "knobs:\n  buffer_size: {choices: [1000]}\n"
    path = write(tmp_path, "twice.yaml", text)
    code, _, err = run(capsys, "plan", str(path), "--gpu", "T4")
    user_error(code, err)
    assert "duplicate key 'knobs'" in err and "first given on line" in err


def test_misspelt_required_key_suggests_the_key(tmp_path: Path) -> None:
    text = DQN.read_text(encoding="utf-8").replace("family: offpolicy", "famly: offpolicy")
    with pytest.raises(ConfigError, match="unknown key") as info:
        parse_workload(text, source="job.yaml")
    assert info.value.key_path == "famly"
    assert info.value.hint == "did you mean 'family'?"


def test_a_bool_is_not_an_integer() -> None:
    text = DQN.read_text(encoding="utf-8").replace("num_envs: 8", "num_envs: true")
    with pytest.raises(ConfigError, match="valid integer") as info:
        parse_workload(text, source="job.yaml")
    assert info.value.key_path == "settings.num_envs"


def test_tab_indentation_gets_a_tab_hint() -> None:
    with pytest.raises(ConfigError, match="YAML syntax error") as info:
        parse_workload("family: custom\nknobs:\n\tn: {min: 1, max: 2}\n", source="t.yaml")
    assert info.value.key_path == "t.yaml:3:1"
    assert info.value.hint is not None and "tabs" in info.value.hint


def test_whole_file_check_names_its_key() -> None:
    text = "family: custom\nterms: {a: 1}\nestimator: torch\nfactory: nocolon\n"
    with pytest.raises(ConfigError, match="module:function") as info:
        parse_workload(text, source="f.yaml")
    assert info.value.key_path == "factory"
    assert "f.yaml:4:1" in info.value.message


def test_objective_division_by_zero_names_the_objective() -> None:
    w = parse_workload(
        "family: custom\nterms: {a: 1MiB}\nknobs:\n  n: {min: 1, max: 4}\nobjective: n / 0\n"
    )
    with pytest.raises(ConfigError, match="division by zero") as info:
        core_plan(w, anonymous_gpu("8GiB"))
    assert info.value.key_path == "objective" and info.value.hint


def test_misspelt_name_in_a_term_suggests_the_knob() -> None:
    w = parse_workload(
        "family: custom\nterms: {a: 'num_env * 8'}\nknobs:\n  num_envs: {min: 1, max: 4}\n"
    )
    with pytest.raises(ConfigError, match="num_env") as info:
        core_plan(w, anonymous_gpu("8GiB"))
    assert info.value.hint == "did you mean 'num_envs'?"


def test_workload_with_one_configuration_that_does_not_fit_is_infeasible() -> None:
    w = parse_workload(
        "family: custom\nterms: {a: 'n * 1073741824'}\nknobs:\n  n: {choices: [4]}\n"
    )
    with pytest.raises(InfeasiblePlan):
        core_plan(w, anonymous_gpu("2GiB"))


# --- plan and check ---------------------------------------------------------------------------


@pytest.mark.parametrize("item", ["num_envs=0", "num_envs=-4", "num_envs=abc"])
def test_bad_set_values_have_a_hint(capsys: pytest.CaptureFixture[str], item: str) -> None:
    code, _, err = run(capsys, "plan", "brax_humanoid_ppo", "--gpu", "T4", "--set", item)
    user_error(code, err)
    assert "--set num_envs" in err


def test_set_twice_with_different_values(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(
        capsys, "check", "brax_humanoid_ppo", "--set", "num_envs=512", "--set", "num_envs=1024"
    )
    user_error(code, err)
    assert "given twice" in err


def test_plan_with_pins_that_break_a_rule_names_the_rule(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["--set", "num_envs=512", "--set", "batch_size=128", "--set", "num_minibatches=2"]
    code, out, err = run(capsys, "plan", "brax_humanoid_ppo", "--gpu", "T4", "--json", *args)
    user_error(code, err)
    data = one_json(out)
    assert isinstance(data, dict) and data["key_path"] == "--set"
    assert "brax_ppo" in data["message"] and "memfit check" in data["hint"]


def test_plan_pin_outside_its_range_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "plan", "brax_humanoid_ppo", "--gpu", "T4", "--set", "num_envs=1000")
    user_error(code, err)
    assert "outside its range" in err


def test_margin_without_percent_sign_suggests_one(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "plan", "dqn_fire_raster", "--gpu", "T4", "--margin", "20")
    user_error(code, err)
    assert "--margin" in err and "did you mean 20%?" in err


def test_context_alone_over_budget_is_reported_as_the_context(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run(capsys, "plan", "dqn_fire_raster", "--gpu", "T4", "--margin", "99%")
    user_error(code, err)
    assert "CUDA context" in err and "(0 B)" not in err and "knobs that drive" not in err
    code, _, err = run(capsys, "plan", "brax_humanoid_ppo", "--gpu", "T4", "--margin", "99%")
    user_error(code, err)
    assert "MEM_FRACTION=0.00" not in err and "CUDA context" in err


def test_write_into_a_missing_folder(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    target = tmp_path / "missing" / "fitted.yaml"
    code, _, err = run(capsys, "plan", "dqn_fire_raster", "--gpu", "T4", "--write", str(target))
    user_error(code, err)
    assert "does not exist" in err and not target.exists()


def test_a_plan_that_does_not_fit_is_not_written(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    target = tmp_path / "fitted.yaml"
    args = ["--set", "num_envs=1", "--write", str(target), "--json"]
    code, out, err = run(capsys, "plan", "act_dual_camera", "--gpu", "400MiB", *args)
    user_error(code, err)
    data = one_json(out)
    assert isinstance(data, dict) and data["fits"] is False
    assert not target.exists() and "not written" in err


def test_check_json_with_a_broken_rule_also_says_error_on_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["--set", "num_envs=512", "--set", "batch_size=128", "--set", "num_minibatches=2"]
    code, out, err = run(capsys, "check", "brax_humanoid_ppo", "--json", *args)
    user_error(code, err)
    data = one_json(out)
    assert isinstance(data, dict) and data["ok"] is False


# --- gpus, env, devices, watch, report ----------------------------------------------------------


def test_negative_gpu_size(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "gpus", "--", "-5GB")
    user_error(code, err)
    assert "negative" in err


def test_zero_gpu_size_hint_is_not_zero_mib(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "gpus", "0")
    user_error(code, err)
    assert "0MiB" not in err


def test_env_check_of_a_binary_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(tmp_path, "env.sh", b"export A=\xff\xfe\n")
    code, out, err = run(capsys, "env", "--check", str(path), "--json")
    user_error(code, err)
    assert "not UTF-8" in one_json(out)["message"]  # type: ignore[index]


def test_env_check_unclosed_quote_names_the_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = write(tmp_path, "env.sh", "export PYTORCH_ALLOC_CONF='expandable_segments:True\n")
    code, _, err = run(capsys, "env", "--check", str(path))
    user_error(code, err)
    assert "env.sh" in err and "line 1" in err


def test_env_strict_says_why_it_fails(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(tmp_path, "env.sh", "export XLA_PYTHON_CLIENT_MEM_FRACTION=1.5\n")
    code, _, err = run(capsys, "env", "--check", str(path), "--strict")
    user_error(code, err)
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" in err


def test_devices_from_a_binary_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(tmp_path, "snap.json", b"\x7fELF\x02\x01\x01\x00\xd0")
    code, out, err = run(capsys, "devices", "--from-json", str(path), "--json")
    user_error(code, err)
    assert one_json(out)["error"] == "ConfigError"  # type: ignore[index]


def test_report_of_a_binary_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(tmp_path, "run.jsonl", b"\x7fELF\x02\x01\x01\x00\xd0")
    code, _, err = run(capsys, "report", str(path))
    user_error(code, err)
    assert "not UTF-8" in err


def test_watch_count_zero_has_a_hint(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "watch", "--count", "0")
    user_error(code, err)


def test_read_user_text_names_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, "x.txt", b"ok\nab\xe9\n")
    with pytest.raises(ConfigError, match="not UTF-8") as info:
        read_user_text(path, what="the file")
    assert info.value.key_path == f"{path}:2:3"


# --- estimate -----------------------------------------------------------------------------------


@pytest.fixture
def factories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A module of broken factories, importable under a unique name."""
    name = f"qa_factories_{uuid.uuid4().hex[:8]}"
    write(
        tmp_path,
        f"{name}.py",
        "def raises():\n    raise RuntimeError('boom')\n\ndef needs_arg(x):\n    return x\n",
    )
    write(tmp_path, f"{name}_broken.py", "def f(:\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    for mod in (name, f"{name}_broken"):
        sys.modules.pop(mod, None)


@pytest.mark.parametrize("func", ["raises", "needs_arg"])
def test_estimate_factory_that_fails_is_the_users_error(
    capsys: pytest.CaptureFixture[str], factories: str, func: str
) -> None:
    code, out, err = run(capsys, "estimate", f"{factories}:{func}", "--json")
    user_error(code, err)
    data = one_json(out)
    assert isinstance(data, dict) and data["key_path"] == "factory" and "failed" in data["message"]


def test_estimate_module_with_a_syntax_error(
    capsys: pytest.CaptureFixture[str], factories: str
) -> None:
    code, _, err = run(capsys, "estimate", f"{factories}_broken:f")
    user_error(code, err)
    assert "SyntaxError" in err


def test_batch_sizes_as_text_are_rejected() -> None:
    pytest.importorskip("torch")
    from memfit.estimate.torch.trace import estimate_torch

    with pytest.raises(ConfigError, match=r"list of integers, not str \('32'\)"):
        estimate_torch(lambda: (None, None), lambda m, o, b: None, lambda n: None, "32")  # type: ignore[arg-type]


def test_jax_make_args_failures_are_estimate_errors() -> None:
    pytest.importorskip("jax")
    from memfit.estimate.xla.step import estimate_jax_sweep

    def make_args(batch_size: int) -> tuple[object, ...]:
        raise KeyError("oops")

    with pytest.raises(EstimateError, match="make_args"):
        estimate_jax_sweep(lambda x: x, make_args, [8, 16])
    with pytest.raises(EstimateError, match="not a tuple"):
        estimate_jax_sweep(lambda x: x, lambda b: 5, [8, 16])  # type: ignore[arg-type,return-value]


# --- internal errors ------------------------------------------------------------------------------


def _loading_a_workload_raises(monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    """``memfit check`` and ``memfit plan`` meet ``error`` when they load their workload."""
    import memfit.cli.plan as plan_cli

    def broken(_: object) -> object:
        raise error

    monkeypatch.setattr(plan_cli, "load_workload", broken)


def test_internal_error_with_json_still_prints_one_json_document(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _loading_a_workload_raises(monkeypatch, RuntimeError("a bug"))
    code, out, err = run(capsys, "check", "dqn_fire_raster", "--json")
    assert code == 1 and "internal error" in err
    assert one_json(out)["error"] == "InternalError"  # type: ignore[index]


@pytest.mark.parametrize(
    "snapshot",
    [
        '{"source": "nvml", "devices": [{"index": "zero", "name": "x"}]}',
        '{"source": "nvml", "devices": [{"index": 0, "name": "x", "total_bytes": -5}]}',
        '{"source": "nvml", "devices": {}}',
        '{"source": "nvml", "notes": "abc", "devices": []}',
    ],
)
def test_devices_from_a_malformed_snapshot(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, snapshot: str
) -> None:
    path = write(tmp_path, "snap.json", snapshot)
    code, _, err = run(capsys, "devices", "--from-json", str(path))
    user_error(code, err)
    assert "devices --save" in err


def test_an_error_without_its_own_hint_still_gets_one(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _loading_a_workload_raises(monkeypatch, ConfigError("something is off"))
    code, _, err = run(capsys, "check", "dqn_fire_raster")
    user_error(code, err)
    assert "memfit check --help" in err


def test_an_exponent_too_large_names_its_rule() -> None:
    w = parse_workload(
        "family: custom\nterms: {a: 1MiB}\nknobs:\n  n: {min: 1, max: 4, default: 2}\n"
        "constraints:\n  rules:\n    - {expr: 'n ** 100 > 1'}\n"
    )
    with pytest.raises(ConfigError, match="exponent") as info:
        core_plan(w, anonymous_gpu("8GiB"))
    assert info.value.key_path == "constraints.rules[0]"


def test_a_folder_named_like_a_bundled_workload_does_not_hide_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "dqn_fire_raster").mkdir()
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "check", "dqn_fire_raster")
    assert code == 0, err
    assert "every rule holds" in out
