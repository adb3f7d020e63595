"""A CPU trace for a CUDA target follows the kernels CUDA runs (issue 29).

Dropout keeps CUDA's 1-byte mask, ``scaled_dot_product_attention`` runs the backend CUDA would
choose for the GPU, cuDNN's convolution workspace and the attention backward's scratch are
counted, cuBLASLt's workspace follows the target's torch, and autocast regions named after
the traced tensors' device are CUDA's.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import memfit
from memfit.errors import ConfigError
from memfit.estimate.torch._cuda_blas import cublaslt_policy
from memfit.estimate.torch._cuda_conv import FITTED, conv_workspace
from memfit.estimate.torch._cuda_probe import read_rule
from memfit.estimate.torch._cuda_reduce import reduce_buffer
from memfit.estimate.torch._cuda_sdpa import backward_scratch, choose, run
from memfit.estimate.torch._cuda_target import parse_version
from memfit.estimate.torch.trace import trace_requests
from memfit.hardware.cuda import cudnn_major

A100 = "A100-SXM4-80GB"
T4 = "T4"
H100 = "H100 80GB"


def _qkv(dtype: torch.dtype, b: int = 2, h: int = 4, s: int = 64, d: int = 64) -> Any:
    return [torch.empty(b, h, s, d, dtype=dtype) for _ in range(3)]


# --- which attention backend -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("capability", "dtype", "mask", "expected"),
    [
        ((8, 0), torch.float16, False, "flash_attention"),
        ((8, 0), torch.bfloat16, False, "flash_attention"),
        ((8, 0), torch.float32, False, "efficient_attention"),  # flash: half types only
        ((8, 0), torch.float16, True, "efficient_attention"),  # flash takes no mask
        ((7, 5), torch.float16, False, "efficient_attention"),  # flash needs sm80
        ((7, 5), torch.bfloat16, False, "math"),  # efficient: no bfloat16 before sm80
        ((7, 0), torch.float32, False, "efficient_attention"),
    ],
)
def test_the_backend_cuda_would_choose(
    capability: tuple[int, int], dtype: torch.dtype, mask: bool, expected: str
) -> None:
    q, k, v = _qkv(dtype)
    attn_mask = torch.ones(64, 64, dtype=torch.bool) if mask else None
    choice = choose(
        q, k, v, attn_mask, 0.1, False, False, capability=capability, torch_version=(2, 6)
    )
    assert choice.backend == expected, choice.reasons


def test_cudnn_attention_comes_first_on_hopper_where_that_torch_puts_it_first() -> None:
    q, k, v = _qkv(torch.bfloat16)
    new = choose(q, k, v, None, 0.0, True, False, capability=(9, 0), torch_version=(2, 11))
    old = choose(q, k, v, None, 0.0, True, False, capability=(9, 0), torch_version=(2, 6))
    assert (new.backend, old.backend) == ("cudnn_attention", "flash_attention")
    # before torch 2.11 cuDNN's dropout resolution is 1/16: 0.1 is not a multiple, so flash
    # takes it; torch 2.11 ran cuDNN attention at 0.1 on an H100 (2026-11-26)
    drop = choose(q, k, v, None, 0.1, True, False, capability=(9, 0), torch_version=(2, 9))
    assert drop.backend == "flash_attention"
    assert any("1/16" in r for r in drop.reasons)
    drop = choose(q, k, v, None, 0.1, True, False, capability=(9, 0), torch_version=(2, 11))
    assert drop.backend == "cudnn_attention"


def test_the_users_backend_flags_and_sdpa_kernel_are_honoured() -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = _qkv(torch.float16)
    with sdpa_kernel(SDPBackend.MATH):
        assert (
            choose(q, k, v, None, 0.0, False, False, capability=(8, 0), torch_version=None).backend
            == "math"
        )
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
        got = choose(q, k, v, None, 0.0, False, False, capability=(8, 0), torch_version=None)
        assert got.backend == "efficient_attention"
        assert got.reasons == (
            "flash_attention: disabled (torch.backends.cuda flags / sdpa_kernel)",
        )
    # restored on leaving
    assert (
        choose(q, k, v, None, 0.0, False, False, capability=(8, 0), torch_version=None).backend
        == "flash_attention"
    )


def test_an_unknown_gpu_is_taken_for_sm80_and_said() -> None:
    q, k, v = _qkv(torch.float16)
    choice = choose(q, k, v, None, 0.0, False, False, capability=None, torch_version=None)
    assert choice.backend == "flash_attention"
    assert choice.assumed is not None and "sm80" in choice.assumed


def test_flash_pads_a_head_size_to_a_multiple_of_8_and_slices_it_back() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q, k, v = _qkv(torch.float16, d=60)
        out = run("flash_attention", q, k, v, None, 0.0, False, None, False)
        assert tuple(out.shape) == (2, 4, 64, 60)
        assert out.untyped_storage().nbytes() == 2 * 4 * 64 * 64 * 2  # the padded kernel output


def test_flash_backward_scratch_is_its_accumulators() -> None:
    q, k, v = _qkv(torch.float16, b=2, h=4, s=100, d=64)
    grad = torch.empty(2, 100, 4, 64, dtype=torch.float16).transpose(1, 2)  # [B, L, H, D] layout
    name = "aten._scaled_dot_product_flash_attention_backward.default"
    lq = 128  # 100 rounded to 128
    assert backward_scratch(name, [grad, q, k, v]) == 2 * 4 * lq * 4 + 2 * lq * 4 * 64 * 4
    # a gradient in another layout is copied first
    assert backward_scratch(name, [torch.empty_like(q), q, k, v]) == (
        2 * 4 * lq * 4 + 2 * lq * 4 * 64 * 4 + q.numel() * 2
    )


def test_torch_2_1s_flash_attention_packs_its_inputs_and_output() -> None:
    """FlashAttention 1 (torch 2.0/2.1) reads and writes the packed ``[B * L, H, D]`` layout:
    its output is ``[B, L, H, D]``-contiguous whatever the query's layout; FlashAttention 2
    makes it like the query (nn.MultiheadAttention's ``[L, B, H, D]``)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    b, h, s, d = 2, 4, 50, 64
    with FakeTensorMode():
        # the layout nn.MultiheadAttention hands over: [L, B, H, D] in memory
        q, k, v = (torch.empty(s, b, h, d, dtype=torch.float16).permute(1, 2, 0, 3) for _ in "qkv")
        old = run("flash_attention", q, k, v, None, 0.0, False, None, False, legacy_flash=True)
        new = run("flash_attention", q, k, v, None, 0.0, False, None, False)
        assert old.transpose(1, 2).is_contiguous()
        assert new.permute(2, 0, 1, 3).is_contiguous() and not new.transpose(1, 2).is_contiguous()
    # 2.0/2.1's flash takes head sizes that are multiples of 8 only (2.2 pads them)
    head_60 = _qkv(torch.float16, d=60)
    old_choice = choose(*head_60, None, 0.0, False, False, capability=(8, 0), torch_version=(2, 1))
    assert old_choice.reasons[0] == "flash_attention: head size is not a multiple of 8"
    new_choice = choose(*head_60, None, 0.0, False, False, capability=(8, 0), torch_version=(2, 2))
    assert new_choice.backend == "flash_attention"


def test_torch_2_1s_flash_backward_scratch_is_its_packed_copies() -> None:
    b, h, s, d = 2, 4, 100, 64
    packed = [torch.empty(b, s, h, d, dtype=torch.float16).transpose(1, 2) for _ in range(4)]
    name = "aten._scaled_dot_product_flash_attention_backward.default"
    softmax_d = b * h * 112 * 4  # float32 [B, H, round16(Lq)]
    assert backward_scratch(name, packed, legacy_flash=True) == softmax_d
    strided = [torch.empty(s, b, h, d, dtype=torch.float16).permute(1, 2, 0, 3) for _ in range(4)]
    one = b * h * s * d * 2
    assert backward_scratch(name, strided, legacy_flash=True) == softmax_d + 4 * one
    # keys over one block (256 for head sizes up to 64): a float32 dq accumulator
    long_q = torch.empty(b, 300, h, d, dtype=torch.float16).transpose(1, 2)
    long = [long_q, long_q, long_q, long_q]
    assert backward_scratch(name, long, legacy_flash=True) == (
        b * h * 304 * 4 + b * 300 * h * d * 4
    )


class _Mha(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(64, 4, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x, x, x, need_weights=False)[0]


def test_multihead_attention_keeps_one_more_copy_under_torch_2_1() -> None:
    """``nn.MultiheadAttention``'s ``permute(2, 0, 1, 3).contiguous()`` after attention copies
    FlashAttention 1's packed output and not FlashAttention 2's: on torch 2.1 the output
    projection's backward keeps one more ``[B, L, E]`` tensor (the published ViT-L/16 runs
    on a 2.1 nightly: 24 such tensors, 3-5% of the reserved peak)."""

    def build() -> tuple[Any, Any]:
        model = _Mha().half()
        return model, torch.optim.SGD(model.parameters(), lr=0.1)

    def step(model: Any, opt: Any, x: torch.Tensor) -> None:
        model(x).float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def batch(n: int) -> torch.Tensor:
        return torch.randn(n, 100, 64, dtype=torch.float16)

    kept = {}
    for runtime in ("torch=2.1.0", "torch=2.4.0"):
        est = memfit.estimate_torch(
            build, step, batch, [8], gpu=A100, runtime=runtime, kernel_scratch=False
        )
        assert est.kernels["aten.scaled_dot_product_attention"][0].kernel == "flash_attention"
        kept[runtime] = est.points[0].breakdown["activations"]
    assert kept["torch=2.1.0"] - kept["torch=2.4.0"] == 8 * 100 * 64 * 2


# --- the trace follows them --------------------------------------------------------------------


class _Block(nn.Module):
    def __init__(self, d: int = 64, h: int = 4, p: float = 0.1) -> None:
        super().__init__()
        self.h, self.p = h, p
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.drop = nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        y = nn.functional.scaled_dot_product_attention(
            q, k, v, dropout_p=self.p if self.training else 0.0, is_causal=True
        )
        return x + self.drop(self.out(y.transpose(1, 2).reshape(b, s, d)))


S, D = 128, 64


def _step(model: Any, opt: Any, x: torch.Tensor) -> None:
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(x).float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _build() -> tuple[Any, Any]:
    model = _Block()
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _batch(n: int) -> torch.Tensor:
    return torch.randn(n, S, D)


def test_dropout_keeps_a_one_byte_mask_for_a_cuda_target() -> None:
    est = memfit.estimate_torch(_build, _step, _batch, [4], gpu=A100, kernel_scratch=False)
    uses = est.kernels["aten.dropout"]
    assert [u.kernel for u in uses] == ["native_dropout"]
    assert uses[0].saved_bytes == 4 * S * D  # one byte per element: the bool mask
    assert uses[0].cpu_kernel is not None and "bernoulli_" in uses[0].cpu_kernel
    cuda = trace_requests(_build, _step, _batch, 4, gpu=A100, steps=1, kernel_scratch=False)
    cpu = trace_requests(_build, _step, _batch, 4, steps=1, kernel_scratch=False)
    masks = [r for r in cuda if r.op == "aten.native_dropout.default"]
    assert sorted(r.nbytes for r in masks) == sorted([4 * S * D * 2, 4 * S * D])  # out, mask
    assert not any(r.op == "aten.bernoulli_.float" for r in cuda)
    assert any(r.op == "aten.empty_like.default" for r in cpu)  # the CPU's noise tensor


def test_attention_runs_the_gpus_backend_and_keeps_its_log_sum_exp() -> None:
    a100 = memfit.estimate_torch(_build, _step, _batch, [4], gpu=A100, kernel_scratch=False)
    t4 = memfit.estimate_torch(_build, _step, _batch, [4], gpu=T4, kernel_scratch=False)
    (flash,) = a100.kernels["aten.scaled_dot_product_attention"]
    (efficient,) = t4.kernels["aten.scaled_dot_product_attention"]
    assert (flash.kernel, efficient.kernel) == ("flash_attention", "efficient_attention")
    # flash keeps a float32 log-sum-exp [B, H, L] and 16 + 8 bytes of RNG state
    assert flash.saved_bytes == 4 * 4 * S * 4 + 16 + 8
    assert "sm75" in efficient.note
    backward = a100.kernels["aten.scaled_dot_product_attention (backward)"]
    assert backward[0].kernel == "flash_attention_backward" and backward[0].workspace_bytes > 0
    notes = " | ".join(a100.deviations)
    assert "CUDA's kernels traced in place of the CPU's" in notes
    assert a100.to_dict()["kernels"]["aten.scaled_dot_product_attention"][0]["kernel"] == (
        "flash_attention"
    )


def test_a_bfloat16_step_keeps_more_on_a_t4_than_on_an_a100() -> None:
    def step(model: Any, opt: Any, x: torch.Tensor) -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    a100 = memfit.estimate_torch(_build, step, _batch, [8], gpu=A100, kernel_scratch=False)
    t4 = memfit.estimate_torch(_build, step, _batch, [8], gpu=T4, kernel_scratch=False)
    assert t4.kernels["aten.scaled_dot_product_attention"][0].kernel == "math"
    # math keeps the softmax and its dropout mask, [B, H, L, L]: far more than flash's lse
    scores = 8 * 4 * S * S
    assert t4.points[0].tensor_peak - a100.points[0].tensor_peak >= 4 * scores


def _inference_step(model: Any, _opt: Any, x: torch.Tensor) -> None:
    model.eval()
    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.float16):
        model(x)


def _inference_estimate() -> Any:
    return memfit.estimate_torch(
        lambda: (_Block(), None),
        _inference_step,
        _batch,
        [4],
        gpu=A100,
        kernel_scratch=False,
        steps=1,
    )


def test_attention_under_inference_mode_runs_cudas_backend() -> None:
    est = _inference_estimate()
    assert est.kernels["aten.scaled_dot_product_attention"][0].kernel == "flash_attention"


def test_a_first_step_under_inference_mode_reads_cudas_autocast_rules(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With no rule read before in the process, a step under inference_mode still gets
    CUDA's autocast casts (the probe once ran inside inference_mode, read nothing, and the
    process kept that for every later step)."""
    from memfit.estimate.torch import _autocast, _cuda_probe

    monkeypatch.setattr(_autocast, "_RULES", {})
    monkeypatch.setattr(_cuda_probe, "_RULES", {})

    est = _inference_estimate()
    assert est.kernels["aten.scaled_dot_product_attention"][0].kernel == "flash_attention"
    assert not any("could not be read" in d for d in est.deviations), est.deviations


def test_a_figure_for_no_named_gpu_keeps_the_cpus_kernels() -> None:
    est = memfit.estimate_torch(_build, _step, _batch, [4], kernel_scratch=False)
    assert est.kernels == {}
    assert any("name the GPU to trace CUDA's" in d for d in est.deviations)


# --- the probe of composite operators -----------------------------------------------------------


def test_the_probe_reads_cudas_dropout_and_leaves_ordinary_composites_alone() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(4, 8, requires_grad=True)
        w = torch.empty(8, 8, requires_grad=True)
        dropout = read_rule(torch.ops.aten.dropout.default, (x, 0.1, True), {})
        linear = read_rule(torch.ops.aten.linear.default, (x, w), {})
        off = read_rule(torch.ops.aten.dropout.default, (x, 0.1, False), {})
    assert dropout.kind == "direct" and str(dropout.target) == "aten.native_dropout.default"
    assert dropout.index == 0
    assert linear.kind == "same"
    assert off.kind == "same"  # not training: both return the input


def test_a_composite_that_nests_dropout_is_not_reported_as_different() -> None:
    """CUDA's math attention reaches native_dropout through dropout, which the trace redirects
    too: the probe's CPU side follows the nested rule, so the two sides agree."""

    def step(model: Any, opt: Any, x: torch.Tensor) -> None:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.MATH):
            _step(model, opt, x)

    est = memfit.estimate_torch(_build, step, _batch, [4], gpu=A100, kernel_scratch=False)
    assert est.kernels["aten.scaled_dot_product_attention"][0].kernel == "math"
    assert not any("into other operators than the CPU" in d for d in est.deviations)


# --- convolutions ------------------------------------------------------------------------------


def _conv_args(dtype: torch.dtype, channels_last: bool = False) -> tuple[Any, Any, Any]:
    x = torch.empty(8, 32, 84, 84, dtype=dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    w = torch.empty(32, 32, 3, 3, dtype=dtype)
    out = torch.empty(8, 32, 82, 82, dtype=dtype)
    args = (x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    return args, out, w


def test_cudnn7_takes_the_nhwc_input_and_a_float32_output_for_half_convolutions() -> None:
    args, out, w = _conv_args(torch.float16)
    got = conv_workspace("aten.convolution.default", args, out, capability=(7, 0), cudnn_major=7)
    assert got is not None and not got.bound
    assert got.nbytes == args[0].numel() * 2 + out.numel() * 4 + w.numel() * 2


def test_float32_without_tf32_and_channels_last_convolutions_take_no_workspace() -> None:
    cases = (
        (torch.float32, False, (8, 0), False),  # TF32 off: filterEngineConfigs drops tensor cores
        (torch.float32, False, (7, 0), True),  # no TF32 before Ampere
        (torch.float16, True, (8, 0), True),  # already NHWC
    )
    for dtype, cl, cc, tf32 in cases:
        args, out, _ = _conv_args(dtype, cl)
        got = conv_workspace(
            "aten.convolution.default", args, out, capability=cc, cudnn_major=9, allow_tf32=tf32
        )
        assert got is not None and got.nbytes == 0, (dtype, cl, cc, tf32)


def test_cudnn9_workspaces_are_fitted_per_kernel_with_a_band() -> None:
    for dtype in (torch.bfloat16, torch.float32):  # float32: TF32 tensor cores on sm80+
        args, out, w = _conv_args(dtype)
        got = conv_workspace(
            "aten.convolution.default", args, out, capability=(8, 0), cudnn_major=9, allow_tf32=True
        )
        base = (args[0].numel() + out.numel() + w.numel()) * args[0].element_size()
        assert got is not None and not got.bound and got.basis == "fitted"
        assert got.nbytes == int(base * FITTED["forward"][0])
        assert got.low <= got.nbytes <= got.high
        assert got.kernels == (("forward", got.nbytes),)
    # backward: the data kernel then the filter kernel, each with its own factor
    x, w = torch.empty(8, 32, 84, 84), torch.empty(32, 32, 3, 3)
    grad = torch.empty(8, 32, 82, 82)
    bargs = (grad, x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [True, True, False])
    got = conv_workspace(
        "aten.convolution_backward.default", bargs, (x, w, None), capability=(9, 0),
        cudnn_major=9, allow_tf32=True,
    )  # fmt: skip
    base = (x.numel() + grad.numel() + w.numel()) * 4
    assert got is not None
    assert [k for k, _ in got.kernels] == ["backward_data", "backward_filter"]
    assert dict(got.kernels)["backward_filter"] == int(base * FITTED["backward_filter"][0])
    assert got.nbytes == max(n for _, n in got.kernels)


def test_reduction_staging_buffer_matches_the_h100_corpus() -> None:
    """Reduce.cuh's global buffer for a bias gradient (sum over the batch): the H100 corpus's
    aten.sum.dim_IntList allocations of ppo_mlp_large (1024 wide) and ppo_mlp_small (256)."""
    cases = (
        (16384, 1024, 128),
        (4096, 1024, 32),
        (1024, 1024, 8),
        (16384, 256, 32),
        (1024, 256, 2),
    )
    for rows, cols, mib in cases:
        got = reduce_buffer("aten.sum.dim_IntList", (torch.empty(rows, cols), [0], True), sms=132)
        assert got == mib * 2**20, (rows, cols)
    # a reduction along the fastest dimension with many outputs needs no second pass
    assert reduce_buffer("aten.sum.dim_IntList", (torch.empty(64, 1024), [1]), sms=132) == 0
    assert reduce_buffer("aten.mm.default", (torch.empty(4, 4), torch.empty(4, 4))) == 0


def test_a_conv_net_for_a_cuda_target_lists_cudnns_workspace() -> None:
    def build() -> tuple[Any, Any]:
        model = nn.Sequential(
            nn.Conv2d(4, 32, 8, 4), nn.ReLU(), nn.Flatten(), nn.Linear(32 * 20 * 20, 6)
        )
        return model.half(), None

    def step(model: Any, _opt: Any, x: torch.Tensor) -> None:
        model(x).float().sum().backward()

    est = memfit.estimate_torch(
        build,
        step,
        lambda n: torch.randn(n, 4, 84, 84, dtype=torch.float16),
        [16],
        gpu="V100-SXM2-16GB",
        runtime={"torch": "1.7.1", "cuda": "10.2"},
        kernel_scratch=False,
        steps=1,
    )
    forward = est.kernels["aten.convolution"][0]
    assert forward.kernel.startswith("cuDNN 7") and forward.workspace_bytes > 0
    assert "aten.convolution_backward" in est.kernels


# --- library versions ----------------------------------------------------------------------------


def test_cublaslt_workspace_follows_the_targets_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    assert cublaslt_policy((1, 10)) == ("none", 0)
    assert cublaslt_policy((2, 6)) == ("transient", 1 << 20)
    assert cublaslt_policy((2, 9)) == ("persistent", 1 << 20)
    # torch 2.11 (the H100 corpus): its own 1 MiB unless the unified workspace is asked for
    assert cublaslt_policy((2, 11)) == ("persistent", 1 << 20)
    unified = {"TORCH_CUBLASLT_UNIFIED_WORKSPACE": "1"}
    assert cublaslt_policy((2, 11), environ=unified) == ("unified", 0)
    big = {"CUBLASLT_WORKSPACE_SIZE": "65536"}  # KiB; capped at cuBLAS's unless set false
    assert cublaslt_policy((2, 11), environ=big, cublas_bytes=32 << 20) == ("persistent", 32 << 20)
    off = {**big, "TORCH_CUBLASLT_UNIFIED_WORKSPACE": "0"}
    assert cublaslt_policy((2, 11), environ=off, cublas_bytes=32 << 20) == ("persistent", 64 << 20)
    with pytest.raises(ConfigError, match="CUBLASLT_WORKSPACE_SIZE"):
        cublaslt_policy((2, 11), environ={"CUBLASLT_WORKSPACE_SIZE": "lots"})
    monkeypatch.setenv("TORCH_CUBLASLT_UNIFIED_WORKSPACE", "1")

    def build() -> tuple[Any, Any]:
        return nn.Linear(64, 64), None

    def step(model: Any, _opt: Any, x: torch.Tensor) -> None:
        model(x)

    est_26 = memfit.estimate_torch(
        build,
        step,
        lambda n: torch.randn(n, 64),
        [8],
        gpu=A100,
        runtime="torch=2.6.0",
        kernel_scratch=False,
        steps=1,
    )
    est_212 = memfit.estimate_torch(
        build,
        step,
        lambda n: torch.randn(n, 64),
        [8],
        gpu=A100,
        runtime="torch=2.12.0",
        kernel_scratch=False,
        steps=1,
    )
    # torch 2.6's cuBLASLt takes 1 MiB for the call, alive with the output at the peak
    assert est_26.points[0].breakdown["kernel_workspace"] == 1 << 20
    assert est_212.points[0].breakdown["kernel_workspace"] == 0
    assert est_26.points[0].allocated_peak > est_212.points[0].allocated_peak + (1 << 20) - 1
    assert any("cuBLASLt (addmm with a bias) takes" in d for d in est_26.deviations)


def test_versions_and_cudnn() -> None:
    assert parse_version("2.1.0.dev20230623+cu118") == (2, 1)
    assert parse_version(None) is None
    assert cudnn_major((1, 7), (10, 2)) == 7
    assert cudnn_major((1, 12), (11, 3)) == 8
    assert cudnn_major((2, 6), (12, 4)) == 9


# --- autocast named after the tensors' device --------------------------------------------------


def test_autocast_and_a_scaler_named_after_the_tensors_device_are_cudas() -> None:
    def step_named(device: str) -> Any:
        def step(model: Any, opt: Any, x: torch.Tensor) -> None:
            dev = x.device.type if device == "derived" else device
            scaler = torch.amp.GradScaler(dev)
            with torch.autocast(device_type=dev, dtype=torch.float16):
                loss = model(x).float().pow(2).mean()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)

        return step

    derived = memfit.estimate_torch(
        _build, step_named("derived"), _batch, [4], gpu=A100, kernel_scratch=False
    )
    named = memfit.estimate_torch(
        _build, step_named("cuda"), _batch, [4], gpu=A100, kernel_scratch=False
    )
    assert derived.points[0].tensor_peak == named.points[0].tensor_peak
    assert derived.points[0].allocated_peak == named.points[0].allocated_peak
    notes = " | ".join(derived.deviations)
    assert "autocast region(s) and" in notes and "made for 'cuda'" in notes


def test_checkpointed_attention_is_recomputed_not_kept() -> None:
    """Under torch.utils.checkpoint the region's saved tensors are dropped and recomputed in
    backward: the kernel runs twice per step, what it keeps is kept by the recomputation
    only, and the peak is below the same step's without checkpointing."""
    from torch.utils.checkpoint import checkpoint

    def step(model: Any, opt: Any, x: torch.Tensor) -> None:
        with torch.autocast("cuda", dtype=torch.float16):
            y = checkpoint(model, x, use_reentrant=False)
            loss = y.float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    est = memfit.estimate_torch(_build, step, _batch, [4], gpu=A100, kernel_scratch=False)
    uses = est.kernels["aten.scaled_dot_product_attention"]
    assert {u.kernel for u in uses} == {"flash_attention"}
    assert uses[0].calls == 6  # 3 steps, each a forward and its recomputation
    assert uses[0].saved_bytes == 4 * 4 * S * 4 + 16 + 8  # kept by the recomputation
    plain = memfit.estimate_torch(_build, _step, _batch, [4], gpu=A100, kernel_scratch=False)
    assert est.points[0].tensor_peak < plain.points[0].tensor_peak
