"""Issue 22, "the README's promise": what a user meets after exactly the README's setup."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from _cli_run import run, run_json

from memfit.estimate import brax_measure as bm
from memfit.hardware.catalog import list_gpus
from memfit.runtime import allocator_env

ROOT = Path(__file__).resolve().parents[2]


def _extras(text: str, where: str) -> list[str]:
    """The extras of every ``pip install -e ".[...]"`` in ``text`` (exactly one expected)."""
    found = re.findall(r'pip install (?:-q )?-e "\.\[([a-z0-9_,-]+)\]"', text)
    assert len(found) == 1, f"{where}: expected one editable install line, found {found}"
    return found[0].split(",")


def test_the_readme_setup_and_ci_install_the_same_extras() -> None:
    readme = _extras((ROOT / "README.md").read_text(encoding="utf-8"), "README.md")
    ci = _extras((ROOT / ".ci" / "run").read_text(encoding="utf-8"), ".ci/run")
    assert readme == ci
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    section = pyproject.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    optional = dict(re.findall(r"(?m)^([a-z0-9_-]+) = \[(.*?)\]$", section, flags=re.S))
    assert set(readme) <= set(optional), set(readme) - set(optional)
    # the brax tests' package comes from the README's own line
    assert any("brax" in optional[name] for name in readme)
    # and the README says how GPU users get a CUDA jax
    assert 'pip install -U "jax[cuda12]"' in (ROOT / "README.md").read_text(encoding="utf-8")


def test_ci_runs_every_test_command_the_readme_names() -> None:
    """Issue 32: the README named ``pytest -m examples`` and CI never ran it (it failed). CI
    runs each ``pytest`` line of the README's Test section, and together they run every test:
    the quick suite leaves out exactly the marks the second command selects."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Test\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.S)
    assert block is not None, "the README's Test section lost its commands"
    commands = [line.split("  #")[0].strip() for line in block.group(1).splitlines()]
    commands = [c for c in commands if c.startswith("pytest")]
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert len(commands) >= 2 and all(c in ci for c in commands), (commands, ci)
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert "-m 'not examples and not slow'" in pyproject
    assert 'pytest -q -m "slow or examples"' in commands


@pytest.mark.parametrize(
    ("missing", "said"),
    [
        (["brax"], "brax is not installed here"),
        (["brax", "jax"], "brax and jax are not installed here"),
    ],
)
def test_the_plan_note_names_what_is_missing(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    missing: list[str],
    said: str,
) -> None:
    monkeypatch.setattr(bm, "missing_packages", lambda: missing)
    data = run_json(capsys, "plan", "brax_humanoid_ppo", "--gpu", "T4", "--json")
    assert data["notes"][0].startswith(said + ": measurements recorded in the workload")
    code, _, err = run(capsys, "plan", "brax_humanoid_ppo", "--gpu", "T4", "--measure", "fresh")
    assert code == 1 and "not installed" in err and "pip install " + missing[0] in err


def test_missing_packages_reads_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib import metadata

    real = metadata.version

    def version(name: str) -> str:
        if name == "brax":
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(bm.metadata, "version", version)
    assert "brax" in bm.missing_packages()
    assert bm.installed_versions() is None


def test_env_warns_about_a_cpu_only_jax_on_a_gpu_machine(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
    monkeypatch.setattr(allocator_env, "nvidia_gpu_present", lambda: True)
    monkeypatch.setattr(allocator_env, "jax_build", lambda: "cpu")
    data = run_json(capsys, "env", "--json")
    [problem] = [p for p in data["problems"] if p["code"] == "cpu-only-jax"]
    assert problem["severity"] == "warning" and "jax[cuda12]" in problem["hint"]
    code, out, err = run(capsys, "env")
    assert code == 0 and "CPU-only build" in out
    code, _, err = run(capsys, "env", "--strict")
    assert code == 1 and "jax[cuda12]" in err
    # a CUDA jax, or no GPU: nothing to say
    monkeypatch.setattr(allocator_env, "jax_build", lambda: "cuda")
    problems = run_json(capsys, "env", "--json")["problems"]
    assert not [p for p in problems if p["code"] == "cpu-only-jax"]
    monkeypatch.setattr(allocator_env, "jax_build", lambda: "cpu")
    monkeypatch.setattr(allocator_env, "nvidia_gpu_present", lambda: False)
    assert allocator_env.check_jax_install() == []


def test_jax_build_and_gpu_presence_read_the_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from importlib import metadata

    versions = {"jaxlib": "0.10.0"}

    def version(name: str) -> str:
        if name in versions:
            return versions[name]
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", version)
    assert allocator_env.jax_build() == "cpu"
    versions["jax-cuda12-plugin"] = "0.10.0"
    assert allocator_env.jax_build() == "cuda"
    versions.clear()
    assert allocator_env.jax_build() is None
    gpus = tmp_path / "gpus"
    gpus.mkdir()
    assert not allocator_env.nvidia_gpu_present(gpus, tmp_path / "nvidia0")
    (gpus / "0000:01:00.0").mkdir()
    assert allocator_env.nvidia_gpu_present(gpus, tmp_path / "nvidia0")


def test_gpus_reads_a_bare_number_as_the_card(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "gpus", "4060")
    assert code == 0 and "NVIDIA GeForce RTX 4060" in out and "8188MiB" in out
    assert "read as the NVIDIA GeForce RTX 4060" in err and "4060MiB" in err
    code, out, err = run(capsys, "gpus", "RTX 4060 Laptop GPU")
    assert code == 0 and "NVIDIA GeForce RTX 4060 Laptop GPU" in out and not err
    code, _, err = run(capsys, "gpus", "4096")
    assert code == 1 and "needs a unit" in err and "4096MiB" in err


def test_piped_tables_keep_every_word(capsys: pytest.CaptureFixture[str]) -> None:
    """capsys is not a terminal, as a pipe is not: no cell is cut or folded (issue 22)."""
    code, out, _ = run(capsys, "plan", "brax_humanoid_ppo", "--all-gpus")
    assert code == 0 and "knob range, not memory" in out
    rows = [line for line in out.splitlines() if line.startswith("│")]
    # a wrapped row would continue on a line whose first cell (the GPU) is empty
    assert rows and all(row.split("│")[1].strip() for row in rows), out
    code, out, _ = run(capsys, "gpus")
    rows = [line for line in out.splitlines() if line.startswith("│")]
    assert len(rows) == len(list_gpus())  # one line per GPU: no name wrapped over two
