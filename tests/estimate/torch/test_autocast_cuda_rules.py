"""A CPU trace of a step under ``torch.autocast("cuda")`` follows CUDA's autocast rules.

The figures here are derived by hand from the shapes, the dtypes and CUDA's documented
autocast behaviour (matmuls and convolutions in the low-precision dtype, ``layer_norm``,
``softmax``, ``upsample`` and the losses in float32, one cached low-precision copy of each
parameter per autocast region), and checked against the trace. The same steps traced with the
CPU's rules (``torch.autocast("cpu")``) or without the emulation (CUDA autocast switches itself
off on a machine without CUDA) give other figures, also derived, so each test fails if the
trace falls back to either. The rules apply when the figures are for a CUDA GPU: the tests
name one (``gpu=GPU``).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch

from memfit.errors import EstimateError
from memfit.estimate.torch._autocast import cuda_autocast_op_names
from memfit.estimate.torch._tracer import run_trace
from memfit.estimate.torch.trace import estimate_torch, trace_requests

GPU = "RTX 4070"  # a CUDA target: the estimate's figures are for this GPU
DTYPES = [torch.float16, torch.bfloat16]
IDS = ["float16", "bfloat16"]

# --- a small CNN, inference -------------------------------------------------------------------

B, C0, C1, HW, CLASSES = 2, 3, 8, 8, 10


class _CNN(torch.nn.Module):
    """conv1, then conv2 twice (the same weights), a 2x nearest upsample, mean, linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(C0, C1, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(C1, C1, 3, padding=1)
        self.fc = torch.nn.Linear(C1, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv1(x))
        x = torch.relu(self.conv2(x))
        x = torch.relu(self.conv2(x))
        x = torch.nn.functional.interpolate(x, scale_factor=2.0, mode="nearest")
        out: torch.Tensor = self.fc(x.mean((2, 3)))
        return out


def _cnn_peak(device_type: str, dtype: torch.dtype, *, cuda_target: bool = True) -> int:
    def build() -> tuple[Any, Any]:
        return _CNN(), None

    def step(model: Any, _opt: Any, x: torch.Tensor) -> None:
        with torch.no_grad(), torch.autocast(device_type, dtype=dtype):
            model(x)

    def make_batch(n: int) -> torch.Tensor:
        return torch.randn(n, C0, HW, HW)

    if cuda_target:
        est = estimate_torch(build, step, make_batch, [B], gpu=GPU, steps=1, kernel_scratch=False)
    elif device_type == "cuda":  # figures for this CPU: autocast("cuda") switches itself off
        with pytest.warns(UserWarning, match="CUDA is not available"):
            est = estimate_torch(build, step, make_batch, [B], steps=1, kernel_scratch=False)
    else:  # figures for this CPU: autocast("cpu") runs with the CPU's own rules
        est = estimate_torch(build, step, make_batch, [B], steps=1, kernel_scratch=False)
    return est.points[0].exact_peak


def _cnn_terms(dtype: torch.dtype) -> dict[str, int]:
    e = torch.empty((), dtype=dtype).element_size()
    conv1_w, conv2_w = C1 * C0 * 9 + C1, C1 * C1 * 9 + C1
    act = B * C1 * HW * HW  # elements of one conv output
    return {
        "params": 4 * (conv1_w + conv2_w + CLASSES * C1 + CLASSES),
        "input": 4 * B * C0 * HW * HW,
        "cache": e * (conv1_w + conv2_w),  # one low-precision copy of each conv, kept to exit
        "act": act,
        "e": e,
    }


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_cnn_inference_peak_follows_cuda_rules(dtype: torch.dtype) -> None:
    t = _cnn_terms(dtype)
    e, act = t["e"], t["act"]
    base = t["params"] + t["input"]
    # CUDA: the convolutions run in the low dtype (cached weight copies live to the region's
    # end); upsample_nearest2d is on CUDA's float32 list, so at the upsample its input (the
    # last relu, low dtype), that input cast to float32 and the float32 output (4x the
    # elements) are live with the cache.
    cuda = base + t["cache"] + e * act + 4 * act + 4 * 4 * act
    # Before it, at the second use of conv2: three low-precision activations.
    assert cuda > base + t["cache"] + 3 * e * act
    assert _cnn_peak("cuda", dtype) == cuda
    # The CPU's rules keep the upsample in the low dtype: another figure, which a trace for
    # this CPU gives.
    cpu_rules = base + t["cache"] + e * act + e * 4 * act
    assert cpu_rules != cuda
    assert _cnn_peak("cpu", dtype, cuda_target=False) == cpu_rules
    # For a CUDA target the traced tensors stand for CUDA tensors: a region named after
    # their device ("cpu") is CUDA's, as the same code's region is on the GPU.
    assert _cnn_peak("cpu", dtype) == cuda
    # For a CPU target CUDA autocast is off, as on this machine: float32 throughout.
    assert _cnn_peak("cuda", dtype, cuda_target=False) == base + 4 * act + 4 * 4 * act


def test_weight_cast_cache_makes_one_copy_per_parameter_per_region() -> None:
    def build() -> tuple[Any, Any]:
        return _CNN(), None

    def step(model: Any, _opt: Any, x: torch.Tensor) -> None:
        with torch.no_grad():
            with torch.autocast("cuda", dtype=torch.float16):
                model(x)  # conv2 twice: its weight is cast once
            with torch.autocast("cuda", dtype=torch.float16):
                model(x)  # a new region: cast again

    requests = trace_requests(
        build, step, lambda n: torch.randn(n, C0, HW, HW), B, gpu=GPU, steps=1, kernel_scratch=False
    )
    casts = Counter(r.nbytes for r in requests if r.op == "aten._to_copy.default")
    assert casts[2 * C1 * C1 * 9] == 2  # conv2's weight: once per region, not once per call
    assert casts[2 * C1 * C0 * 9] == 2


# --- a transformer block ----------------------------------------------------------------------

S, D, H = 8, 32, 2


class _Block(torch.nn.Module):
    """Pre-norm attention and MLP, written with the plain ops CUDA's lists name."""

    def __init__(self) -> None:
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(D)
        self.qkv = torch.nn.Linear(D, 3 * D)
        self.proj = torch.nn.Linear(D, D)
        self.ln2 = torch.nn.LayerNorm(D)
        self.fc1 = torch.nn.Linear(D, 4 * D)
        self.fc2 = torch.nn.Linear(4 * D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        q, k, v = self.qkv(self.ln1(x)).view(b, S, 3, H, D // H).permute(2, 0, 3, 1, 4)
        att = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, S, D))
        out: torch.Tensor = x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))
        return out


def _block_requests(
    device_type: str, dtype: torch.dtype, gpu: str | None = GPU
) -> dict[str, list[int]]:
    def build() -> tuple[Any, Any]:
        return _Block(), None

    def step(model: Any, _opt: Any, batch: Any) -> None:
        x, y = batch
        with torch.autocast(device_type, dtype=dtype):
            torch.nn.functional.mse_loss(model(x), y)

    requests = trace_requests(
        build,
        step,
        lambda n: (torch.randn(n, S, D), torch.randn(n, S, D)),
        B,
        gpu=gpu,
        steps=1,
        kernel_scratch=False,
    )
    by_op: dict[str, list[int]] = {}
    for r in requests:
        if r.target == "all" and r.op is not None:
            by_op.setdefault(r.op, []).append(r.nbytes)
    return {op: sorted(sizes) for op, sizes in by_op.items()}


def _linear_casts(e: int) -> list[int]:
    """The low-precision copies the four linears make: each weight and bias (cached), and
    the float32 inputs (the layer norms' outputs) of qkv and fc1."""
    weights = [3 * D * D, 3 * D, D * D, D, 4 * D * D, 4 * D, D * 4 * D, D]
    return [e * n for n in weights] + [e * B * S * D] * 2


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_transformer_block_casts_follow_cuda_rules(dtype: torch.dtype) -> None:
    e = torch.empty((), dtype=dtype).element_size()
    scores = B * H * S * S
    got = _block_requests("cuda", dtype)
    # softmax runs in float32 on CUDA (its output is float32 either way); the float32
    # probabilities are cast down for att @ v (matmul: low precision).
    expected = [*_linear_casts(e), e * scores]
    if dtype == torch.bfloat16:
        expected.append(4 * scores)  # softmax(bf16, dtype=float32) copies its input first
    # float16 runs _softmax(half_to_float=True), CUDA only: no float32 copy of the input.
    assert got["aten._to_copy.default"] == sorted(expected)
    assert got["aten._softmax.default"] == [4 * scores]
    # The layer norms' inputs are float32 (the residual stream): float32 out, mean, rstd.
    norm_out = [4 * B * S * D, 4 * B * S, 4 * B * S]
    assert got["aten.native_layer_norm.default"] == sorted(norm_out * 2)
    # The linears (addmm) give low-precision outputs.
    assert got["aten.addmm.default"] == sorted(e * B * S * n for n in (3 * D, D, 4 * D, D))

    # The CPU's rules (a trace for this CPU) leave softmax alone: low-precision
    # probabilities, no cast for att @ v.
    cpu = _block_requests("cpu", dtype, gpu=None)
    assert cpu["aten._softmax.default"] == [e * scores]
    assert cpu["aten._to_copy.default"] == sorted(_linear_casts(e))
    assert cpu["aten._to_copy.default"] != got["aten._to_copy.default"]
    # For a CUDA target a region named after the traced tensors' device is CUDA's.
    assert _block_requests("cpu", dtype) == got


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_training_step_with_grad_scaler(dtype: torch.dtype) -> None:
    def build() -> tuple[Any, Any]:
        model = _Block()
        return model, torch.optim.AdamW(model.parameters())

    def step(model: Any, opt: Any, batch: Any) -> None:
        x, y = batch
        scaler = torch.amp.GradScaler("cuda")
        with torch.autocast("cuda", dtype=dtype):
            loss = torch.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)

    def make_batch(n: int) -> Any:
        return torch.randn(n, S, D), torch.randn(n, S, D)

    est = estimate_torch(build, step, make_batch, [2, 4], gpu=GPU, kernel_scratch=False)
    notes = " | ".join(est.deviations)
    assert "traced with CUDA's autocast rules" in notes
    assert "GradScaler('cuda') traced as on the GPU" in notes
    assert "could not be read" not in notes
    # The casts are recorded by autograd: every gradient is float32, of its parameter's size.
    trace = run_trace(build, step, make_batch, 2, "cpu", 2, cuda_target=True)
    params = sorted(4 * p.numel() for p in _Block().parameters())
    grads = sorted(r.nbytes for r in trace.records if r.category == "gradients")
    assert grads == sorted(params * 2)  # two steps, zero_grad(set_to_none) between them


def test_casts_hold_no_tensor_past_its_op() -> None:
    """The trace is the same with the garbage collector off: nothing the emulation does keeps
    a traced tensor alive in a reference cycle (a free would then wait for a collection)."""
    import gc

    def build() -> tuple[Any, Any]:
        model = _Block()
        return model, torch.optim.SGD(model.parameters())

    def step(model: Any, opt: Any, batch: Any) -> None:
        x, y = batch
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()

    def events() -> list[tuple[int, bool, int]]:
        def make_batch(n: int) -> Any:
            return torch.randn(n, S, D), torch.randn(n, S, D)

        trace = run_trace(build, step, make_batch, B, "cpu", 2, cuda_target=True)
        index = {id(r): i for i, r in enumerate(trace.records)}
        return [(index[id(r)], alloc, r.nbytes) for r, alloc in trace.events]

    with_gc = events()
    gc.disable()
    try:
        without_gc = events()
    finally:
        gc.enable()
    assert with_gc == without_gc


def test_attention_mask_is_cast_down_with_the_inputs() -> None:
    """scaled_dot_product_attention is on CUDA's low-precision list: a float32 mask is cast
    to float16 with q, k, v (the rule is read past the math path's own upcasts)."""
    e = 2

    def build() -> tuple[Any, Any]:
        return torch.nn.Linear(D, D), None

    def step(model: Any, _opt: Any, batch: Any) -> None:
        x, mask = batch
        with torch.autocast("cuda", dtype=torch.float16):
            q = model(x)
            torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=mask)

    requests = trace_requests(
        build,
        step,
        lambda n: (torch.randn(n, H, S, D), torch.randn(n, H, S, S)),
        B,
        gpu=GPU,
        steps=1,
        kernel_scratch=False,
    )
    casts = sorted(r.nbytes for r in requests if r.op == "aten._to_copy.default")
    # The linear's input, weight and bias, then the mask.
    assert casts == sorted([e * B * H * S * D, e * D * D, e * D, e * B * H * S * S])


def test_grad_scaler_made_before_the_trace_is_named() -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: "CUDA is not available. Disabling."
        scaler = torch.amp.GradScaler("cuda")  # built here, outside the trace: disabled

    def build() -> tuple[Any, Any]:
        model = torch.nn.Linear(4, 4)
        return model, torch.optim.SGD(model.parameters())

    def step(model: Any, opt: Any, x: torch.Tensor) -> None:
        with torch.autocast("cuda"):
            loss = model(x).float().sum()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    est = estimate_torch(
        build, step, lambda n: torch.randn(n, 4), [2], gpu=GPU, kernel_scratch=False
    )
    notes = " | ".join(est.deviations)
    assert "made before the trace" in notes
    assert "GradScaler('cuda') traced as on the GPU" not in notes


@pytest.mark.parametrize("reentrant", [False, True], ids=["non_reentrant", "reentrant"])
def test_activation_checkpointing_recomputes_under_cuda_rules(reentrant: bool) -> None:
    """torch.utils.checkpoint recomputes the forward in backward under the autocast state it
    saved for the tensors' device; on the GPU that is CUDA's, so the recomputation casts the
    weights again (a new region: the cache was cleared) and matches the forward's dtypes."""
    from torch.utils.checkpoint import checkpoint

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(D, D)
            self.b = torch.nn.Linear(D, D)

        def inner(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.b(torch.relu(self.a(x)))
            return out

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = checkpoint(self.inner, x, use_reentrant=reentrant)
            return out

    def build() -> tuple[Any, Any]:
        return Net(), None

    def step(model: Any, _opt: Any, x: torch.Tensor) -> None:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(x).float().sum()
        loss.backward()

    requests = trace_requests(
        build,
        step,
        lambda n: torch.randn(n, D, requires_grad=True),
        B,
        gpu=GPU,
        steps=1,
        kernel_scratch=False,
    )
    casts = Counter(r.nbytes for r in requests if r.op == "aten._to_copy.default")
    assert casts[2 * D * D] == 4  # each weight: once in the forward, once in the recomputation


def test_banned_op_is_refused_as_on_cuda() -> None:
    def build() -> tuple[Any, Any]:
        return torch.nn.Linear(4, 4), None

    def step(model: Any, _opt: Any, x: torch.Tensor) -> None:
        with torch.autocast("cuda"):
            torch.nn.functional.binary_cross_entropy(torch.sigmoid(model(x)), x.clamp(0, 1))

    with pytest.raises(EstimateError, match="unsafe to autocast"):
        estimate_torch(build, step, lambda n: torch.rand(n, 4), [2], gpu=GPU, kernel_scratch=False)


def test_without_a_free_dispatch_key_the_region_is_traced_in_float32_and_said_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from memfit.estimate.torch import _autocast

    monkeypatch.setattr(_autocast, "_CANDIDATE_KEYS", ())
    t = _cnn_terms(torch.float16)
    act = t["act"]
    assert _cnn_peak("cuda", torch.float16) == t["params"] + t["input"] + 4 * act + 16 * act

    def build() -> tuple[Any, Any]:
        return torch.nn.Linear(4, 4), None

    def step(model: Any, _opt: Any, x: torch.Tensor) -> None:
        with torch.autocast("cuda"):
            model(x)

    est = estimate_torch(
        build, step, lambda n: torch.randn(n, 4), [2], gpu=GPU, kernel_scratch=False
    )
    assert any("no autocast dispatch key free" in d for d in est.deviations)


def test_op_lists_are_read_from_the_installed_torch() -> None:
    names = cuda_autocast_op_names()
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    assert names and all(has(n, "AutocastCUDA") for n in names)
    # CUDA keeps layer_norm in float32; the CPU's lists do not name it.
    assert "aten::layer_norm" in names
    assert not has("aten::layer_norm", "AutocastCPU")
