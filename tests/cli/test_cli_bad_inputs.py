"""Bad input is the user's mistake, never memfit's internal error; exit codes say what happened.

Issue 15, "Internal errors and wrong answers" and the exit codes: each case below used to end
in ``Error: internal error`` (an OverflowError, a ValueError, a RecursionError), hang, exit 0
after reporting an error, or let the user's module break the command's output.
"""

from __future__ import annotations

import json
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from _cli_run import run, user_error

from memfit.cli import watch as watch_cli
from memfit.cli.main import COMMAND_MODULES

ROOT = Path(__file__).resolve().parents[2]
DQN = ROOT / "src" / "memfit" / "workloads" / "dqn_fire_raster.yaml"
PPO = ROOT / "src" / "memfit" / "workloads" / "brax_humanoid_ppo.yaml"


def dqn_with(tmp_path: Path, old: str, new: str) -> Path:
    text = DQN.read_text(encoding="utf-8")
    assert old in text
    path = tmp_path / "job.yaml"
    path.write_text(text.replace(old, new), encoding="utf-8")
    return path


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh importable module name in the (temporary) current directory."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield f"usermod_{uuid.uuid4().hex[:8]}"


FACTORY = textwrap.dedent(
    """
    import torch
    from memfit.estimate import TorchStep

    def build():
        model = torch.nn.Linear(16, 4)
        return model, torch.optim.SGD(model.parameters(), lr=0.1)

    def step(model, optimizer, batch):
        model(batch).sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def factory():
        print("building the step")
        return TorchStep(build=build, step=step, make_batch=lambda n: torch.ones(n, 16))
    """
)


# --- sizes beyond any memory ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "where"),
    [
        (["plan", str(DQN), "--gpu", "3.7GB", "--host-memory", "1e308GB"], "--host-memory"),
        (["plan", str(DQN), "--gpu", "1e308GB"], "gpu"),
        (["gpus", "1e308GB"], "gpu"),
        (["plan", str(DQN), "--gpu", "3.7GB", "--margin", "1e400%"], "--margin"),
    ],
)
def test_sizes_of_1e308_are_an_error_not_an_overflow(
    capsys: pytest.CaptureFixture[str], argv: list[str], where: str
) -> None:
    code, _, err = run(capsys, *argv)
    user_error(code, err, where)


def test_gpus_says_the_size_is_too_large_not_that_the_gpu_is_unknown(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run(capsys, "gpus", "1e308GB")
    user_error(code, err, "larger than memfit accepts")
    assert "unknown GPU" not in err
    code, out, err = run(capsys, "gpus", "1.2e1GB", "--json")  # exponent sizes are sizes
    assert code == 0, err
    assert json.loads(out)["total_bytes"] == 12 * 10**9


def test_fit_budget_of_1e308_is_an_error(
    user_module: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / f"{user_module}.py").write_text(FACTORY)
    argv = ["fit", f"{user_module}:factory", "--device", "cpu", "--budget", "1e308GB"]
    code, _, err = run(capsys, *argv)
    user_error(code, err, "--budget", "larger than memfit accepts")


def test_env_state_bytes_of_1e308_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = PPO.read_text(encoding="utf-8")
    lines = [
        'env_state_bytes: "1e308GB"' if line.startswith("env_state_bytes:") else line
        for line in text.splitlines()
    ]
    path = tmp_path / "ppo.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert "1e308GB" in path.read_text()
    code, _, err = run(capsys, "plan", str(path), "--gpu", "8GB")
    user_error(code, err, "env_state_bytes", "larger than memfit accepts")


# --- digits that are not ASCII ----------------------------------------------------------------


def test_superscript_batch_size_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "estimate", "nowhere:factory", "--batch", "32,\u00b2")
    user_error(code, err, "--batch", "digits 0-9")


def test_superscript_max_split_size_is_an_error(
    user_module: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / f"{user_module}.py").write_text(FACTORY)
    argv = ["estimate", f"{user_module}:factory", "--alloc-conf", "max_split_size_mb:\u00b2"]
    code, _, err = run(capsys, *argv)
    user_error(code, err, "--alloc-conf", "max_split_size_mb")


# --- expressions: the whole value bounded -----------------------------------------------------


def test_a_huge_objective_is_refused_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = dqn_with(tmp_path, "objective: buffer_size", "objective: (buffer_size ** 64) ** 64")
    start = time.perf_counter()
    code, _, err = run(capsys, "plan", str(path), "--gpu", "3.7GB")
    assert time.perf_counter() - start < 10  # refused before a 25,000-digit power is computed
    user_error(code, err, "objective", "beyond 2**100")


@pytest.mark.parametrize(
    "objective",
    [
        "buffer_size * 1e308 * 10",  # inf
        "buffer_size * 1e30 * 1e30",  # each number fine, the product not
        "buffer_size ** 8 * batch_size ** 8",
    ],
)
def test_an_objective_that_would_be_infinite_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], objective: str
) -> None:
    path = dqn_with(tmp_path, "objective: buffer_size", f"objective: {objective}")
    code, _, err = run(capsys, "plan", str(path), "--gpu", "3.7GB")
    user_error(code, err, "objective")


def test_a_term_that_would_be_nan_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "custom.yaml"
    path.write_text(
        "name: c\nfamily: custom\nknobs:\n  n: {min: 1, max: 10}\n"
        'terms:\n  x: "1e308 * 10 - 1e308 * 10"\n  y: "n * 1e20 * 1e20 - n * 1e20 * 1e20"\n',
        encoding="utf-8",
    )
    code, _, err = run(capsys, "plan", str(path), "--gpu", "4GB")
    user_error(code, err, "terms.x")


def test_yaml_nested_5000_deep_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, text in (
        ("lists.yaml", "[" * 5000 + "]" * 5000),
        ("maps.yaml", "name: x\nknobs: " + "{a: " * 5000 + "1" + "}" * 5000),
    ):
        path = tmp_path / name
        path.write_text(text + "\n")
        code, _, err = run(capsys, "plan", str(path), "--gpu", "4GB")
        user_error(code, err, "nested too deeply")


# --- one --set rule for plan and check --------------------------------------------------------


@pytest.mark.parametrize("value", ["5000", "15000", "2000000"])
def test_plan_and_check_refuse_a_knob_outside_its_range_alike(
    capsys: pytest.CaptureFixture[str], value: str
) -> None:
    pin = f"buffer_size={value}"
    rule = f"buffer_size = {value} is outside its range (10000..1000000 step 10000)"
    code, out, err = run(capsys, "plan", str(DQN), "--gpu", "3.7GB", "--set", pin)
    user_error(code, err, rule)
    assert out == ""
    # check says it too, as a note: the workload's declared range, not a framework rule
    # (issue 22); no rule is broken, so check itself passes
    code, out, _ = run(capsys, "check", str(DQN), "--set", pin)
    assert code == 0 and rule in out and "declared range, not a framework rule" in out
    code, _, err = run(capsys, "plan", str(DQN), "--gpu", "3.7GB", "--set", "buffer_size=50000")
    assert code == 0, err


def test_set_names_what_it_takes(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "plan", str(DQN), "--gpu", "3.7GB", "--set", "precision=bf16")
    user_error(code, err, "'precision' is neither a knob nor a setting", "edit it there")
    code, _, err = run(capsys, "check", str(DQN), "--set", "batch_size=lots")
    user_error(code, err, "not a whole number")
    code, out, _ = run(capsys, "plan", "--help")
    assert code == 0
    assert "NAME=INT" in out and "whole number" in out


# --- help: flags take no value ----------------------------------------------------------------


@pytest.mark.parametrize("command", [*COMMAND_MODULES, "check", "examples"])
def test_flags_do_not_read_as_taking_a_bool(
    command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "160")
    code, out, _ = run(capsys, command, "--help")
    assert code == 0
    assert "--json" in out
    assert "<bool>" not in out and "BOOLEAN" not in out


def test_json_takes_no_value(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "plan", str(DQN), "--gpu", "3.7GB", "--json", "true")
    assert code == 2 and "unexpected extra argument" in err.lower()


# --- exit codes -------------------------------------------------------------------------------


def test_env_exits_1_when_it_reports_an_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in (
        "PYTORCH_ALLOC_CONF",
        "PYTORCH_CUDA_ALLOC_CONF",
        "XLA_PYTHON_CLIENT_PREALLOCATE",
        "XLA_PYTHON_CLIENT_ALLOCATOR",
        "XLA_CLIENT_MEM_FRACTION",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "1.2")
    code, out, err = run(capsys, "env")
    assert "error [bad-value] XLA_PYTHON_CLIENT_MEM_FRACTION" in out
    user_error(code, err, "XLA_PYTHON_CLIENT_MEM_FRACTION")
    code, out, err = run(capsys, "env", "--json")
    assert code == 1 and json.loads(out)["problems"][0]["code"] == "bad-value"
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", ".5")
    code, _, err = run(capsys, "env")
    assert code == 0, err


def test_watch_checks_its_log_before_looking_for_a_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(watch_cli, "make_probe", lambda: (None, ["no driver"]))
    code, _, err = run(capsys, "watch", "--once", "--log", str(tmp_path / "no" / "w.jsonl"))
    user_error(code, err, "--log", "does not exist")
    code, _, err = run(capsys, "watch", "--once", "--log", str(tmp_path))
    user_error(code, err, "it is a folder")
    code, out, _ = run(capsys, "watch", "--once", "--log", str(tmp_path / "w.jsonl"))
    assert code == 0 and "No GPU to watch" in out
    assert not (tmp_path / "w.jsonl").exists()


def test_a_module_that_exits_on_import_fails_loudly(
    user_module: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / f"{user_module}.py").write_text("import sys\nsys.exit(0)\n")
    code, _, err = run(capsys, "estimate", f"{user_module}:factory")
    user_error(code, err, "called sys.exit(0)", "__main__")
    code, out, err = run(capsys, "estimate", f"{user_module}:factory", "--json")
    assert code == 1 and json.loads(out)["error"] == "ConfigError"


def test_a_print_in_the_users_module_keeps_json_on_stdout(
    user_module: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / f"{user_module}.py").write_text('print("imported!")\n' + FACTORY)
    code, out, err = run(capsys, "estimate", f"{user_module}:factory", "--batch", "2,4", "--json")
    assert code == 0, err
    assert json.loads(out)["batch_knob"] == "batch_size"  # one JSON document, nothing else
    assert "imported!" in err and "building the step" in err
    argv = ["fit", f"{user_module}:factory", "--device", "cpu", "--budget", "1MiB"]
    code, out, err = run(capsys, *argv, "--high", "256", "--no-prior", "--json")
    assert code == 0, err
    assert json.loads(out)["knob"] == "batch_size"


def test_names_with_terminal_escapes_are_shown_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = dqn_with(tmp_path, "name: dqn_fire_raster", 'name: "\\e[31mRED\\e[0m\\a[bold]"')
    for argv in (["plan", str(path), "--gpu", "3.7GB"], ["check", str(path)]):
        code, out, err = run(capsys, *argv)
        assert code == 0, err
        assert "\x1b" not in out and "\x07" not in out
        assert "\\x1b[31mRED\\x1b[0m\\x07[bold]" in out
    code, out, _ = run(capsys, "check", str(path), "--set", "buffer_size=5000")
    assert code == 0 and "Note:" in out  # a declared range: a note (issue 22)
    assert "\x1b" not in out and "\\x1b[31mRED" in out


# --- report: a log is untrusted input ---------------------------------------------------------

SAMPLE = '{"type": "sample", "mode": "step", "step": 0, "allocated_bytes": 1048576}\n'


@pytest.mark.parametrize(
    "line",
    [
        '{"type": "event", "data": ' + "[" * 100_000 + "]" * 100_000 + "}",
        '{"type": "sample", "step": 1, "allocated_bytes": 1' + "0" * 400 + "}",
        '{"type": "sample", "step": 1, "peak_allocated_bytes": NaN}',
        '{"type": "sample", "step": 1, "peak_allocated_bytes": "lots"}',
    ],
)
def test_report_of_a_damaged_log_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str
) -> None:
    path = tmp_path / "run.jsonl"
    path.write_text(SAMPLE + line + "\n")
    for extra in ([], ["-o", str(tmp_path / "r.png")], ["--json"]):
        code, _, err = run(capsys, "report", str(path), *extra)
        user_error(code, err, f"{path}:2")
    assert not (tmp_path / "r.png").exists()


def test_report_of_a_killed_runs_log_warns_and_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "run.jsonl"
    path.write_text(SAMPLE + '{"type": "sample", "mode": "st')
    code, out, err = run(capsys, "report", str(path), "-o", str(tmp_path / "r.html"), "--json")
    assert code == 0, err
    assert "warning:" in err and "cut off" in err
    assert json.loads(out)["warnings"][0].startswith(f"{path}:2: the last line is cut off")


def test_plan_of_a_measured_workload_keeps_stdout_to_its_json(
    user_module: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The planner runs the workload's factory (the user's code): its prints go to stderr,
    also for a GPU given by its size."""
    (tmp_path / f"{user_module}.py").write_text('print("imported!")\n' + FACTORY)
    path = tmp_path / "traced.yaml"
    path.write_text(
        f"name: traced\nfamily: custom\nestimator: torch\nfactory: {user_module}:factory\n"
        "terms: {extra: 1MiB}\nknobs:\n  batch_size: {min: 1, max: 64, powers_of_two: true}\n"
    )
    code, out, err = run(capsys, "plan", str(path), "--gpu", "8GiB", "--json")
    assert code == 0, err
    assert json.loads(out)["knobs"] == {"batch_size": 64}
    assert "imported!" in err and "building the step" in err
    (tmp_path / f"{user_module}_exit.py").write_text("import sys\nsys.exit(3)\n")
    path.write_text(path.read_text().replace(f"{user_module}:", f"{user_module}_exit:"))
    code, _, err = run(capsys, "plan", str(path), "--gpu", "8GiB")
    user_error(code, err, "called sys.exit(3)")


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "{long}", "--gpu", "4GB"],
        ["check", "{long}"],
        ["report", "{long}"],
        ["fit", "{long}", "--device", "cpu", "--budget", "1GiB"],
        ["env", "--check", "{long}"],
        ["devices", "--from-json", "{long}"],
    ],
)
def test_a_file_name_too_long_for_the_system_is_a_user_error(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    long = "x" * 5000  # longer than any file name a system allows (ENAMETOOLONG)
    code, _, err = run(capsys, *(a.replace("{long}", long) for a in argv))
    user_error(code, err)
