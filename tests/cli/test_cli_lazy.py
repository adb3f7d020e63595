"""`memfit --help` lists every command without importing one (issue 23); a command imports
its own module when it runs, and the static table says what each command's own help says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from memfit.cli import main as cli_main

SRC = str(Path(cli_main.__file__).resolve().parents[2])

#: Modules `memfit --help` must leave unimported: the schema, the planner, every command.
HEAVY = (
    "pydantic",
    "yaml",
    "memfit.core",
    "memfit.core.workload",
    "memfit.core.plan",
    "memfit.planning",
    "memfit.monitor",
    "memfit.cli._common",
    "rich.console",  # the root help is plain text
    *(f"memfit.cli.{m}" for m in cli_main.COMMAND_MODULES),
)


def _fresh(*argv: str) -> tuple[int, str, list[str]]:
    """Run the CLI in a fresh interpreter: exit code, stdout, and the modules it imported."""
    code = (
        "import json, sys\n"
        "from memfit.cli.main import main\n"
        f"rc = main({list(argv)!r})\n"
        "sys.stdout.flush()\n"
        "sys.stderr.write('\\nMODULES ' + json.dumps(sorted(sys.modules)) + '\\n')\n"
        "sys.exit(rc)\n"
    )
    env = {**os.environ, "PYTHONPATH": SRC, "COLUMNS": "120"}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    line = next(x for x in proc.stderr.splitlines() if x.startswith("MODULES "))
    return proc.returncode, proc.stdout, json.loads(line[len("MODULES ") :])


def test_root_help_lists_every_command_and_imports_none() -> None:
    code, out, modules = _fresh("--help")
    assert code == 0
    for name, (_module, text) in cli_main.COMMANDS.items():
        assert name in out
        assert text.split()[0] in out
    loaded = [m for m in HEAVY if m in modules]
    assert loaded == [], loaded


def test_a_command_imports_its_own_module_only() -> None:
    code, out, modules = _fresh("gpus", "--json")
    assert code == 0 and json.loads(out)
    assert "memfit.cli.gpus" in modules
    others = [f"memfit.cli.{m}" for m in cli_main.COMMAND_MODULES if m != "gpus"]
    assert [m for m in others if m in modules] == []
    # the catalog needs no workload schema (Typer itself may import pydantic to coerce options)
    assert "memfit.core.workload" not in modules and "memfit.core.plan" not in modules


def test_the_table_says_what_each_command_says() -> None:
    """Each line of COMMANDS is its command's own help, and every command a module registers
    has its line (so a new command cannot be missing from `memfit --help`)."""
    for module in cli_main.COMMAND_MODULES:
        holder = typer.Typer()
        __import__(f"memfit.cli.{module}", fromlist=["register"]).register(holder)
        group = typer.main.get_command(holder)
        commands = getattr(group, "commands", None) or {group.name: group}
        for name, command in commands.items():
            assert name in cli_main.COMMANDS, f"{module} registers {name}, not in COMMANDS"
            table_module, text = cli_main.COMMANDS[name]
            assert table_module == module
            assert (command.help or "").strip().splitlines()[0] == text


def test_unknown_command_still_suggests(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main.main(["plna"]) == 2
    assert "Did you mean 'plan'" in capsys.readouterr().err


def test_root_help_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main.main([]) == 0
    out = capsys.readouterr().out
    assert "Usage: memfit [OPTIONS] COMMAND [ARGS]..." in out
    assert "--version" in out and "--debug" in out and "examples" in out


def test_root_help_fits_the_terminal_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "60")
    group = typer.main.get_command(cli_main.app)
    ctx = group.make_context("memfit", ["--help"], resilient_parsing=True)
    lines = cli_main._root_help(group, ctx).splitlines()  # type: ignore[arg-type]
    assert max(len(line) for line in lines) == 60
    assert sum(1 for line in lines if "Show each GPU" in line) == 1
