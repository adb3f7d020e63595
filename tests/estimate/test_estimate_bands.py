"""Issue 41: an estimate's figures with their band (``TorchEstimate.band``,
``JaxEstimate.band``), from the same table the planner uses."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

import memfit
from memfit.core.bands import load_bands
from memfit.errors import ConfigError


def test_torch_estimate_band_is_the_traced_band_around_each_figure() -> None:
    torch = pytest.importorskip("torch")
    nn = torch.nn

    def build() -> tuple[Any, Any]:
        model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
        return model, torch.optim.SGD(model.parameters(), lr=0.1)

    def step(model: Any, opt: Any, batch: Any) -> None:
        model(batch).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    est = memfit.estimate_torch(
        build, step, lambda n: torch.randn(n, 64), [4, 8], gpu="RTX 4070", kernel_scratch=False
    )
    point = est.points[-1]
    # the band of the figure's family: the reserved peak of a step without convolutions,
    # its high side widened by the share of operators whose kernels are assumed
    assert est.band_family("reserved_peak") == "reserved/other"
    low, high = load_bands().interval(point.reserved_peak, "traced", "reserved/other")
    widen = round((high - point.reserved_peak) * est.assumed_share)
    assert est.band("reserved_peak") == (low, high + widen)
    assert est.to_measured().family == "allocated/other"
    low, high = est.band("allocated_peak", batch_size=4)
    assert low <= est.points[0].allocated_peak <= high
    assert point.device_used_peak is not None and est.context is not None
    low, high = est.band("device_used_peak")
    traced = load_bands().interval(
        point.device_used_peak - est.context.bytes, "traced", "reserved/other"
    )
    # the context's own basis: its kernel images were measured on the H100 only, so on an
    # RTX 4070 they are assumed (the widest band)
    assert est.context.basis == "assumed"
    context = load_bands().interval(est.context.bytes, "assumed", term="cuda_context")
    widen = round((traced[1] - (point.device_used_peak - est.context.bytes)) * est.assumed_share)
    assert (low, high) == (traced[0] + context[0], traced[1] + context[1] + widen)
    with pytest.raises(ConfigError, match="name must be one of"):
        est.band("peak")
    with pytest.raises(ConfigError, match="batch_size 16 was not traced"):
        est.band("reserved_peak", batch_size=16)


def test_jax_estimate_band_is_the_compiled_band() -> None:
    jax = pytest.importorskip("jax")
    jnp = jax.numpy

    def layer(x: Any, w: Any) -> Any:
        return jnp.tanh(x @ w)

    est = memfit.estimate_jax(
        layer,
        jax.ShapeDtypeStruct((128, 256), jnp.float32),
        jax.ShapeDtypeStruct((256, 64), jnp.float32),
    )
    assert est.program is None  # an MLP's compile: the compiled band
    assert est.band("argument_bytes") == load_bands().interval(est.argument_bytes, "compiled")
    # a compile with cuDNN convolutions is a program class of its own (its scratch is
    # autotuned on the device): its band, the widest without calibration cases
    conv = replace(est, program="conv")
    assert conv.band("argument_bytes") == load_bands().interval(
        est.argument_bytes, "compiled", "conv"
    )
    assert conv.band("argument_bytes")[1] > est.band("argument_bytes")[1]
    with pytest.raises(ConfigError, match="no device_used_bytes"):
        est.band("device_used_bytes")  # CPU backend, no GPU named
    with pytest.raises(ConfigError, match="name must be one of"):
        est.band("nope")


def test_jax_estimate_context_band_follows_the_jax_context_basis() -> None:
    """The CUDA context in ``device_used_bytes`` takes the band of its basis, as
    ``cuda_context(..., framework="jax")`` gives it (``assumed`` on every card today: no
    reading of a JAX step fitted its kernel images), not a fixed one."""
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    from memfit.hardware.catalog import gpu
    from memfit.hardware.runtime import cuda_context

    est = memfit.estimate_jax(
        lambda x: jnp.tanh(x) * 2, jax.ShapeDtypeStruct((64, 32), jnp.float32), gpu="H100"
    )
    jax_context = cuda_context(gpu("H100"), framework="jax")
    assert est.context_basis == jax_context.basis == "assumed"
    assert est.to_dict()["context_basis"] == "assumed"
    used = est.device_used_bytes
    context = jax_context.bytes
    assert used is not None and used > context  # the step's buffers on top of the context
    # compiled by XLA's GPU compiler (the gpu-target extra): the band of the program's
    # alternatives (none here: no GEMM), else the compiled band
    family = est.alternatives_family and f"alternatives/{est.alternatives_family}"
    compiled = load_bands().interval(used - context, "compiled", family)
    for basis in ("assumed", "fitted"):
        # the context's band is the one of the basis the estimate carries
        ctx = load_bands().interval(context, basis, term="cuda_context")
        other = replace(est, context_basis=basis, breakdown=(("CUDA context", context, "x"),))
        assert other.band("device_used_bytes") == (compiled[0] + ctx[0], compiled[1] + ctx[1])
    fitted = replace(est, context_basis="fitted", breakdown=(("CUDA context", context, "x"),))
    assumed = replace(fitted, context_basis="assumed")
    assert assumed.band("device_used_bytes")[1] >= fitted.band("device_used_bytes")[1]


def test_torch_estimate_band_widens_with_the_share_of_assumed_kernels() -> None:
    torch = pytest.importorskip("torch")
    from dataclasses import replace

    def build() -> tuple[Any, Any]:
        return torch.nn.Linear(64, 64), None

    def step(model: Any, _opt: Any, batch: Any) -> None:
        model(batch).sum().backward()

    est = memfit.estimate_torch(
        build, step, lambda n: torch.randn(n, 64), [8], gpu="RTX 4070", kernel_scratch=False
    )
    peak = est.points[-1].reserved_peak
    low, high = load_bands().interval(peak, "traced", est.band_family("reserved_peak"))
    followed = replace(est, kernel_coverage={"followed": 10, "assumed": 0})
    half = replace(est, kernel_coverage={"followed": 5, "assumed": 5})
    assumed = replace(est, kernel_coverage={"followed": 0, "assumed": 10})
    assert followed.band("reserved_peak") == (low, high)
    assert half.band("reserved_peak") == (low, high + round((high - peak) * 0.5))
    assert assumed.band("reserved_peak") == (low, 2 * high - peak)  # twice the high side
    assert est.kernel_coverage["assumed"] > 0 and est.band("reserved_peak")[1] > high
