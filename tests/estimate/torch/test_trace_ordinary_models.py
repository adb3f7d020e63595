"""The trace takes ordinary models as users write them: libraries' models, ``.to(device)``,
initialisers that read values, logging inside library code; and it says where and why when it
cannot.

The oracle for every peak here is a real run of the same step on the CPU, measured by the
CPU allocator's own reports (``torch.profiler`` memory events), as in test_estimate_torch.py.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from memfit.errors import EstimateError
from memfit.estimate import TorchStep, stand_in_scalars, stand_in_scalars_active
from memfit.estimate.torch import _measured_scratch as kernels_mod
from memfit.estimate.torch import _tracer
from memfit.estimate.torch._cuda_blas import cublaslt_policy
from memfit.estimate.torch.trace import estimate_torch
from memfit.hardware.cuda import cublas_workspace_bytes
from memfit.testing import real_cpu_peak


def _adam_step(model: Any, opt: Any, batch: Any) -> None:
    opt.zero_grad(set_to_none=True)
    model(batch).pow(2).mean().backward()
    opt.step()


# --- third-party models -----------------------------------------------------------------------


def _third_party() -> ModuleType:
    pytest.importorskip("transformers")
    pytest.importorskip("stable_baselines3")
    import third_party_workloads

    return third_party_workloads


@pytest.mark.parametrize(
    "name", ["hf_gpt2", "hf_bert", "hf_vit", "hf_t5", "sb3_dqn_cnn", "sb3_ppo_mlp", "sb3_ppo_multi"]
)
def test_third_party_models_trace_and_match_a_real_cpu_run(name: str) -> None:
    factory, batch = _third_party().SMALL_THIRD_PARTY[name]
    step = factory()
    est = estimate_torch(step.build, step.step, step.make_batch, [batch], device="cpu")
    traced = est.points[0].exact_peak
    real = real_cpu_peak(factory(), batch)
    assert traced == pytest.approx(real, rel=0.01), (name, traced, real)


def test_sb3_train_itself_traces_when_its_logging_is_stood_in() -> None:
    """DQN.train() as SB3 ships it: replay-buffer sampling from numpy, loss.item() for the
    logger. Without stand_in_scalars it is refused, naming SB3's line and the caller's."""
    tp = _third_party()
    import numpy as np
    from stable_baselines3 import DQN
    from stable_baselines3.common.logger import configure

    def build() -> tuple[Any, Any]:
        agent = DQN("CnnPolicy", tp._frames_env(36), buffer_size=64, learning_starts=0)
        env = agent.env
        obs = env.reset()
        for _ in range(20):
            action = np.array([env.action_space.sample()])
            nxt, reward, done, info = env.step(action)
            agent.replay_buffer.add(obs, nxt, action, reward, done, info)
            obs = nxt
        agent.set_logger(configure(None, [""]))
        return agent, None

    def plain(agent: Any, _opt: Any, batch: int) -> None:
        agent.train(gradient_steps=1, batch_size=batch)

    def wrapped(agent: Any, _opt: Any, batch: int) -> None:
        with stand_in_scalars():
            agent.train(gradient_steps=1, batch_size=batch)

    with pytest.raises(EstimateError, match=r"step\(\) \(step 1 of 3\) reads a tensor") as info:
        estimate_torch(build, plain, lambda b: b, [8])
    message = str(info.value)
    assert "stable_baselines3/dqn/dqn.py:" in message and "(train)" in message
    assert "called from" in message and "(plain)" in message
    assert info.value.hint is not None and "stand_in_scalars" in info.value.hint
    est = estimate_torch(build, wrapped, lambda b: b, [8, 32])
    assert est.points[1].exact_peak > est.points[0].exact_peak > 0
    assert any("stand-in" in d for d in est.deviations)


# --- build() as users write it ----------------------------------------------------------------


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)
        )
        self.register_buffer("scale", torch.ones(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) * self.scale


def test_module_to_device_in_build_is_traced_and_counted_once() -> None:
    def build() -> tuple[Any, Any]:
        model = _Net().to("cpu")
        model.to(torch.device("cpu"))
        return model, torch.optim.Adam(model.parameters())

    step = TorchStep(build, _adam_step, lambda b: torch.randn(b, 64))
    est = estimate_torch(step.build, step.step, step.make_batch, [32], device="cpu")
    assert est.points[0].exact_peak == pytest.approx(real_cpu_peak(step, 32), rel=0.002)


def test_a_dtype_conversion_in_build_keeps_the_parameters_and_frees_the_old_storage() -> None:
    seen: dict[str, Any] = {}

    def build() -> tuple[Any, Any]:
        model = torch.nn.Linear(512, 512)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)  # made before the move, as users do
        model.to(torch.float64)
        seen["same"] = opt.param_groups[0]["params"][0] is model.weight
        return model, opt

    def step(model: Any, opt: Any, batch: Any) -> None:
        opt.zero_grad()
        model(batch).sum().backward()
        opt.step()

    ts = TorchStep(build, step, lambda b: torch.randn(b, 512, dtype=torch.float64))
    point = estimate_torch(ts.build, ts.step, ts.make_batch, [4], device="cpu").points[0]
    assert seen["same"]  # the parameter object kept its identity, as in a real run
    weight_bytes = 512 * 512 * 8
    assert point.breakdown["parameters"] >= weight_bytes  # float64 now
    assert point.breakdown["parameters"] < weight_bytes + 3 * 512 * 8 + 4096
    # 0.5%: the float64 matmul of the bias's backward copies grad_output inside the kernel
    # (16 KiB here), which the trace does not see
    assert point.exact_peak == pytest.approx(real_cpu_peak(ts, 4), rel=0.005)


def test_initialisers_that_read_values_run_in_build() -> None:
    def build() -> tuple[Any, Any]:
        model = _Net()
        torch.nn.init.trunc_normal_(model.body[0].weight, std=0.02)
        torch.nn.init.trunc_normal_(model.body[2].weight, std=1.0, a=-0.5, b=0.5)  # rejection
        torch.nn.init.orthogonal_(model.body[2].weight)
        return model, torch.optim.Adam(model.parameters())

    step = TorchStep(build, _adam_step, lambda b: torch.randn(b, 64))
    est = estimate_torch(step.build, step.step, step.make_batch, [16], device="cpu")
    assert est.points[0].exact_peak == pytest.approx(real_cpu_peak(step, 16), rel=0.01)
    assert any("stand-in" in d and "build()" in d for d in est.deviations)


def test_an_explicit_cuda_device_is_traced_on_the_cpu() -> None:
    def build() -> tuple[Any, Any]:
        model = _Net().cuda()
        return model, torch.optim.Adam(model.parameters())

    def make_batch(b: int) -> Any:
        return torch.randn(b, 64, device="cuda")

    def step(model: Any, opt: Any, batch: Any) -> None:
        _adam_step(model, opt, batch.to("cuda"))

    est = estimate_torch(build, step, make_batch, [16], device="cpu")
    plain = TorchStep(
        lambda: (_n := _Net(), torch.optim.Adam(_n.parameters())),
        _adam_step,
        lambda b: torch.randn(b, 64),
    )
    ref = estimate_torch(plain.build, plain.step, plain.make_batch, [16], device="cpu")
    assert est.points[0].exact_peak == ref.points[0].exact_peak
    assert any("CUDA device explicitly" in d for d in est.deviations)


# --- values read in the step ----------------------------------------------------------------


def test_stand_in_scalars_lets_logging_through_and_changes_nothing_outside_a_trace() -> None:
    reads: list[Any] = []

    def step(model: Any, opt: Any, batch: Any) -> None:
        loss = model(batch).pow(2).mean()
        with stand_in_scalars():
            reads.append((loss.item(), bool(loss > 0), loss.detach().numpy().shape))
        opt.zero_grad()
        loss.backward()
        opt.step()

    ts = TorchStep(
        lambda: (_m := _Net(), torch.optim.Adam(_m.parameters())),
        step,
        lambda b: torch.randn(b, 64),
    )
    est = estimate_torch(ts.build, ts.step, ts.make_batch, [8], device="cpu")
    assert reads == [(0.0, False, ())] * 3  # three traced steps, stand-ins
    assert est.points[0].exact_peak == pytest.approx(real_cpu_peak(ts, 8), rel=0.002)
    reads.clear()
    ts.step(*ts.build(), ts.make_batch(8))  # a real step reads real values
    assert reads[0][0] > 0.0 and reads[0][1] is True
    assert not stand_in_scalars_active()


def test_a_loop_waiting_on_a_stood_in_value_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_tracer, "MAX_STAND_INS", 50)

    def step(model: Any, opt: Any, batch: Any) -> None:
        out = model(batch)
        with stand_in_scalars():
            while not bool((out > -1e9).all()):  # reads False forever under the trace
                pass

    ts = TorchStep(lambda: (_Net(), None), step, lambda b: torch.randn(b, 64))
    with pytest.raises(EstimateError, match="more than 50 tensor values"):
        estimate_torch(ts.build, ts.step, ts.make_batch, [4], device="cpu")


def test_a_refusal_in_a_library_names_its_line_the_callers_line_and_the_phase(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib = tmp_path / "site-packages"
    lib.mkdir()
    (lib / "memfit_fakelib.py").write_text(
        textwrap.dedent(
            """
            import torch

            def train_one(model, batch):
                loss = model(batch).sum()
                print("loss", loss.item())
                loss.backward()

            def pick_rows(model, batch):
                return torch.nonzero(model(batch))
            """
        )
    )
    monkeypatch.syspath_prepend(str(lib))
    import memfit_fakelib  # type: ignore[import-not-found]

    def step(model: Any, opt: Any, batch: Any) -> None:
        memfit_fakelib.train_one(model, batch)

    build = lambda: (_Net(), None)  # noqa: E731
    with pytest.raises(EstimateError) as info:
        estimate_torch(build, step, lambda b: torch.randn(b, 64), [4], device="cpu")
    message = str(info.value)
    assert message.startswith("step() (step 1 of 3) reads a tensor's value")
    assert "memfit_fakelib.py:6 (train_one), called from" in message
    assert "test_trace_ordinary_models.py:" in message and "(step)" in message
    assert info.value.hint is not None and "stand_in_scalars" in info.value.hint

    def shapes_step(model: Any, opt: Any, batch: Any) -> None:
        memfit_fakelib.pick_rows(model, batch)

    with pytest.raises(EstimateError, match=r"step\(\) .*calls aten\.nonzero") as info:
        estimate_torch(build, shapes_step, lambda b: torch.randn(b, 64), [4], device="cpu")
    assert "memfit_fakelib.py:10 (pick_rows)" in str(info.value)
    assert info.value.hint is not None and "make_batch" in info.value.hint

    def bad_build() -> tuple[Any, Any]:
        model = _Net()
        memfit_fakelib.pick_rows(model, torch.randn(2, 64))
        return model, None

    with pytest.raises(EstimateError, match=r"^build\(\) calls aten\.nonzero") as info:
        estimate_torch(bad_build, step, lambda b: torch.randn(b, 64), [4], device="cpu")
    assert info.value.hint is not None and "from_config" in info.value.hint

    def bad_batch(b: int) -> Any:
        raise ValueError("no such file: batch.npy")

    with pytest.raises(EstimateError, match=r"^make_batch\(\) failed .*ValueError: no such"):
        estimate_torch(build, step, bad_batch, [4], device="cpu")


# --- kernel scratch -----------------------------------------------------------------------------


def _convnet_step(channels: int = 16) -> TorchStep:
    def build() -> tuple[Any, Any]:
        model = torch.nn.Sequential(
            torch.nn.Conv2d(4, channels, 8, 4),
            torch.nn.ReLU(),
            torch.nn.Conv2d(channels, 32, 4, 2),
            torch.nn.ReLU(),
            torch.nn.Flatten(),
            torch.nn.Linear(32 * 9 * 9, 6),
        )
        return model, torch.optim.Adam(model.parameters())

    return TorchStep(build, _adam_step, lambda b: torch.rand(b, 4, 84, 84))


def test_cpu_convolution_scratch_is_measured_and_kept_out_of_the_gpu_figures() -> None:
    step = _convnet_step()
    with_scratch = estimate_torch(step.build, step.step, step.make_batch, [64], device="cpu")
    without = estimate_torch(
        step.build, step.step, step.make_batch, [64], device="cpu", kernel_scratch=False
    )
    real = real_cpu_peak(step, 64)
    assert with_scratch.points[0].exact_peak == pytest.approx(real, rel=0.005)
    # oneDNN's reorders in the backward pass are a real share of this step's peak
    assert without.points[0].exact_peak < 0.9 * real
    # CPU scratch is not GPU memory: the CUDA allocator figures are the same either way
    assert with_scratch.points[0].allocated_peak == without.points[0].allocated_peak
    assert any("measured by running" in d for d in with_scratch.deviations)


def test_scratch_over_the_cap_is_extrapolated_from_smaller_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    step = _convnet_step(channels=24)  # shapes of its own: nothing cached from other tests
    exact = estimate_torch(step.build, step.step, step.make_batch, [96], device="cpu")
    kernels_mod._MEASURED.clear()
    monkeypatch.setattr(kernels_mod, "DEFAULT_SCRATCH_CAP", 8 * 2**20)
    approx = estimate_torch(step.build, step.step, step.make_batch, [96], device="cpu")
    assert any("extrapolated linearly" in d for d in approx.deviations)
    assert approx.points[0].exact_peak == pytest.approx(exact.points[0].exact_peak, rel=0.05)


def test_the_gpu_figures_of_a_cpu_trace_count_a_cublas_workspace_per_pass() -> None:
    step = TorchStep(
        lambda: (_m := _Net(), torch.optim.Adam(_m.parameters())),
        _adam_step,
        lambda b: torch.randn(b, 64),
    )
    point = estimate_torch(step.build, step.step, step.make_batch, [8], gpu="a100 40gb").points[0]
    workspace = cublas_workspace_bytes(None, config=":4096:2:16:8")
    # cuBLASLt's own workspace, kept per handle from torch 2.9 (the forward's addmm with a
    # bias; TORCH_CUBLASLT_UNIFIED_WORKSPACE unset): the installed torch's rule
    mode, lt_bytes = cublaslt_policy(None, environ=os.environ, cublas_bytes=workspace)
    lt = lt_bytes if mode == "persistent" else 0
    # the forward matmuls' handle and the backward's (the autograd device thread's own)
    assert point.breakdown["cublas_workspace"] == 2 * workspace + lt
    inference = estimate_torch(
        lambda: (_Net(), None),
        lambda m, o, b: m(b),
        lambda b: torch.randn(b, 64),
        [8],
        gpu="a100 40gb",
    ).points[0]
    assert inference.breakdown["cublas_workspace"] == workspace + lt
    hopper = estimate_torch(step.build, step.step, step.make_batch, [8], gpu="H100").points[0]
    assert hopper.breakdown["cublas_workspace"] == 2 * 32 * 2**20 + lt


def _mse_regression(dtype: Any) -> TorchStep:
    """A 256 -> 4096 linear regression in ``dtype`` trained on mse_loss with SGD."""

    def step(model: Any, opt: Any, batch: Any) -> None:
        x, y = batch
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    def build() -> tuple[Any, Any]:
        model = torch.nn.Linear(256, 4096).to(dtype)
        return model, torch.optim.SGD(model.parameters(), lr=0.1)

    def make_batch(b: int) -> tuple[Any, Any]:
        return torch.randn(b, 256, dtype=dtype), torch.randn(b, 4096, dtype=dtype)

    return TorchStep(build, step, make_batch)


def test_a_reduced_loss_holds_its_unreduced_buffer_on_every_device() -> None:
    """mse_loss computes the unreduced loss into a buffer of the input's size and returns
    the mean as a view of it (aten/src/ATen/native/Loss.cpp, device-generic): the real run
    keeps that buffer while the loss lives; the GPU figures count it too."""

    ts = _mse_regression(torch.float32)
    measured = estimate_torch(ts.build, ts.step, ts.make_batch, [64], device="cpu").points[0]
    skipped = estimate_torch(
        ts.build, ts.step, ts.make_batch, [64], device="cpu", kernel_scratch=False
    ).points[0]
    buffer = 64 * 4096 * 4
    assert measured.exact_peak == pytest.approx(real_cpu_peak(ts, 64), rel=0.002)
    assert measured.exact_peak - skipped.exact_peak >= buffer
    assert measured.allocated_peak - skipped.allocated_peak >= buffer


def test_a_half_precision_mean_loss_casts_to_float32_on_the_cpu_only() -> None:
    """With the mean reduction and a bfloat16 or float16 loss, ``mean_out`` casts the
    unreduced buffer to float32 before summing on the CPU only (``ReduceOps.cpp``, under
    ``if (self.device().is_cpu())``); CUDA's ``mean_stub`` reduces the buffer in the kernel.
    The CPU figure counts that copy (it matches a real CPU run), the GPU figures do not."""

    ts = _mse_regression(torch.bfloat16)
    measured = estimate_torch(ts.build, ts.step, ts.make_batch, [64], device="cpu").points[0]
    skipped = estimate_torch(
        ts.build, ts.step, ts.make_batch, [64], device="cpu", kernel_scratch=False
    ).points[0]
    buffer = 64 * 4096 * 2  # the unreduced bfloat16 loss
    assert measured.exact_peak == pytest.approx(real_cpu_peak(ts, 64), rel=0.002)
    # on CUDA: the loss's storage and the unreduced buffer the kernel fills, no float32 copy
    assert buffer <= measured.allocated_peak - skipped.allocated_peak <= 2 * buffer


def test_the_cpu_only_float32_copy_is_sized_by_the_loss_and_its_reduction() -> None:
    aten = torch.ops.aten
    half = torch.empty(64, 4096, dtype=torch.float16)
    row = torch.empty(1, 4096, dtype=torch.float16)
    copy = kernels_mod.cpu_mean_cast_bytes
    assert copy(aten.mse_loss.default, (half, half, 1)) == 64 * 4096 * 4  # mean
    assert copy(aten.mse_loss.default, (half, half)) == 64 * 4096 * 4  # the default: mean
    assert copy(aten.mse_loss.default, (half, row, 1)) == 64 * 4096 * 4  # broadcast
    assert copy(aten.mse_loss.default, (half, half, 2)) == 0  # sum: no cast
    assert copy(aten.mse_loss.default, (half.float(), half.float(), 1)) == 0  # float32
    assert copy(aten.mse_loss_backward.default, (half, half, half, 1)) == 0  # no reduction
    assert copy(aten.binary_cross_entropy.default, (half, half, None, 1)) == 64 * 4096 * 4
