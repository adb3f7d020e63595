"""Bad input at the command line, by class: stdout that cannot be written,
names of any length, output paths, integers from users, YAML that expands, expressions that
explode, files that disagree with ``--set``. Each ends in ``Error:``/``Hint:`` (exit 1), or
quietly for a closed pipe, never in a traceback or a hang."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from _cli_run import run, user_error
from hypothesis import given, settings
from hypothesis import strategies as st

from memfit._checks import MAX_INT_DIGITS, parse_int
from memfit.allocator.snapshot_build import TraceBuilder
from memfit.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = ROOT / "src" / "memfit" / "workloads"
DQN = (BUNDLED / "dqn_fire_raster.yaml").read_text(encoding="utf-8")
SAC = (BUNDLED / "sac_pixels_8gb.yaml").read_text(encoding="utf-8")


def _memfit(args: list[str], redirect: str = "") -> subprocess.CompletedProcess[str]:
    """``memfit ARGS REDIRECT`` through a shell, as a user types it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    quoted = " ".join(f"'{a}'" for a in args)
    return subprocess.run(
        ["sh", "-c", f'"$0" -m memfit.cli.main {quoted} {redirect}', sys.executable],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def _file(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# --- stdout ---------------------------------------------------------------------------------


@pytest.mark.parametrize("redirect", ["> /dev/full", ">&-"])
@pytest.mark.parametrize(
    "args",
    [
        ["show", "dqn_fire_raster"],
        ["gpus", "4090"],
        ["--version"],
        ["gpus", "4070", "--target-config"],
    ],
)
def test_output_that_cannot_be_written_is_an_error(args: list[str], redirect: str) -> None:
    if redirect == "> /dev/full" and not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    done = _memfit(args, redirect)
    assert done.returncode == 1, done.stderr
    assert "Error: cannot write the output" in done.stderr and "Hint:" in done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr


def test_every_command_writes_stdout_through_the_guarded_stream() -> None:
    """Issue 45: ``gpus --target-config`` wrote with ``typer.echo``, past the guard, and a
    closed stdout lost the config with exit 0. No command module writes stdout but through
    ``memfit.cli._common`` (``write_stdout``, ``out_console``, ``print_json``)."""
    import re

    direct = re.compile(r"\btyper\.echo\(|\bsys\.stdout\.write\(|(?<![.\w])print\(")
    found = [
        f"{path.name}:{number}"
        for path in sorted((ROOT / "src" / "memfit" / "cli").glob("*.py"))
        if path.name != "_common.py"
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if direct.search(line.split("#", 1)[0])
    ]
    assert not found, found


@pytest.mark.parametrize("args", [["gpus"], ["show", "dqn_fire_raster"], ["examples", "--json"]])
def test_a_closed_pipe_ends_quietly_as_unix_tools_do(args: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    quoted = " ".join(f"'{a}'" for a in args)
    done = subprocess.run(
        ["bash", "-c", f'set -o pipefail; "$0" -m memfit.cli.main {quoted} | head -c 1 > /dev/null',
         sys.executable],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode in (0, 141), done.stderr
    assert "Error" not in done.stderr and "Traceback" not in done.stderr, done.stderr


# --- names and paths --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a" * 5000, "a" * 5000 + "@x", "../" * 2000, "x\x00y"])
def test_a_name_of_any_length_or_shape_is_a_clear_error(
    capsys: pytest.CaptureFixture[str], name: str
) -> None:
    code, _, err = run(capsys, "show", name)
    user_error(code, err, "no bundled workload")
    assert len(err) < 2000


def test_long_paths_are_shown_by_their_ends(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "plan", "b" * 5000, "--gpu", "4GB")
    user_error(code, err, "(5,000 characters)")
    assert len(err) < 2000


@pytest.mark.parametrize("suffix", ["/", "//"])
def test_an_output_path_ending_with_a_slash_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, suffix: str
) -> None:
    monkeypatch.chdir(tmp_path)
    builder = TraceBuilder()
    builder.free(builder.malloc(3 * 2**20))
    import pickle

    (tmp_path / "s.pickle").write_bytes(pickle.dumps(builder.snapshot()))
    code, _, err = run(capsys, "explain", "s.pickle", "-o", f"name.png{suffix}")
    user_error(code, err, "names a folder")
    assert not (tmp_path / "name.png").exists()


def test_no_output_option_is_a_path_that_drops_a_trailing_slash() -> None:
    """Typer's ``Path`` type normalises ``name.png/`` to ``name.png``: every option that names
    a file to write takes the text as given, so the one check sees the slash."""
    import importlib
    import inspect

    from memfit.cli.main import COMMANDS

    checked = 0
    for module_name, _ in COMMANDS.values():
        module = importlib.import_module(f"memfit.cli.{module_name}")
        for fn in vars(module).values():
            if not inspect.isfunction(fn) or fn.__module__ != module.__name__:
                continue
            for param in inspect.signature(fn).parameters.values():
                decls = set(getattr(param.default, "param_decls", None) or ())
                if decls & {"-o", "--output", "--save", "--write", "--log"}:
                    checked += 1
                    assert "Path" not in str(param.annotation), (fn.__name__, param.name)
    assert checked >= 4


# --- integers from users ----------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_parse_int_takes_ascii_digits_only_and_nothing_else_gets_through(text: str) -> None:
    try:
        value = parse_int("n", text)
    except ConfigError as exc:
        assert exc.key_path == "n"
        return
    stripped = text.strip()
    assert stripped.lstrip("+-").replace("_", "").isascii()
    assert value == int(stripped)


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=1, max_value=6000))
def test_parse_int_refuses_many_digits_before_converting(digits: int) -> None:
    text = "7" * digits
    if digits > MAX_INT_DIGITS or (int(text[:20]) >= 2**63 and digits >= 19):
        with pytest.raises(ConfigError, match=r"digits|2\*\*63"):
            parse_int("n", text)
    else:
        assert parse_int("n", text) == int(text)


@pytest.mark.parametrize(
    "args",
    [
        ["--at", "1" * 5000],
        ["--at", "\u00b2"],
        ["--at", "\u0663"],
        ["--at", "-3"],
    ],
)
def test_at_takes_an_event_index_in_plain_digits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    import pickle

    builder = TraceBuilder()
    builder.free(builder.malloc(3 * 2**20))
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(builder.snapshot()))
    code, _, err = run(capsys, "explain", str(path), *args)
    user_error(code, err, "--at")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--runtime", "torch=1" + "0" * 5000 + ".0"], "runtime.torch"),
        (["--runtime", "cuda=1\u00b2.1"], "runtime.cuda"),
        (["--set", "buffer_size=\u0663"], "--set buffer_size"),
        (["--set", "buffer_size=" + "9" * 5000], "--set buffer_size"),
    ],
)
def test_numbers_typed_on_the_command_line_go_through_one_parser(
    capsys: pytest.CaptureFixture[str], args: list[str], words: str
) -> None:
    code, _, err = run(capsys, "plan", "dqn_fire_raster", "--gpu", "4GB", *args)
    user_error(code, err, words)
    assert len(err) < 2000


# --- workload files ---------------------------------------------------------------------------


def _with(old: str, new: str, base: str = DQN) -> str:
    assert old in base
    return base.replace(old, new, 1)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (_with("    target: true\n", "    target: true\n    copies: " + "1" * 5000 + "\n"),
         "5000 digits"),
        (_with("    target: true\n", "    target: true\n    copies: 123456789012345678901234\n"),
         "copies"),
        (_with("optimizer: adam\n", "optimizer: adam\noptimizer_states: " + "1" * 24 + "\n"),
         "optimizer_states"),
        (_with("optimizer: adam\n", "optimizer: adam\noptimizer_states: 100000000000000\n"),
         "optimizer_states"),
        (_with("  batch_size: 128", "  batch_size: 0"), "settings.batch_size"),
        ("\ufeff\ufeff" + DQN, "two byte-order marks"),
        (_with("objective: buffer_size", "objective: ((buffer_size ** 64) ** 64) ** 64"),
         "beyond 2**100"),
        ('name: c\nfamily: custom\nknobs:\n  n: {min: 1, max: 10}\nterms:\n  x: "-1GiB"\n',
         "a size cannot be negative"),
        ('name: c\nfamily: custom\nknobs:\n  n: {min: 1, max: 10}\nterms:\n  x: "3 parsecs"\n',
         "terms.x"),
        ('name: c\nfamily: custom\nknobs:\n  n: {min: 1, max: 10}\nterms:\n  x: "'
         + "(" * 300 + "n" + ")" * 300 + '"\n', "terms.x"),
    ],
)  # fmt: skip
def test_a_workload_file_past_a_bound_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, words: str
) -> None:
    path = _file(tmp_path, "w.yaml", text)
    code, _, err = run(capsys, "plan", str(path), "--gpu", "4GB")
    user_error(code, err, words)


def test_one_byte_order_mark_is_read_as_editors_write_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _file(tmp_path, "w.yaml", "\ufeff" + DQN)
    code, _, err = run(capsys, "plan", str(path), "--gpu", "4GB")
    assert code == 0, err


def _laughs(levels: int, fan: int) -> str:
    lines = ["a0: &a0 [" + ", ".join(['"lol"'] * fan) + "]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * fan) + "]")
    return "name: x\nfamily: custom\n" + "\n".join(lines) + "\n"


@pytest.mark.parametrize(("levels", "fan"), [(9, 9), (30, 2), (4, 200)])
def test_yaml_aliases_that_expand_without_bound_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], levels: int, fan: int
) -> None:
    """A billion laughs: nine levels of nine aliases are 387 million values once expanded,
    from under a kilobyte. Counted on the composed graph, refused before anything walks it."""
    path = _file(tmp_path, "bomb.yaml", _laughs(levels, fan))
    code, _, err = run(capsys, "plan", str(path), "--gpu", "4GB")
    user_error(code, err, "aliases")


def test_a_few_aliases_are_fine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = _with(
        "  q_target:\n    target: true\n    conv:\n",
        "  q_target:\n    target: true\n    conv: &convs\n",
    )
    path = _file(tmp_path, "w.yaml", text)
    code, _, err = run(capsys, "plan", str(path), "--gpu", "4GB")
    assert code == 0, err


def test_a_file_and_set_refuse_the_same_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for value in ("0", "-3"):
        code, _, err = run(capsys, "plan", "dqn_fire_raster", "--gpu", "4GB", "--set",
                           f"batch_size={value}")  # fmt: skip
        user_error(code, err, "batch_size")
        path = _file(tmp_path, "w.yaml", _with("  batch_size: 128", f"  batch_size: {value}"))
        code, _, err = run(capsys, "plan", str(path), "--gpu", "4GB")
        user_error(code, err, "batch_size")


def _chain(n: int, loop: bool = False) -> str:
    heads = [f"  e{i}: {{trunk: e{i - 1}, layers: [50, 50]}}" for i in range(1, n)]
    text = "\n".join(heads).replace("trunk: e0,", "trunk: encoder,")
    if loop:
        text = text.replace("  e1: {trunk: encoder,", f"  e1: {{trunk: e{n - 1},")
    return SAC.replace("  actor: {trunk: encoder,", text + f"\n  actor: {{trunk: e{n - 1},")


def test_a_chain_of_3000_shared_encoders_is_checked(tmp_path: Path) -> None:
    """Checked walking each network once (a chain of 3000 took over a minute when each
    network walked its whole chain, and each step of it searched the chain so far)."""
    from memfit.core.workload import load_workload

    workload = load_workload(_file(tmp_path, "chain.yaml", _chain(3000)))
    assert len(workload.networks) == 3000 + 3
    with pytest.raises(ConfigError, match=r"networks loop through their trunks: .*\.\.\."):
        load_workload(_file(tmp_path, "loop.yaml", _chain(3000, loop=True)))


@pytest.mark.parametrize(
    "args",
    [
        ["plan", "dqn_fire_raster", "--gpu", "4GB", "--margin", "9" * 5000],
        ["plan", "dqn_fire_raster", "--gpu", "9" * 5000],
        ["env", "--for", "x" * 5000],
        ["plan", "dqn_fire_raster", "--gpu", "4GB", "--runtime", "module_loading=" + "x" * 5000],
    ],
)
def test_an_error_about_a_long_value_stays_short(
    capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    code, _, err = run(capsys, *args)
    user_error(code, err)
    assert len(err) < 2000 and "characters)" in err


@pytest.mark.parametrize("digits", [20, 25, 31, 40, 5000])
@pytest.mark.parametrize("where", ["file", "--set"])
def test_a_long_integer_is_refused_with_one_bound_in_message_and_hint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], digits: int, where: str
) -> None:
    """Issue 45: a 40-digit knob maximum said "memfit reads integers of at most 30" and then
    "Hint: ... at most 19 digits". Every reader states the same bound: 2**63, 19 digits."""
    number = "9" * digits
    if where == "file":
        assert "host_memory_bytes" not in DQN
        path = _file(tmp_path, "job.yaml", DQN + f"\nhost_memory_bytes: {number}\n")
        code, _, err = run(capsys, "check", str(path))
    else:
        code, _, err = run(capsys, "check", "dqn_fire_raster", "--set", f"buffer_size={number}")
    user_error(code, err)
    assert "2**63" in err and "at most 30" not in err, err
    assert len(err) < 600


@pytest.mark.parametrize("name", ["8GB", "x" * 5000, "1e308GB", "", "RTX 9999", "\u00b2", "0GB"])
@pytest.mark.parametrize("as_json", [False, True])
def test_a_target_config_of_what_is_not_a_card_is_a_clear_error(
    capsys: pytest.CaptureFixture[str], name: str, as_json: bool
) -> None:
    """The target-config surface (issue 45): a size, an unknown or absurd name is Error and
    Hint, exit 1, with nothing on stdout."""
    code, out, err = run(capsys, "gpus", name, "--target-config", *(["--json"] if as_json else []))
    user_error(code, err)
    assert len(err) < 2000
    if as_json:  # the error as JSON on stdout too, never a config
        import json

        assert json.loads(out)["error"] == "ConfigError"
    else:
        assert out == ""
