"""Issue 22: the README's training-loop snippet and the Isaac Lab docstring run as written."""

from __future__ import annotations

import math
import re
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest

import memfit
from memfit.integrations import isaaclab

ROOT = Path(__file__).resolve().parents[1]


def _readme_block(heading: str) -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split(heading, 1)[1]
    match = re.search(r"```python\n(.*?)```", section, flags=re.S)
    assert match is not None, f"no python block under {heading}"
    return match.group(1)


def test_the_readme_training_loop_runs_and_prints(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="torch is an optional extra (the README installs it)")
    # what the snippet calls "yours": a small classifier and three batches, on the CPU
    yours = textwrap.dedent(
        """
        import torch
        model = torch.nn.Linear(8, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = [{"x": torch.randn(4, 8), "y": torch.randint(0, 2, (4,))} for _ in range(3)]
        """
    )
    script = tmp_path / "loop.py"
    script.write_text(yours + _readme_block("## In your training loop"))
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "memfit: recording" in done.stderr and "memfit: step 0" in done.stderr
    assert done.stdout.strip() == "no leak found"
    assert (tmp_path / "run.jsonl").stat().st_size > 0


def _docstring_blocks(doc: str) -> list[str]:
    """The ``::`` literal blocks of a docstring, dedented."""
    blocks = []
    for part in doc.split("::\n")[1:]:
        lines = []
        for line in part.splitlines():
            if line.strip() and not line.startswith("    "):
                break
            lines.append(line)
        blocks.append(textwrap.dedent("\n".join(lines)).strip() + "\n")
    return blocks


class _Cfg:  # Isaac Lab's config classes: keyword arguments kept as attributes
    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)


def test_the_isaac_lab_docstring_runs_as_written(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    torch = pytest.importorskip("torch", reason="torch is an optional extra")
    from memfit.backends.simulated import SimulatedDevice
    from memfit.runtime import autoconfig as runtime_autoconfig

    # Isaac Lab and Isaac Sim do not install here: stand-ins with their documented shapes
    managers = types.ModuleType("isaaclab.managers")
    managers.EventTermCfg = _Cfg  # type: ignore[attr-defined]
    managers.ObservationTermCfg = _Cfg  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "isaaclab", types.ModuleType("isaaclab"))
    monkeypatch.setitem(sys.modules, "isaaclab.managers", managers)

    class Env:  # what gym.make gives for an Isaac Lab task: .unwrapped with num_envs, device
        num_envs = 2
        device = "cuda:0"
        unwrapped: Any = None

    Env.unwrapped = Env()
    gym = types.SimpleNamespace(make=lambda name, cfg: Env())
    mdp = types.SimpleNamespace(image=lambda env, sensor_cfg, data_type: torch.zeros(2, 4, 4, 3))
    # the simulator started with the env: 4 GiB of the 8 GiB card in use
    real = runtime_autoconfig.read_device
    card = SimulatedDevice("8GiB", used_by_others="4GiB")
    monkeypatch.setattr(
        runtime_autoconfig, "read_device", lambda device, probe=None: real(device, probe=card)
    )
    namespace: dict[str, Any] = {"memfit": memfit, "torch": torch, "gym": gym, "mdp": mdp,
                                 "env_cfg": object(),
                                 "SceneEntityCfg": lambda name: _Cfg(name=name)}  # fmt: skip
    blocks = _docstring_blocks(isaaclab.__doc__ or "")
    assert len(blocks) == 3
    for block in blocks[:2]:
        exec(compile(block, "isaaclab docstring", "exec"), namespace)
    assert namespace["cfg"].knobs == {"num_envs": 2}
    assert "headroom" in capsys.readouterr().out
    assert callable(namespace["rgb"].func) and namespace["cleanup"].mode == "interval"


def test_the_isaac_lab_measuring_lines_run_as_written(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The lines a user adds to measure Isaac Sim (the module docstring's third block), with
    a stand-in env whose memory is known on a simulated card: the measurement finds it."""
    torch = pytest.importorskip("torch", reason="torch is an optional extra")
    from memfit.backends.simulated import SimulatedDevice
    from memfit.runtime import sim_measure

    card = SimulatedDevice("24GiB", name="NVIDIA GeForce RTX 4090", used_by_others="3GiB")
    per_env, per_pixel = 100_000, 250

    class Env:  # a task's env: its memory grows with num_envs and the tiled camera's pixels
        def __init__(self, cfg: Any) -> None:
            n, cam = cfg.num_envs, cfg.tiled_camera
            tiles = math.ceil(math.sqrt(n)) ** 2  # a square of tiles, as the plan counts it
            self.nbytes = per_env * n + per_pixel * tiles * cam.height * cam.width
            card.allocate(self.nbytes)
            self.num_envs, self.device = n, "cpu"
            self.unwrapped = self
            self.action_space = types.SimpleNamespace(shape=(n, 1))

        def step(self, actions: Any) -> None:
            assert actions.shape == (self.num_envs, 1)

        def close(self) -> None:
            card.release(self.nbytes)

    monkeypatch.setenv("MEMFIT_CACHE_DIR", str(tmp_path))
    real = sim_measure._probe_reader
    monkeypatch.setattr(sim_measure, "_probe_reader", lambda device, probe: real(device, card))
    namespace: dict[str, Any] = {
        "mf": isaaclab,
        "torch": torch,
        "TASK": "Isaac-Cartpole-RGB-Camera-Direct-v0",
        "parse_env_cfg": lambda task, num_envs: _Cfg(
            num_envs=num_envs, tiled_camera=_Cfg(height=0, width=0)
        ),
        "gym": types.SimpleNamespace(make=lambda task, cfg: Env(cfg)),
    }
    block = _docstring_blocks(isaaclab.__doc__ or "")[2]
    exec(compile(block, "isaaclab docstring", "exec"), namespace)
    m = namespace["m"]
    assert m.per_env_bytes == per_env and m.pixel_bytes == pytest.approx(per_pixel, abs=0.01)
    assert list(tmp_path.glob("measurements/simulator-isaac-sim-nvidia-geforce-rtx-4090-*.json"))
