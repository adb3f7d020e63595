"""Reading it (issue 46, item 10): ``memfit env`` piped stays narrow; help shows the
--reading and --runtime formats whole; the jaxlib name note is not on every plan;
``memfit examples`` has descriptions; commands listed in workflow order; a Plan's repr is
one line; the guide installs as the README does."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from _cli_run import run

import memfit
from memfit.allocator.xla_fraction import FRACTION_VARIABLES, xla_fraction_variable
from memfit.cli.main import COMMANDS

ROOT = Path(__file__).resolve().parents[2]


def test_env_piped_is_at_most_120_columns(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "env")
    assert code == 0, err
    table = out.split("# paste into")[0]
    assert max(len(line) for line in table.splitlines()) <= 120
    assert "why" in table


@pytest.mark.parametrize(
    ("args", "formats"),
    [
        (["simulator", "--help"], ["num_envs=64:7.9GB", "COUNTxHxW", "standard=HxW"]),
        (["plan", "--help"], ["torch=2.5.1,cuda=12.1", "module_loading=lazy or eager"]),
    ],
)
def test_help_keeps_the_formats_whole(
    args: list[str],
    formats: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = run(capsys, *args)
    assert code == 0, err
    assert "…" not in out
    flat = re.sub(r"[\s│]+", " ", out)
    for text in formats:
        assert text in flat, text


def test_the_jaxlib_name_note_is_not_on_every_plan() -> None:
    plan = memfit.plan("brax_humanoid_ppo", gpu="RTX 4070")
    name, why = xla_fraction_variable()
    if name == FRACTION_VARIABLES[0]:
        assert f"{name}: {why}" not in plan.notes
    assert any(n.startswith(f"{name}=") for n in plan.notes)  # the setting is still said


def test_examples_have_a_description(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _err = run(capsys, "examples")
    assert code == 0 and "description" in out and "bimanual" in out
    assert max(len(line) for line in out.splitlines()) <= 160


def test_commands_in_workflow_order() -> None:
    names = list(COMMANDS)
    assert names[:2] == ["plan", "check"]
    assert names.index("estimate") < names.index("fit") < names.index("env")
    assert names.index("watch") < names.index("report") < names.index("explain")


def test_a_plan_repr_is_one_short_line() -> None:
    text = repr(memfit.plan("act_dual_camera", gpu="RTX 4060 Ti 8GB"))
    assert "\n" not in text and len(text) < 200
    assert text.startswith("Plan('NVIDIA GeForce RTX 4060 Ti', fits=True, num_envs=")
    assert "GiB of" in text and "breakdown" not in text


def test_the_guide_installs_as_the_readme_does() -> None:
    readme = (ROOT / "README.md").read_text()
    setup = readme.split("## Setup", 1)[1]
    line = re.search(r"```bash\n(.+?)\n```", setup, re.S)
    assert line is not None
    assert line.group(1).strip() in (ROOT / "docs" / "guide.md").read_text()
