"""Factories named as module:function: the planner bridge and ``memfit estimate``."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from _user_module import user_module

from memfit.cli.main import main
from memfit.core.workload import Workload
from memfit.errors import ConfigError
from memfit.estimate import JaxStep, TorchStep
from memfit.estimate.bridge import knob_trace_values, load_factory, make_step, measure

FACTORY_SOURCE = textwrap.dedent(
    """
    import torch
    from memfit.estimate import JaxStep, TorchStep

    def _build():
        nn = torch.nn
        model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 4))
        return model, torch.optim.Adam(model.parameters())

    def _step(model, opt, batch):
        opt.zero_grad(set_to_none=True)
        model(batch).square().mean().backward()
        opt.step()

    def make():
        return TorchStep(_build, _step, lambda b: torch.randn(b, 32))

    def make_jax():
        import jax, jax.numpy as jnp
        w = jax.ShapeDtypeStruct((32, 8), jnp.float32)
        return JaxStep(lambda x, w: jnp.tanh(x @ w),
                       lambda b: (jax.ShapeDtypeStruct((b, 32), jnp.float32), w))

    def not_a_step():
        return 42
    """
)


@pytest.fixture
def factory_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh importable module (unique name) with the factories, in the cwd."""
    return user_module(tmp_path, monkeypatch, "memfit_factory_", FACTORY_SOURCE)


def test_make_step_returns_the_factory_step(factory_module: str) -> None:
    assert isinstance(make_step(f"{factory_module}:make"), TorchStep)
    assert isinstance(make_step(f"{factory_module}:make_jax"), JaxStep)


def test_bad_factories_are_config_errors_with_hints(factory_module: str) -> None:
    with pytest.raises(ConfigError, match="not module:function") as info:
        load_factory("no_colon_here")
    assert info.value.key_path == "factory" and info.value.hint
    with pytest.raises(ConfigError, match="cannot import module"):
        load_factory("memfit_no_such_module_xyz:make")
    with pytest.raises(ConfigError, match="has no 'missing'"):
        load_factory(f"{factory_module}:missing")
    with pytest.raises(ConfigError, match="not TorchStep or JaxStep"):
        make_step(f"{factory_module}:not_a_step")


def test_knob_trace_values_span_the_range() -> None:
    assert knob_trace_values(8, 512) == [8, 64, 512]
    assert knob_trace_values(8, 512, default=128) == [8, 128, 512]
    assert knob_trace_values(16, 16) == [16]


def _workload(factory: str, estimator: str = "torch") -> Workload:
    return Workload.model_validate(
        {
            "name": "traced",
            "family": "custom",
            "terms": {"anything": 1},
            "knobs": {"batch_size": {"min": 64, "max": 1024, "powers_of_two": True}},
            "estimator": estimator,
            "factory": factory,
        }
    )


def test_measure_gives_terms_that_follow_the_traced_peaks(factory_module: str) -> None:
    from memfit.estimate.torch.trace import estimate_torch

    terms = measure(_workload(f"{factory_module}:make"))
    assert terms.knob == "batch_size"
    assert terms.fixed_bytes["parameters"] > 0
    step = make_step(f"{factory_module}:make")
    assert isinstance(step, TorchStep)
    direct = estimate_torch(step.build, step.step, step.make_batch, [1024]).points[0]
    # The fit runs through the traced points (64, 256, 1024), within its residual.
    assert abs(terms.peak_bytes(1024) - direct.allocated_peak) <= terms.residual_bytes + 1


def test_measure_jax_and_mismatched_estimator(factory_module: str) -> None:
    terms = measure(_workload(f"{factory_module}:make_jax", "jax"))
    assert terms.source == "xla memory_analysis"
    assert terms.per_item_bytes >= (32 + 8) * 4
    with pytest.raises(ConfigError, match="estimator is torch"):
        measure(_workload(f"{factory_module}:make_jax", "torch"))


def test_cli_estimate_json(factory_module: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["estimate", f"{factory_module}:make", "--batch", "8,16", "--json"])
    out = capsys.readouterr().out
    assert code == 0
    data = json.loads(out)
    assert [p["batch_size"] for p in data["points"]] == [8, 16]
    assert data["framework"] == "torch"
    assert data["fit"]["slope"] > 0


def test_cli_says_when_the_batch_range_cannot_give_a_slope(
    factory_module: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 32: at batch 8 and 16 the peak sits in Adam's step, where the batch's tensors
    are freed: the line through those peaks says 256 B per item. The command says so, and
    traces two sizes past the crossing, where the slope is the batch's."""
    import memfit

    code = main(["estimate", f"{factory_module}:make", "--batch", "8,16", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    slope = data["slope"]
    assert slope is not None and slope["fitted_per_item_bytes"] == data["fit"]["slope"]
    assert slope["per_item_bytes"] > 4 * data["fit"]["slope"]
    at = slope["trace_at"]
    assert at[0] >= 2 * slope["from_value"] and at[1] == 2 * at[0]
    step = make_step(f"{factory_module}:make")
    direct = memfit.estimate_torch(step.build, step.step, step.make_batch, at,
                                   kernel_scratch=False)  # fmt: skip
    assert direct.fit is not None and slope["fit"]["slope"] == direct.fit.slope
    assert abs(direct.fit.slope - slope["per_item_bytes"]) <= 0.05 * slope["per_item_bytes"]
    code = main(["estimate", f"{factory_module}:make", "--batch", "8,16"])
    out = capsys.readouterr().out
    assert "the peak comes where the batch's tensors are already freed" in out
    assert f"traced again at {at[0]} and {at[1]}: fit:" in out
    # sizes past the crossing give the slope themselves: nothing to say
    code = main(["estimate", f"{factory_module}:make", "--batch", ",".join(map(str, at)),
                 "--json"])  # fmt: skip
    assert code == 0 and json.loads(capsys.readouterr().out)["slope"] is None


def test_cli_estimate_human_tables(factory_module: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["estimate", f"{factory_module}:make_jax", "--batch", "8,16"])
    captured = capsys.readouterr()
    assert code == 0
    assert "XLA memory analysis" in captured.out
    assert "fit:" in captured.out


def test_cli_estimate_errors(factory_module: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "memfit_no_such_module_xyz:make", "--batch", "8"]) == 1
    err = capsys.readouterr().err
    assert "Error:" in err and "Hint:" in err and "Traceback" not in err
    assert main(["estimate", f"{factory_module}:make", "--batch", "8,x"]) == 1
    assert "--batch" in capsys.readouterr().err
    assert main(["estimate", f"{factory_module}:make", "--framework", "jax"]) == 1
    assert "--framework" in capsys.readouterr().err


def test_allocator_settings_are_read_from_the_conf_string() -> None:
    from memfit.allocator.settings import torch_allocator_options as allocator_settings

    assert allocator_settings("expandable_segments:True", "X") == (True, None)
    assert allocator_settings("max_split_size_mb:256", "X") == (False, 256 * 1024 * 1024)
    with pytest.raises(ConfigError, match="True or False"):
        allocator_settings("expandable_segments:yes", "PYTORCH_ALLOC_CONF")
    with pytest.raises(ConfigError, match="whole number"):
        allocator_settings("max_split_size_mb:lots", "PYTORCH_ALLOC_CONF")


def test_cli_replays_the_allocator_settings_of_the_environment(
    factory_module: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "max_split_size_mb:8")
    assert main(["estimate", f"{factory_module}:make", "--batch", "8", "--json"]) == 1
    assert "more than 20 MiB" in capsys.readouterr().err
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "expandable_segments:True")
    assert main(["estimate", f"{factory_module}:make", "--batch", "8", "--json"]) == 0
    point = json.loads(capsys.readouterr().out)["points"][0]
    assert point["reserved_peak"] % (2 * 1024 * 1024) == 0  # whole pages


def test_a_traced_workload_needs_no_terms(factory_module: str) -> None:
    """Issue 32: ``estimator: torch`` on a custom workload asked for a non-empty ``terms:``
    the docs never mentioned; the traced step's terms are the workload's."""
    import memfit

    data = {
        "name": "traced",
        "family": "custom",
        "knobs": {"batch_size": {"min": 64, "max": 1024, "powers_of_two": True}},
        "estimator": "torch",
        "factory": f"{factory_module}:make",
    }
    p = memfit.plan(Workload.model_validate(data), gpu="RTX 4060")
    assert p.fits and {"parameters", "optimizer_state"} <= set(p.breakdown)
    with pytest.raises(ValueError, match=r"needs a terms: section .* or estimator: torch/jax"):
        Workload.model_validate({**data, "estimator": "analytic", "factory": None})
