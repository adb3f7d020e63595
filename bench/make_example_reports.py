"""Run the three examples at their small settings and draw their reports for docs/guide.md.

Writes ``docs/report_dqn_fire.png``, ``docs/report_act_dual_camera.png`` and
``docs/report_brax_ppo.png`` (and the HTML pages next to the run logs in ``bench/out/``):

* DQN on fire rasters, small setting (``examples/dqn_fire/run.py``): OOMs injected in updates
  10-19, a cleanup after each checkpoint;
* the ACT dual-camera rollout with the simulated GPU squeezed to 24 MiB, so the policy call
  does not fit whole and ``RolloutGuard`` retries and splits it (the run with the habit
  ``cleanup.every(10)``);
* Brax PPO, small setting: on a CPU JAX reports no device memory, and the report says so.

Run: ``python bench/make_example_reports.py`` (about a minute on a laptop CPU; the Brax run
needs ``brax``, and is skipped without it).
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

from memfit.monitor.report import load_run
from memfit.monitor.report_html import write_html
from memfit.monitor.report_plot import write_png

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"


def _run(script: str, *args: str) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{script} failed:\n{(done.stdout + done.stderr)[-3000:]}")


def _draw(log: Path, name: str, title: str, docs: Path) -> None:
    run = load_run(log)
    png = write_png(run, docs / f"report_{name}.png", title=title)
    html = write_html(run, OUT / f"report_{name}.html", title=title)
    print(f"wrote {png} ({png.stat().st_size // 1024} KiB) and {html}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=Path, default=ROOT / "docs")
    args = parser.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)

    dqn = OUT / "dqn_fire.jsonl"
    _run("dqn_fire/run.py", "--log", str(dqn))
    _draw(
        dqn, "dqn_fire", "DQN on fire rasters: an injected OOM, a cleanup per checkpoint", args.docs
    )

    act = OUT / "act_dual_camera.jsonl"
    _run("act_dual_camera/run.py", "--budget", "24MiB", "--steps", "12", "--log", str(act))
    _draw(
        act.with_suffix(".every10.jsonl"),
        "act_dual_camera",
        "ACT dual-camera rollout on a 24 MiB simulated GPU: RolloutGuard splits the policy call",
        args.docs,
    )

    if importlib.util.find_spec("brax") is None:
        print("brax is not installed: the Brax report is left as it is")
        return 0
    brax = OUT / "brax_ppo.jsonl"
    with tempfile.TemporaryDirectory() as tmp:
        fitted = Path(tmp) / "fitted.yaml"
        _run("brax_ppo/run.py", "--tiers", "8", "--out", str(fitted), "--log", str(brax))
    _draw(brax, "brax_ppo", "Brax PPO (ant) on a CPU: JAX reports no device memory", args.docs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
