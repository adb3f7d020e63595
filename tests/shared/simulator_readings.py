"""Published device-memory readings of GPU simulators
(``tests/data/published_truth/simulators/``), rebuilt as workloads and planned with
:func:`memfit.plan`: the runs, the plan of each and its error. ``bench/simulator_truth.py``
writes the table (its docstring says how each figure is obtained); tests/core/
test_simulator_truth.py and test_simulator_lab3.py check the same comparison."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

DATA = Path(__file__).resolve().parents[2] / "tests" / "data" / "published_truth" / "simulators"


#: Goals on the held-out readings (issue 33): mean |error| and worst |error|.
GOAL_MEAN = 0.10


GOAL_WORST = 0.25


#: The simulator terms memfit had before issue 33 (``isaac_sim`` preset): bytes at start and
#: bytes per camera pixel per env; nothing per env.
BEFORE_BASE = round(3.5 * 2**30)


BEFORE_PIXEL = 1800


@dataclass(frozen=True)
class Run:
    """One published reading and the workload that rebuilds it."""

    series: str
    name: str
    role: str
    workload: dict[str, Any]
    measured: float
    unit_bytes: int
    rounding: str
    gpu: str
    gpu_total: str | None
    runtime: dict[str, str]
    source: str
    versions: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """``series/name``."""
        return f"{self.series}/{self.name}"

    @property
    def measured_bytes(self) -> float:
        """The figure read, in bytes."""
        return self.measured * self.unit_bytes

    @property
    def tolerance_bytes(self) -> float:
        """Half the interval the source's rounding leaves."""
        if self.rounding.startswith("nearest_"):
            return float(self.rounding.removeprefix("nearest_")) / 2 * self.unit_bytes
        return 0.0


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _run_workload(data: dict[str, Any], item: dict[str, Any]) -> dict[str, Any]:
    """The run's workload document: the file's (or the run's own), with the run's
    ``num_envs``, ``cameras``, ``scene`` and ``settings`` put in."""
    doc = copy.deepcopy(item.get("workload") or data["workload"])
    doc.setdefault("name", "published_run")
    settings = dict(item.get("settings") or {})
    if "num_envs" in item:
        settings["num_envs"] = item["num_envs"]
        if (doc.get("ppo") or {}).get("layout") == "rl_games":
            settings["num_actors"] = item["num_envs"]
    doc["settings"] = {**doc.get("settings", {}), **settings}
    sim = doc.get("simulator")
    if sim is not None:
        extra: dict[str, Any] = {}
        if "cameras" in item:
            extra["cameras"] = item["cameras"]
        if "scene" in item:
            extra["scene"] = {"robot": item["scene"]}
        extra.update(item.get("simulator") or {})
        doc["simulator"] = _merge(sim, extra)
    return doc


def load_runs(root: Path = DATA) -> list[Run]:
    """Every run of every source file, in file order."""
    runs: list[Run] = []
    for path in sorted(root.glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        for item in data["runs"]:
            runs.append(
                Run(
                    series=path.stem,
                    name=str(item["name"]),
                    role=item["role"],
                    workload=_run_workload(data, item),
                    measured=float(item["measured"]),
                    unit_bytes=int(data["unit_bytes"]),
                    rounding=data["rounding"],
                    gpu=item.get("gpu", data["gpu"]),
                    gpu_total=item.get("gpu_total", data.get("gpu_total")),
                    runtime=dict(data.get("runtime") or {}),
                    source=data["source"]["url"],
                    versions=dict(data.get("versions") or {}),
                )
            )
    return runs


def gpu_of(run: Run) -> Any:
    """The run's card (its stated size where the catalog lists another version)."""
    import memfit
    from memfit.units import parse_bytes

    spec = memfit.gpu(run.gpu)
    if run.gpu_total is not None:
        spec = replace(spec, total_bytes=parse_bytes(run.gpu_total))
    return spec


def workload_of(run: Run, simulator: dict[str, Any] | None = None, drop: bool = False) -> Any:
    """The run's workload; ``simulator`` overrides its simulator section, ``drop`` removes it."""
    from memfit.core.workload import Workload

    doc = copy.deepcopy(run.workload)
    if drop:
        doc.pop("simulator", None)
    elif simulator is not None:
        doc["simulator"] = _merge(doc.get("simulator") or {}, simulator)
    return Workload.model_validate(doc)


def plan_bytes(run: Run, workload: Any) -> int:
    """The predicted device footprint of ``workload`` on the run's card, every knob as set."""
    import memfit

    plan = memfit.plan(
        workload,
        gpu=gpu_of(run),
        overrides=dict(workload.settings),
        margin=0.0,
        runtime=run.runtime or None,
        measure="recorded",
    )
    return int(plan.predicted_bytes)


def _before_simulator(run: Run) -> int:
    """The pre-issue-33 simulator terms: 3.5 GiB + 1,800 B per camera pixel per env."""
    doc = run.workload
    sim = doc.get("simulator") or {}
    if sim.get("preset") != "isaac_sim":
        return 0
    envs = int(doc["settings"].get("num_envs", 1))
    pixels = 0
    for cam in sim.get("cameras") or []:
        pixels += int(cam.get("count", 1)) * int(cam["height"]) * int(cam["width"])
    obs = (doc.get("observations") or {}).get("cameras")
    if not sim.get("cameras") and obs:
        pixels = int(obs.get("count", 1)) * int(obs["height"]) * int(obs["width"])
    return BEFORE_BASE + envs * pixels * BEFORE_PIXEL


@dataclass(frozen=True)
class Outcome:
    """What memfit predicts for a run and its error."""

    predicted_bytes: int
    error: float


def predict(run: Run, model: str = "after") -> Outcome:
    """Plan the run: with today's simulator terms (``after``) or the pre-issue ones."""
    if model == "before":
        predicted = plan_bytes(run, workload_of(run, drop=True)) + _before_simulator(run)
    else:
        predicted = plan_bytes(run, workload_of(run))
    return Outcome(predicted, predicted / run.measured_bytes - 1.0)
