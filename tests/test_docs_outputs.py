"""Every command output shown in README.md and docs/*.md is what the code prints now (issue 32).

``bench/docs_outputs.py`` runs the shown commands and compares; the examples' runs are
checked by ``pytest -m examples`` (tests/examples/test_examples.py). When this fails, a change
of the code changed a shown output: regenerate them with ``python bench/docs_outputs.py
--write`` and commit the docs.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "docs_outputs.py"


def _module() -> object:
    spec = importlib.util.spec_from_file_location("docs_outputs", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_every_shown_output_matches_the_code() -> None:
    pytest.importorskip("torch", reason="the README's explain example runs torch code")
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--check", "--only", "fast"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert done.returncode == 0, (
        f"{done.stdout[-6000:]}{done.stderr[-3000:]}\n"
        "a shown output in README.md or docs/ no longer matches what the code prints: run "
        "`python bench/docs_outputs.py --write` and commit the docs"
    )


def test_the_small_shell_runs_what_the_docs_show(tmp_path: Path) -> None:
    docs = _module()
    (tmp_path / "a.txt").write_text("one\ntwo\nthree\nfour\n")
    run = docs.run_shell  # type: ignore[attr-defined]
    assert run("head -2 a.txt", tmp_path) == "one\ntwo\n"
    state: dict[str, int] = {}
    out = run("memfit check brax_humanoid_ppo --set num_envs=1000", tmp_path, state)
    assert "Error:" in out and state["code"] == 1
    assert run("echo $?", tmp_path, state) == "1\n"
    out = run("memfit gpus 4060 > g.txt && head -1 g.txt", tmp_path)
    assert out.startswith("note: 4060 is read as") and out.endswith("NVIDIA GeForce RTX 4060\n")
    out = run('memfit plan dqn_fire_raster --gpu 4060 --json | grep -A1 "knobs"', tmp_path)
    assert out.splitlines()[0].strip() == '"knobs": {' and "buffer_size" in out
    assert docs.normalise("took 12.3 s, 4.50 MiB, rollout +0.53 s faster") == (  # type: ignore[attr-defined]
        "took # s, 4.50 MiB, rollout # s #"
    )
    # which of two timings was larger changes from run to run: its sign too
    assert docs.normalise("rollout -0.20 s slower") == docs.normalise("rollout +1.25 s faster")  # type: ignore[attr-defined]
    assert docs.normalise("every10   10.52  3") == docs.normalise("every10    3.44  3")  # type: ignore[attr-defined]
