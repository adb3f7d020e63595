"""One pure home for allocator configuration: one reading, one recommendation, everywhere."""

from __future__ import annotations

import pytest

from memfit.allocator.settings import (
    read_jax_env,
    recommend,
    torch_allocator_options,
    workload_settings,
)
from memfit.allocator.settings_check import check_jax_env
from memfit.allocator.xla_fraction import (
    XLA_FRACTION_CAP,
    fraction_summary,
    recommended_xla_fraction,
    xla_fraction_variable,
)
from memfit.core.budget import compose_budget
from memfit.errors import ConfigError
from memfit.hardware.catalog import gpu, list_gpus
from memfit.units import GiB

# What jaxlib's generate_pjrt_gpu_plugin_options does with XLA_PYTHON_CLIENT_PREALLOCATE:
# preallocate = value not in ('false', 'False', '0') when the value is set.
PREALLOCATE_TABLE = [
    ("", True),
    ("true", True),
    ("True", True),
    ("1", True),
    ("false", False),
    ("False", False),
    ("0", False),
    ("no", True),
    ("FALSE", True),
    ("off", True),
]


@pytest.mark.parametrize(("text", "expected"), PREALLOCATE_TABLE)
def test_every_reader_of_preallocate_agrees_with_jaxlib(text: str, expected: bool) -> None:
    from memfit.estimate.xla.step import preallocation_from_env

    env = {"XLA_PYTHON_CLIENT_PREALLOCATE": text} if text else {}
    assert read_jax_env(env).preallocate is expected
    assert preallocation_from_env(env).preallocate is expected
    # the checker warns exactly about the values that read as true by accident
    warned = [p for p in check_jax_env(env) if p.variable == "XLA_PYTHON_CLIENT_PREALLOCATE"]
    accidental = text not in ("", "true", "True", "1", "false", "False", "0")
    assert bool(warned) is accidental


def test_fraction_variables_are_read_as_jaxlib_reads_them() -> None:
    assert read_jax_env({"XLA_CLIENT_MEM_FRACTION": ".6"}).fraction == 0.6
    assert read_jax_env({"XLA_PYTHON_CLIENT_MEM_FRACTION": ".6"}).fraction_variable == (
        "XLA_PYTHON_CLIENT_MEM_FRACTION"
    )
    with pytest.raises(ConfigError, match="both set"):
        read_jax_env({"XLA_CLIENT_MEM_FRACTION": ".6", "XLA_PYTHON_CLIENT_MEM_FRACTION": ".5"})
    with pytest.raises(ConfigError, match=r"\(0, 1\]"):
        read_jax_env({"XLA_CLIENT_MEM_FRACTION": "1.5"})
    assert read_jax_env({"XLA_PYTHON_CLIENT_ALLOCATOR": "Platform"}).platform_allocator
    with pytest.raises(ConfigError, match="unknown allocator"):
        read_jax_env({"XLA_PYTHON_CLIENT_ALLOCATOR": "arena"})


def test_torch_options_for_the_replay() -> None:
    assert torch_allocator_options("expandable_segments:True", "X") == (True, None)
    assert torch_allocator_options("max_split_size_mb:256", "X") == (False, 256 * 2**20)
    with pytest.raises(ConfigError, match="True or False"):
        torch_allocator_options("expandable_segments:yes", "PYTORCH_ALLOC_CONF")
    with pytest.raises(ConfigError, match="no ':value'"):
        torch_allocator_options("max_split_size_mb=128", "PYTORCH_ALLOC_CONF")


def test_one_xla_fraction_recommendation_everywhere() -> None:
    spec = gpu("RTX 4070")
    advice = recommended_xla_fraction(spec)
    env_rec = recommend("training", platform="linux", torch_version=(2, 13), gpu=spec)
    jax_settings = [s for s in env_rec.settings if s.framework == "jax"]
    name = xla_fraction_variable()[0]
    assert [(s.variable, s.value, s.reason) for s in jax_settings] == [
        (name, advice.value, advice.reason)
    ]
    # the plan's pool uses the same fraction when the workload leaves it to memfit
    budget = compose_budget(spec, framework="jax")
    assert budget.pool_fraction == advice.fraction
    assert budget.pool_bytes == int(spec.total_bytes * advice.fraction)
    assert workload_settings("jax", gpu=spec)[name] == advice.value
    # without a GPU (memfit env with no card named): the fraction that leaves room on every
    # card of the catalog, and the reason says the rule over the catalog
    unknown = recommended_xla_fraction(None)
    assert unknown.fraction == min(recommended_xla_fraction(g).fraction for g in list_gpus())
    summary = fraction_summary()
    assert summary.text() in unknown.reason
    assert "CUDA context" in advice.reason and "pool" in advice.reason


def test_the_summary_of_the_rule_is_the_rule() -> None:
    """The docs and a plain ``memfit env`` say the rule over the catalog in words
    (fraction_summary): check every word of it against recommended_xla_fraction."""
    s = fraction_summary()
    cards = [g for g in list_gpus() if g.arch != "cpu"]
    for g in cards:
        got = recommended_xla_fraction(g).fraction
        if g.total_bytes >= s.top_from_bytes:
            assert got == s.top == XLA_FRACTION_CAP, g.name
        assert s.low <= got <= s.top
    assert any(  # the threshold is tight: a card just below it gets less
        recommended_xla_fraction(g).fraction < s.top
        for g in cards
        if g.total_bytes < s.top_from_bytes
    )
    for name, nbytes, fraction in s.below:
        assert recommended_xla_fraction(gpu(name)).fraction == fraction
        assert gpu(name).total_bytes == nbytes < s.top_from_bytes
    assert "0.85 on the RTX" in s.text()  # an 8 GB GeForce card: context + margin > 10%


def test_recommended_fraction_leaves_context_margin_and_others_outside_the_pool() -> None:
    for spec in list_gpus():
        for margin, others in ((0.05, 0), (0.1, 0), (0.05, spec.total_bytes // 10)):
            advice = recommended_xla_fraction(spec, margin=margin, other_processes_bytes=others)
            budget = compose_budget(spec, framework="jax", margin=margin,
                                    other_processes_bytes=others)  # fmt: skip
            assert 0 < advice.fraction <= XLA_FRACTION_CAP
            if advice.fraction > 0.05:  # the smallest step is the floor
                assert budget.breaking_term is None, spec.name
                assert budget.context_bytes + (budget.pool_bytes or 0) <= budget.budget_bytes
    assert recommended_xla_fraction(gpu("GTX 1650")).value == "0.85"  # 4 GiB, 260 MiB
    assert recommended_xla_fraction(gpu("RTX 3060 Ti")).value == "0.90"  # 8 GiB, 346 MiB
    assert recommended_xla_fraction(gpu("H100")).value == "0.90"
    assert recommended_xla_fraction(gpu("8GiB"), margin=0.2).value == "0.65"  # 824 MiB
    explicit = compose_budget(gpu("4090"), framework="jax", jax_mem_fraction=0.5)
    assert explicit.pool_fraction == 0.5 and explicit.pool_bytes == int(gpu("4090").total_bytes / 2)
    assert compose_budget(gpu("4090"), framework="jax", jax_preallocate=False).pool_bytes is None
    assert compose_budget(gpu(8 * GiB), framework="torch").pool_fraction is None


def test_workload_settings_for_torch_are_the_training_recommendation() -> None:
    torch_env = workload_settings("torch", platform="linux", torch_version=(2, 13))
    assert torch_env == {
        "PYTORCH_ALLOC_CONF": "expandable_segments:True",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    }
    assert workload_settings("torch", platform="linux", torch_version=(2, 5)) == {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"
    }
