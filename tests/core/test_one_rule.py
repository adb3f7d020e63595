"""Issue 41, item 7: one rule everywhere. ``env --check`` judges an XLA fraction with the
rule plan and env use; the allocator advice follows the target's torch."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

import memfit
from memfit.allocator.settings import recommend, workload_settings
from memfit.allocator.settings_check import check_jax_fraction, check_shell
from memfit.allocator.xla_fraction import recommended_xla_fraction
from memfit.cli.main import app
from memfit.hardware.catalog import gpu


def test_a_fraction_over_the_rule_is_reported_for_the_card() -> None:
    card = gpu("RTX 3070 Laptop")
    rule = recommended_xla_fraction(card)
    # 0.90 since the context by card (2026-11-29: 352 MiB for a JAX step here; 0.85 before)
    assert rule.value == "0.90"
    over = check_shell("export XLA_PYTHON_CLIENT_MEM_FRACTION=0.99\n", gpu=card)
    assert [p.code for p in over] == ["over-rule"] and "0.90" in over[0].message
    assert check_shell(f"export XLA_CLIENT_MEM_FRACTION={rule.value}\n", gpu=card) == []
    # no pool to size: preallocation off, or the platform allocator
    off = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.99"}
    assert check_jax_fraction(off, card) == []
    assert check_jax_fraction({"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.99"}, None) == []


def test_env_check_on_the_cli_names_the_rule(tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text("export XLA_PYTHON_CLIENT_MEM_FRACTION=0.99\n")
    result = CliRunner().invoke(
        app, ["env", "--check", str(script), "--gpu", "RTX 3070 Laptop", "--json"]
    )
    assert result.exit_code == 0, result.output
    assert "over-rule" in result.output


def test_no_expandable_segments_before_torch_2_1() -> None:
    old = recommend("training", platform="linux", torch_version=(1, 10)).environ()
    assert old == {
        "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512",
        **{k: v for k, v in old.items() if k.startswith("XLA")},
    }
    mid = workload_settings("torch", platform="linux", torch_version=(2, 4))
    assert mid == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}  # the one name it reads
    new = workload_settings("torch", platform="linux", torch_version=(2, 9))
    assert set(new) == {"PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"}


def test_a_plan_for_an_old_torch_gives_that_torch_its_settings() -> None:
    plan = memfit.plan("dqn_fire_raster", gpu="V100", runtime="torch=1.10.0,cuda=11.2")
    assert plan.environment == {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}
