"""The fake-tensor tracker against a real run of the same step on CPU.

The independent measure: PyTorch's profiler with ``profile_memory=True`` records every
allocation and free that the C++ CPU allocator (``c10::DefaultCPUAllocator``) reports, by its
``reportMemoryUsage`` hook, with exact byte counts and timestamps. That is the allocator
itself, below the dispatcher: it sees no fake tensors, no dispatch mode and no Python weak
references, so it shares nothing with the tracker but the step being run. The running sum of
those events gives the real step's peak of live CPU tensor bytes, which the tracker's
``exact_peak`` (unrounded storage sizes, as the CPU allocator does not round) must match.
"""

from __future__ import annotations

import resource
from typing import Any

import accuracy_workloads as W
import pytest
import torch

from memfit.allocator.model import round_size
from memfit.errors import ConfigError, EstimateError
from memfit.estimate import TorchStep
from memfit.estimate.torch.trace import CATEGORIES, estimate_torch, fit_affine
from memfit.testing import real_cpu_peak

CASES: list[tuple[str, Any, int, float]] = [
    # name, factory, batch size, relative tolerance
    ("ppo_mlp", lambda: W.make_ppo_mlp(32, 4, 128), 256, 0.002),
    ("bn_convnet", lambda: W.make_bn_convnet(32), 16, 0.002),
    ("checkpointed_mlp", lambda: W.make_checkpointed_mlp(128, 4), 64, 0.002),
    ("dqn_cnn", lambda: W.make_dqn_cnn(84), 8, 0.002),
    # The CPU flash-attention kernel of scaled_dot_product_attention allocates scratch
    # buffers inside the kernel; the tracer measures them (memfit.estimate.torch._measured_scratch).
    ("transformer_block", lambda: W.make_transformer_block(64, 16), 8, 0.002),
]


@pytest.mark.parametrize(("name", "factory", "batch", "tol"), CASES, ids=[c[0] for c in CASES])
def test_trace_peak_matches_real_cpu_run(name: str, factory: Any, batch: int, tol: float) -> None:
    step = factory()
    estimate = estimate_torch(step.build, step.step, step.make_batch, [batch], device="cpu")
    traced = estimate.points[0].exact_peak
    real = real_cpu_peak(step, batch)
    assert traced == pytest.approx(real, rel=tol), (name, traced, real)
    # The tracker never claims more than the real allocator used, beyond a few bytes of
    # scalar bookkeeping and what a kernel's scratch varies between runs.
    assert traced <= real * 1.001 + 64


def _mlp_step(hidden: int = 512) -> TorchStep:
    def build() -> tuple[Any, Any]:
        model = torch.nn.Sequential(
            torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1)
        )
        return model, torch.optim.Adam(model.parameters())

    def step(model: Any, opt: Any, batch: Any) -> None:
        opt.zero_grad(set_to_none=True)
        model(batch).pow(2).mean().backward()
        opt.step()

    return TorchStep(build, step, lambda b: torch.randn(b, 64))


def test_breakdown_names_parameters_optimizer_state_and_activations() -> None:
    step = _mlp_step()
    point = estimate_torch(step.build, step.step, step.make_batch, [4096]).points[0]
    assert set(point.breakdown) == set(CATEGORIES)
    param_sizes = [64 * 512 * 4, 512 * 4, 512 * 4, 4]
    assert point.breakdown["parameters"] == sum(round_size(n) for n in param_sizes)
    # Adam's exp_avg and exp_avg_sq for every parameter, plus its step counters.
    assert point.breakdown["optimizer_state"] >= 2 * point.breakdown["parameters"]
    # At batch 4096 the hidden activations (4096 x 512 floats, 8 MiB each) dominate.
    assert point.breakdown["activations"] >= 4096 * 512 * 4
    assert sum(point.breakdown.values()) == point.allocated_peak
    assert point.top_modules[0][1] >= 4096 * 512 * 4
    # the Linear or the ReLU after it, by qualified name (issue 22: not a bare index)
    assert point.top_modules[0][0] in {"Sequential.0 (Linear)", "Sequential.1 (ReLU)"}
    assert all(not name.isdigit() for name, _ in point.top_modules)


def test_fit_is_affine_in_the_batch_and_feeds_measured_terms() -> None:
    step = _mlp_step()
    est = estimate_torch(step.build, step.step, step.make_batch, [1024, 2048, 4096])
    assert est.fit is not None
    peaks = [p.allocated_peak for p in est.points]
    assert peaks[0] < peaks[1] < peaks[2]
    assert est.fit.slope > 512 * 4  # at least one hidden activation per item
    assert est.fit.residual < 0.01 * peaks[-1]
    terms = est.to_measured()
    assert terms.knob == "batch_size"
    assert terms.fixed_bytes["parameters"] > 0
    assert terms.peak_bytes(4096) == pytest.approx(est.fit.predict(4096), abs=1)
    assert est.to_dict()["points"][0]["batch_size"] == 1024


def test_checkpointing_lowers_the_traced_peak() -> None:
    plain = W.make_checkpointed_mlp(256, 6)
    ckpt = estimate_torch(plain.build, plain.step, plain.make_batch, [2048]).points[0]

    def step_without_checkpoint(model: Any, opt: Any, batch: Any) -> None:
        x, y = batch
        for block in model.blocks:
            x = x + block(x)
        loss = torch.nn.functional.mse_loss(model.out(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    full = estimate_torch(plain.build, step_without_checkpoint, plain.make_batch, [2048]).points[0]
    assert ckpt.breakdown["activations"] < full.breakdown["activations"]
    assert ckpt.allocated_peak < full.allocated_peak


def test_a_huge_model_traces_in_little_memory() -> None:
    def build() -> tuple[Any, Any]:
        model = torch.nn.Linear(100_000, 100_000)  # 40 GB of float32 weights
        return model, torch.optim.Adam(model.parameters())

    def step(model: Any, opt: Any, batch: Any) -> None:
        model(batch).sum().backward()
        opt.step()

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    est = estimate_torch(build, step, lambda b: torch.randn(b, 100_000), [8])
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert est.points[0].allocated_peak > 4 * 40 * 10**9  # weights, grads, two Adam moments
    assert after - before < 2**30


def _one_linear() -> tuple[Any, Any]:
    model = torch.nn.Linear(8, 8)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_data_dependent_op_is_named_in_the_error() -> None:
    def step(model: Any, opt: Any, batch: Any) -> None:
        torch.nonzero(model(batch))

    with pytest.raises(EstimateError, match=r"aten\.nonzero") as info:
        estimate_torch(_one_linear, step, lambda b: torch.randn(b, 8), [4])
    assert info.value.hint is not None and "nonzero" in info.value.hint


def test_item_in_the_step_is_named_in_the_error() -> None:
    def step(model: Any, opt: Any, batch: Any) -> None:
        loss = model(batch).sum()
        print(loss.item())

    with pytest.raises(EstimateError, match="_local_scalar_dense"):
        estimate_torch(_one_linear, step, lambda b: torch.randn(b, 8), [4])


def test_custom_op_without_fake_kernel_is_named_in_the_error() -> None:
    @torch.library.custom_op("memfit_test::no_fake", mutates_args=())
    def no_fake(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    def step(model: Any, opt: Any, batch: Any) -> None:
        no_fake(model(batch))

    with pytest.raises(EstimateError, match="memfit_test::no_fake") as info:
        estimate_torch(_one_linear, step, lambda b: torch.randn(b, 8), [4])
    assert info.value.hint is not None and "register_fake" in info.value.hint


def test_an_exception_in_the_users_step_is_an_estimate_error() -> None:
    def step(model: Any, opt: Any, batch: Any) -> None:
        raise ValueError("shape mismatch in my loss")

    with pytest.raises(EstimateError, match="ValueError: shape mismatch in my loss") as info:
        estimate_torch(_one_linear, step, lambda b: torch.randn(b, 8), [4])
    assert isinstance(info.value.__cause__, ValueError)


def test_bad_inputs_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="positive integer"):
        estimate_torch(_one_linear, lambda m, o, b: None, lambda b: b, [0])
    with pytest.raises(ConfigError, match="no batch sizes"):
        estimate_torch(_one_linear, lambda m, o, b: None, lambda b: b, [])
    with pytest.raises(ConfigError, match=r"\(model, optimizer\)"):
        estimate_torch(lambda: torch.nn.Linear(2, 2), lambda m, o, b: None, lambda b: b, [1])


def test_trace_leaves_no_global_state_behind() -> None:
    from torch.nn.modules import module as module_mod

    hooks_before = len(module_mod._global_forward_hooks)
    step = _mlp_step(16)
    estimate_torch(step.build, step.step, step.make_batch, [2])
    assert torch.get_default_device().type == "cpu"
    assert len(module_mod._global_forward_hooks) == hooks_before
    assert not isinstance(torch.ones(1), torch._subclasses.fake_tensor.FakeTensor)


def test_cpu_trace_lists_its_deviations_and_device_figures() -> None:
    step = _mlp_step(16)
    est = estimate_torch(step.build, step.step, step.make_batch, [2, 4], gpu="H100")
    assert est.device == "cpu"
    assert any("no CUDA" in d for d in est.deviations)
    point = est.points[0]
    assert point.device_used_peak is not None
    assert point.device_used_peak > point.reserved_peak  # context (and cuBLAS workspaces)
    assert point.reserved_peak >= point.allocated_peak


def test_fit_needs_two_distinct_sizes() -> None:
    assert fit_affine([4, 4], [1, 2]) is None
    line = fit_affine([1, 2, 3], [3, 5, 8])
    assert line is not None
    assert line.slope == pytest.approx(2.5)
    assert line.intercept == pytest.approx(1 / 3)
    assert line.residual == pytest.approx(1 / 3)  # at x=2: 5 against 16/3


def test_progress_hears_each_batch_size() -> None:
    """Issue 22: ``memfit estimate`` over several batch sizes shows where it is."""
    step = _mlp_step()
    heard: list[str] = []
    estimate_torch(step.build, step.step, step.make_batch, [2, 4], progress=heard.append)
    assert heard == ["tracing batch_size=2 (1 of 2)", "tracing batch_size=4 (2 of 2)"]
