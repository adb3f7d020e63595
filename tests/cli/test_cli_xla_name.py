"""Issue 22: recommend the XLA pool-fraction name the installed jax reads; accept both."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
from _cli_run import run, run_json

from memfit.allocator.settings import recommend
from memfit.allocator.settings_check import check_jax_env
from memfit.runtime import allocator_env

NEW, OLD = "XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"


def _fake_jaxlib(monkeypatch: pytest.MonkeyPatch, folder: Path, source: str | None) -> None:
    if source is not None:
        folder.mkdir(exist_ok=True)
        (folder / "xla_client.py").write_text(source)
    real = importlib.util.find_spec

    def find_spec(name: str, *args: object) -> object:
        if name == "jaxlib":
            return None if source is None else SimpleNamespace(submodule_search_locations=[
                str(folder)])  # fmt: skip
        return real(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


@pytest.mark.parametrize(
    ("source", "name"),
    [
        (f"memory_fraction = os.getenv('{NEW}', '')\nold = os.getenv('{OLD}', '')\n", NEW),
        (f"memory_fraction = os.getenv('{OLD}', '')\n", OLD),
        (None, OLD),  # no jaxlib: the name every version reads
    ],
)
def test_the_name_follows_the_installed_jaxlib(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, source: str | None, name: str
) -> None:
    _fake_jaxlib(monkeypatch, tmp_path / "jaxlib", source)
    found, why = allocator_env.jax_fraction_name()
    assert found == name and name in why


def test_env_recommends_that_name_and_says_why(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(NEW, raising=False)
    monkeypatch.delenv(OLD, raising=False)
    for name, source in ((NEW, f"os.getenv('{NEW}')\n"), (OLD, f"os.getenv('{OLD}')\n")):
        _fake_jaxlib(monkeypatch, tmp_path / name, source)
        data = run_json(capsys, "env", "--json", "--gpu", "RTX 4070")
        assert [s["variable"] for s in data["settings"] if s["framework"] == "jax"] == [name]
        assert f"export {name}=0.90" in data["script"]
        assert any(n.startswith(f"{name}: the installed jaxlib reads") for n in data["notes"])


def test_both_names_are_accepted_but_not_together(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert check_jax_env({NEW: "0.9"}) == [] and check_jax_env({OLD: "0.9"}) == []
    assert check_jax_env({NEW: "0.9", OLD: "0.9"})
    rec = recommend("shared-gpu", jax_fraction_variable=NEW)
    assert NEW in rec.environ() and OLD not in rec.environ()
    monkeypatch.delenv(OLD, raising=False)
    monkeypatch.setenv(NEW, "0.8")
    data = run_json(capsys, "env", "--json")
    assert data["current"] == {NEW: "0.8"} or NEW in data["current"]
    assert not [p for p in data["problems"] if p["variable"] in (NEW, OLD)]
    monkeypatch.setenv(OLD, "0.8")
    code, _, _ = run(capsys, "env", "--json")
    assert code == 1  # both set: a newer JAX refuses to start its GPU backend


@pytest.mark.parametrize("name", [NEW, OLD])
def test_plan_and_env_set_the_one_name_the_installed_jax_reads(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str
) -> None:
    """Issue 32: plan printed the old name and env the new one; with both exported a newer
    jaxlib refuses to start. Both now set the one name the installed jaxlib reads."""
    _fake_jaxlib(monkeypatch, tmp_path / "jaxlib", f"os.getenv('{name}')\n")
    other = OLD if name == NEW else NEW
    plan = run_json(capsys, "plan", "brax_humanoid_ppo", "--gpu", "RTX 4070", "--json")
    assert plan["environment"][name] == "0.90" and other not in plan["environment"]
    assert f"{name}=0.90: one JAX job owns the GPU" in "\n".join(plan["notes"])
    assert other not in "\n".join(n for n in plan["notes"] if n.startswith(name + "="))
    env = run_json(capsys, "env", "--json", "--gpu", "RTX 4070")
    assert {s["variable"]: s["value"] for s in env["settings"] if s["framework"] == "jax"} == {
        name: "0.90"
    }
    code, out, _ = run(capsys, "plan", "brax_humanoid_ppo", "--gpu", "RTX 4070")
    assert code == 0 and f"export {name}=0.90" in out and f"export {other}" not in out
    assert f"({name}=0.90)" in out  # the pool line names the same variable
