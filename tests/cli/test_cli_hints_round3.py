"""Hints that fit the case (issue 46, item 8): no "lower --margin" for a gap far larger than
the margin; ``memfit fit`` on a JAX workload says fit runs PyTorch steps; ``explain`` of a
``simulate_gpu`` snapshot prints no replay of a run that had no allocator and no row that
"does not fit" under a capacity its peak is below."""

from __future__ import annotations

from pathlib import Path

import pytest
from _cli_run import run, user_error

import memfit
from memfit.errors import InfeasiblePlan

MiB = 2**20


def test_a_gap_far_over_the_margin_does_not_suggest_lowering_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(InfeasiblePlan) as info:
        memfit.plan("brax_mjx_sac@as_reported", gpu="RTX 4090")
    assert "--margin" not in (info.value.hint or "")
    code, _out, err = run(
        capsys, "plan", "dqn_fire_raster", "--gpu", "4GiB", "--set", "buffer_size=1000000"
    )
    assert code == 1 and "Hint:" in err
    assert "--margin" not in err.split("Hint:")[-1]


def test_margin_hint_only_where_the_margin_could_close_the_gap() -> None:
    from memfit.core.plan_explain import margin_hint

    class _Budget:
        margin_bytes = 400 * MiB

    assert margin_hint(100 * MiB, _Budget()) == ", or lower --margin"  # type: ignore[arg-type]
    assert margin_hint(28 * 1024 * MiB, _Budget()) == ""  # type: ignore[arg-type]


def test_fit_on_a_jax_workload_says_fit_is_pytorch_only(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _out, err = run(capsys, "fit", "brax_humanoid_ppo", "--device", "cpu", "--budget", "2GiB")
    user_error(code, err, "memfit fit runs PyTorch steps", "jax workload", "memfit plan")


def test_explain_of_a_simulated_snapshot(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from memfit.monitor.explain_render import png_bytes, render_text

    keep: list[object] = []
    with (
        pytest.raises(torch.OutOfMemoryError),
        memfit.simulate_gpu("12MiB"),
        memfit.Recorder(tmp_path / "run.jsonl", log=False) as rec,
    ):
        for step in range(40):
            keep.append(torch.zeros(256 * 1024))
            x = torch.ones(512 * 1024) * 2
            del x
            rec.step(step=step)
    snapshot = next(p for p in rec.oom_files if p.suffix == ".pickle")
    e = memfit.explain(snapshot)
    assert e.simulated and e.capacity_bytes == 12 * MiB
    text = "\n".join(render_text(e))
    rows = text.split("4. What if")[1].split("=>")[0].splitlines()
    assert not any(r.strip().startswith("as recorded") for r in rows)
    for row in rows:
        if "does not fit under" in row and "then a request" not in row:
            peak = row.split("peak")[1].split("MiB")[0]
            assert float(peak) > 12, row
    assert png_bytes(e).startswith(b"\x89PNG")
    del keep
