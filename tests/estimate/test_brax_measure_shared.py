"""Issue 43: measuring a Brax env as users meet it: the steps exported for CUDA shared by every
card, an estimate of the time left, and JAX's start-up noise kept out of memfit's output."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from memfit.estimate import brax_measure as bm
from memfit.estimate._brax_exports import shared_exports
from memfit.estimate.xla import gpu as xla_gpu

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
pytest.importorskip("flatbuffers")


def _jobs(callback: bool) -> Any:
    def step(x: Any) -> Any:
        if callback:
            jax.debug.callback(lambda v: None, x.sum())
        return jnp.tanh(x) * 2

    return [(jax.jit(step, donate_argnums=0), (jax.ShapeDtypeStruct((64, 8), jnp.float32),))]


def test_exported_steps_are_written_once_and_read_back_for_the_next_card(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "brax_ppo-key.exported" / "train"
    calls: list[int] = []

    def build() -> Any:
        calls.append(1)
        return _jobs(True), {"sizes": [{"training_state_bytes": 12}]}

    first, extra = shared_exports(build, folder)
    assert calls == [1] and extra == {"sizes": [{"training_state_bytes": 12}]}
    assert first[0].route == "callbacks" and first[0].donate == (0,)

    def must_not_build() -> Any:
        raise AssertionError("the second card rebuilt the steps")

    again, extra2 = shared_exports(must_not_build, folder)
    assert extra2 == extra
    assert again == first  # serialization, donations, mesh, callbacks' bytes: all kept


def test_a_damaged_share_is_built_again(tmp_path: Path) -> None:
    folder = tmp_path / "share"
    folder.mkdir()
    (folder / "meta.json").write_text("{not json", encoding="utf-8")
    steps, _ = shared_exports(lambda: (_jobs(False), {}), folder)
    assert steps[0].route == "export"


def test_the_time_left_is_the_first_stage_scaled() -> None:
    assert bm.time_left(30.0, bm.ENV_STAGE_SHARE) == " (about 70 s left)"
    assert bm.time_left(60.0, 0.5) == " (about 60 s left)"
    assert bm.time_left(600.0, 0.5) == " (about 10 min left)"
    assert bm.time_left(10.0, 1.0) == ""


@pytest.mark.slow  # a fresh Python that imports JAX: about 10 s on the 2-core VM
@pytest.mark.skipif(
    bool(xla_gpu.gpu_target_missing()), reason="the CUDA plugin (gpu-target extra) makes the noise"
)
def test_jax_starts_without_the_cuda_plugins_noise() -> None:
    code = (
        "import os, sys\n"
        "from memfit.estimate.xla._quiet import quiet_jax_start\n"
        "quiet_jax_start()\n"
        "import jax\n"
        "print(jax.default_backend())\n"
        "os.write(2, b'kept\\n')\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "JAX_PLATFORMS"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert done.stdout.strip().splitlines()[-1] in ("cpu", "gpu", "cuda")
    for noise in ("Unable to load CUDA", "cudart_stub", "absl::InitializeLog"):
        assert noise not in done.stderr, done.stderr
    assert "kept" in done.stderr  # what comes after the start is left alone


def test_the_compiles_for_a_card_are_spread_over_child_processes_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import types

    calls: list[list[int]] = []

    def fake(steps: list[int], target: Any, *, memory_base_bytes: int) -> list[Any]:
        calls.append(list(steps))
        assert memory_base_bytes == 750
        return [
            types.SimpleNamespace(
                argument_bytes=s, output_bytes=2 * s, alias_bytes=0, device_temp_bytes=3 * s
            )
            for s in steps
        ]

    monkeypatch.setattr(xla_gpu, "compile_exported", fake)
    monkeypatch.setattr(bm.os, "cpu_count", lambda: 2)
    target = types.SimpleNamespace(device_memory_size=1000)
    got = bm._compile_exported_all([1, 2, 3, 4, 5], target)
    assert got == [(s, 2 * s, 0, 3 * s) for s in (1, 2, 3, 4, 5)]
    assert sorted(calls) == [[1, 3, 5], [2, 4]]  # two children side by side, on 2 cores
    assert bm.compile_children(5, 1) == 1 and bm.compile_children(2, 64) == 2
    assert bm.compile_children(9, 64) == bm.MAX_COMPILE_CHILDREN


def test_brax_s_maintenance_notice_is_kept_out_and_nothing_else() -> None:
    import warnings

    from memfit.estimate.xla._quiet import BRAX_NOTICE, quiet_brax_notices

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_brax_notices()
        warnings.warn(BRAX_NOTICE + ". Please see MJX ...", UserWarning, stacklevel=1)
        warnings.warn("the user's own warning", UserWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["the user's own warning"]
