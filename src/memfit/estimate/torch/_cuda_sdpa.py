"""Which kernel ``scaled_dot_product_attention`` runs on a CUDA target, and what it keeps.

On CUDA, ``torch.nn.functional.scaled_dot_product_attention`` chooses one of four kernels at
run time (``sdp::select_sdp_backend`` in ``aten/src/ATen/native/transformers/cuda/
sdp_utils.cpp``): FlashAttention, the memory-efficient (cutlass) kernel, cuDNN's attention,
or the math composite that materialises the score matrix. Each has its own gates (the GPU's
compute capability, dtype, head size, mask, dropout, strides, the user's
``torch.backends.cuda`` flags) and its own memory: flash and memory-efficient keep a
float32 log-sum-exp of ``[B, H, L]`` (the memory-efficient one padded to 32) and the RNG
state for backward, where math keeps the ``[B, H, L, S]`` softmax (float32 for half inputs)
and its dropout mask. A CPU trace would run the CPU's choice (CPU flash attention or math);
for a CUDA target :func:`choose` makes CUDA's, and :func:`run` calls the kernel CUDA would
call on the traced tensors (the fake kernels of those ops give CUDA's shapes, and autograd
saves what their derivative formulas save).

The target's torch decides more than the gates: torch 2.0 and 2.1 ran FlashAttention 1
through its packed, variable-length API (q, k, v copied to ``[B * L, H, D]``, the output made
in that layout), 2.2 and later FlashAttention 2 on strided tensors (:func:`_legacy_flash`).

What is read from the installed torch at each call: the backend flags (``enable_*_sdp``,
``sdpa_kernel`` contexts set them), a priority order the user set, the math kernel's
reduced-precision flag, deterministic mode. What cannot be read from a torch without a GPU,
and is modelled here from ``sdp_utils.cpp`` and its history (cited per rule): the gates
that depend on the GPU, and how they moved between torch versions for the target's torch.

:func:`backward_scratch` sizes what the backward kernels take inside (FlashAttention-2's
``dq_accum`` and ``softmax_d``, the memory-efficient kernel's ``delta`` and gradient
accumulators): allocated through the caching allocator and given back when the kernel ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from memfit.hardware.rules import rule

__all__ = [
    "SDPA_BACKENDS",
    "SdpaChoice",
    "backward_scratch",
    "choose",
    "run",
]

#: Backend names in torch's ``SDPBackend`` enum order (``math`` is 0).
SDPA_BACKENDS: tuple[str, ...] = (
    "math",
    "flash_attention",
    "efficient_attention",
    "cudnn_attention",
    "overrideable",
)
_DEFAULT_ORDER = (1, 2, 0, 3, 4)  # flash, efficient, math, cudnn, overrideable
_CUDNN_FIRST = (3, 1, 2, 0, 4)


@dataclass(frozen=True)
class SdpaChoice:
    """The kernel chosen for one call, and why the ones before it were not.

    Attributes:
        backend: One of :data:`SDPA_BACKENDS` (``"error"`` when none is enabled).
        reasons: ``backend: reason`` for each backend tried before it.
        assumed: What the choice assumed that the target did not say (an unknown GPU).
    """

    backend: str
    reasons: tuple[str, ...] = ()
    assumed: str | None = None


def _flag(name: str) -> bool:
    """One of ``torch.backends.cuda``'s SDPA switches (``sdpa_kernel`` contexts set them)."""
    return bool(getattr(torch.backends.cuda, name)())


def _version_key(version: tuple[int, int] | None) -> tuple[int, int]:
    return version if version is not None else (99, 0)


def _priority(
    capability: tuple[int, int], torch_version: tuple[int, int] | None
) -> tuple[int, ...]:
    """The priority order the target's torch uses: one the user set in this process wins;
    otherwise the default of that torch version, which puts cuDNN first on some GPUs."""
    installed = tuple(int(i) for i in torch._C._get_sdp_priority_order())
    if installed != _DEFAULT_ORDER:
        return installed  # set by the user (sdpa_kernel(..., set_priority=True))
    # cuDNN first on some GPUs in some torch versions (hardware/rules_torch.json, cited per row)
    first = rule(
        "torch", "sdpa.cudnn_first", torch=_version_key(torch_version), capability=capability
    )
    return _CUDNN_FIRST if first else _DEFAULT_ORDER


def _same_batch_and_heads(q: Any, k: Any, v: Any, gqa: bool, *, gqa_ok: bool) -> bool:
    if not (q.shape[0] == k.shape[0] == v.shape[0]):
        return False
    if gqa and gqa_ok:
        return bool(q.shape[1] % k.shape[1] == 0 and k.shape[1] == v.shape[1])
    return bool(q.shape[1] == k.shape[1] == v.shape[1])


def _dense_ok(q: Any, k: Any, v: Any, *, ignore_singleton: bool) -> str | None:
    if q.shape[-2] == 0 or k.shape[-2] == 0:
        return "a zero sequence length"
    strides_one = q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1
    if ignore_singleton:
        strides_one = strides_one or q.shape[-1] == 1
    if not strides_one:
        return "the last dimension of q, k, v is not contiguous"
    return None


def _alignment(capability: tuple[int, int], half: bool) -> int:
    """``minimum_gemm_alignment`` of sdp_utils.cpp (elements)."""
    major = capability[0]
    tensor_cores = major >= 8 or (major >= 7 and half)
    align = 4 if major >= 8 else 1
    if tensor_cores:
        align = max(align, 128 // (16 if half else 32))
    return align


def _flash_reason(
    q: Any,
    k: Any,
    v: Any,
    mask: Any,
    dropout: float,
    causal: bool,
    gqa: bool,
    grad: bool,
    capability: tuple[int, int],
    version: tuple[int, int],
) -> str | None:
    if not _flag("flash_sdp_enabled"):
        return "disabled (torch.backends.cuda flags / sdpa_kernel)"
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return "q, k, v are not 4-D"
    if mask is not None:
        return "an attention mask is given"
    d = q.shape[-1]
    limit = rule("torch", "sdpa.flash.max_head_dim", torch=version)
    if not (d == k.shape[-1] == v.shape[-1] and d <= limit):
        return f"head sizes differ or exceed {limit}"
    if rule("torch", "sdpa.flash.head_dim_multiple_of_8", torch=version) and d % 8:
        return "head size is not a multiple of 8"
    low = tuple(rule("torch", "sdpa.flash.min_capability", torch=version))
    if not (low <= capability <= (12, 1)):
        return f"the GPU (sm{capability[0]}{capability[1]}) is outside sm{low[0]}{low[1]}-sm121"
    consumer = (8, 6) <= capability <= (8, 9) or (12, 0) <= capability <= (12, 1)
    if grad and consumer and not (d <= 192 or (dropout == 0.0 and d > 224)):
        return "training with this head size is not supported on sm86-89/sm120"
    if causal and q.shape[-2] != k.shape[-2]:
        return "is_causal with different query and key lengths"
    dtypes = (torch.float16, torch.bfloat16) if capability >= (8, 0) else (torch.float16,)
    if q.dtype not in dtypes or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"{str(q.dtype).removeprefix('torch.')} is not supported on this GPU"
    if not _same_batch_and_heads(q, k, v, gqa, gqa_ok=True):
        return "batch sizes or head counts differ"
    return _dense_ok(q, k, v, ignore_singleton=True)


def _efficient_reason(
    q: Any,
    k: Any,
    v: Any,
    mask: Any,
    dropout: float,
    gqa: bool,
    capability: tuple[int, int],
    version: tuple[int, int],
) -> str | None:
    if not _flag("mem_efficient_sdp_enabled"):
        return "disabled (torch.backends.cuda flags / sdpa_kernel)"
    if not ((5, 0) <= capability <= (12, 1)):
        return f"the GPU (sm{capability[0]}{capability[1]}) is outside sm50-sm121"
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return "q, k, v are not 4-D"
    takes_both = rule("torch", "sdpa.efficient.dropout_and_mask", torch=version)
    if not takes_both and (dropout > 0.0 or mask is not None):
        return "dropout or a mask (supported from torch 2.1)"
    half = q.dtype in (torch.float16, torch.bfloat16)
    align = _alignment(capability, half)
    dq, dv = q.shape[-1], v.shape[-1]
    if not (dq == k.shape[-1] and dq % align == 0 and dq > 0 and dv % align == 0 and dv > 0):
        return f"head sizes are not multiples of {align}"
    if capability >= (8, 0):
        size = q.element_size()
        for t in (q, k, v):
            if t.numel() and (t.storage_offset() * size) % (align * size):
                return "a storage offset is not aligned"
    reason = _dense_ok(q, k, v, ignore_singleton=False)
    if reason is not None:
        return reason
    if not _same_batch_and_heads(q, k, v, gqa, gqa_ok=True):
        return "batch sizes or head counts differ"
    dtypes: tuple[torch.dtype, ...] = (torch.float16, torch.float32)
    if capability >= (8, 0):
        dtypes = (torch.float16, torch.float32, torch.bfloat16)
    if q.dtype not in dtypes or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"{str(q.dtype).removeprefix('torch.')} is not supported on this GPU"
    return None


def _mask_shape_ok(mask: Any, q: Any, k: Any) -> bool:
    if mask is None:
        return True
    if mask.dim() not in (2, 4) or tuple(mask.shape[-2:]) != (q.shape[-2], k.shape[-2]):
        return False
    if mask.dim() == 4:
        return mask.shape[0] in (1, q.shape[0]) and mask.shape[1] in (1, q.shape[1])
    return True


def _cudnn_reason(
    q: Any,
    k: Any,
    v: Any,
    mask: Any,
    dropout: float,
    gqa: bool,
    grad: bool,
    capability: tuple[int, int],
    version: tuple[int, int],
) -> str | None:
    if not rule("torch", "sdpa.cudnn.default_backend", torch=version):
        return "not a default backend before torch 2.5"
    if not _flag("cudnn_sdp_enabled"):
        return "disabled (torch.backends.cuda flags / sdpa_kernel)"
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return "q, k, v are not 4-D"
    if torch.are_deterministic_algorithms_enabled() and not (
        torch.is_deterministic_algorithms_warn_only_enabled()
    ):
        return "deterministic algorithms are on"
    dtypes = (torch.float16, torch.bfloat16) if capability >= (8, 0) else (torch.float16,)
    if q.dtype not in dtypes or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"{str(q.dtype).removeprefix('torch.')} is not supported"
    if not _mask_shape_ok(mask, q, k):
        return "the mask's shape"
    if not ((8, 0) <= capability <= (12, 1)):
        return f"the GPU (sm{capability[0]}{capability[1]}) is outside sm80-sm121"
    sixteenths = rule("torch", "sdpa.cudnn.dropout_sixteenths", torch=version)
    if sixteenths and dropout * 16.0 != int(dropout * 16.0):
        return "dropout is not a multiple of 1/16"
    reason = _dense_ok(q, k, v, ignore_singleton=True)
    if reason is not None:
        return reason
    if not (q.shape[0] == k.shape[0] == v.shape[0]):
        return "batch sizes differ"
    if k.shape[1] != v.shape[1] or q.shape[1] % k.shape[1]:
        return "head counts differ"
    d_qk, d_v = q.shape[-1], v.shape[-1]
    limit = rule("torch", "sdpa.cudnn.max_head_dim", torch=version, capability=capability)
    if d_qk > limit or d_v > limit or d_qk % 8 or d_v % 8:
        return f"head size over {limit} or not a multiple of 8"
    if k.shape[-2] == 1 or (dropout > 0.0 and q.shape[-2] == 1):
        return "a sequence length of 1"
    if (
        grad
        and limit == 256
        and not ((d_qk <= 128 and d_v <= 128) or (d_qk, d_v) in ((192, 128), (256, 256)))
    ):
        return "backward with these head sizes"
    return None


def choose(
    q: Any,
    k: Any,
    v: Any,
    mask: Any,
    dropout: float,
    causal: bool,
    gqa: bool,
    *,
    capability: tuple[int, int] | None,
    torch_version: tuple[int, int] | None,
) -> SdpaChoice:
    """The backend ``sdp::select_sdp_backend`` picks for this call on the target.

    Args:
        q, k, v, mask: The traced tensors (their shapes, dtypes and strides decide).
        dropout: ``dropout_p`` as the call passes it (0 outside training).
        causal, gqa: ``is_causal`` and ``enable_gqa``.
        capability: The GPU's compute capability; ``None`` assumes sm80 (and says so).
        torch_version: The target's torch ``(major, minor)``; ``None``: the installed one's
            rules (the newest modelled).
    """
    assumed = None
    if capability is None:
        capability = (8, 0)
        assumed = "compute capability unknown: sm80's choice assumed"
    version = _version_key(torch_version)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    flags = (
        _flag("flash_sdp_enabled"),
        _flag("mem_efficient_sdp_enabled"),
        _flag("math_sdp_enabled"),
        _flag("cudnn_sdp_enabled"),
    )
    if not any(flags):
        return SdpaChoice("error", ("every backend is disabled",), assumed)
    reasons: list[str] = []
    for index in _priority(capability, torch_version):
        name = SDPA_BACKENDS[index]
        if name == "flash_attention":
            why = _flash_reason(q, k, v, mask, dropout, causal, gqa, grad, capability, version)
        elif name == "efficient_attention":
            why = _efficient_reason(q, k, v, mask, dropout, gqa, capability, version)
        elif name == "cudnn_attention":
            why = _cudnn_reason(q, k, v, mask, dropout, gqa, grad, capability, version)
        elif name == "math":
            why = None if _flag("math_sdp_enabled") else "disabled"
        else:
            continue
        if why is None:
            return SdpaChoice(name, tuple(reasons), assumed)
        reasons.append(f"{name}: {why}")
    return SdpaChoice("error", tuple(reasons), assumed)


def _bool_mask_to_float(mask: Any, dtype: torch.dtype) -> Any:
    """``convert_boolean_attn_mask`` of attention.cpp: a new mask of the query's dtype."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    zero = torch.scalar_tensor(0.0, dtype=dtype, device=mask.device)
    return torch.where(mask.logical_not(), -float("inf"), zero)


def _pad_last(t: Any, to: int) -> Any:
    extra = -t.shape[-1] % to
    if extra == 0:
        return t
    return torch.nn.functional.pad(t, (0, extra))


def _compute_logsumexp(q: Any, k: Any, v: Any) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))


def run(
    backend: str,
    q: Any,
    k: Any,
    v: Any,
    mask: Any,
    dropout: float,
    causal: bool,
    scale: float | None,
    gqa: bool,
    *,
    legacy_flash: bool = False,
) -> Any:
    """The CUDA branch of ``scaled_dot_product_attention`` (attention.cpp) for ``backend``,
    on the traced tensors. ``legacy_flash``: the target's torch runs FlashAttention 1 (torch
    2.0 and 2.1), see :func:`_legacy_flash`."""
    aten = torch.ops.aten
    if backend == "flash_attention":
        if legacy_flash:
            return _legacy_flash(q, k, v, dropout, causal, scale)
        d = q.shape[-1]
        og_scale = scale if scale is not None else d**-0.5
        out = aten._scaled_dot_product_flash_attention.default(
            _pad_last(q, 8),
            _pad_last(k, 8),
            _pad_last(v, 8),
            dropout,
            causal,
            False,
            scale=og_scale,
        )[0]
        return out[..., :d] if out.shape[-1] != d else out
    if backend == "efficient_attention":
        lse = _compute_logsumexp(q, k, v)
        bias = _bool_mask_to_float(mask, q.dtype)
        if bias is not None:  # preprocess_mask: the last dimension padded to 16, then sliced
            width = bias.shape[-1]
            bias = _pad_last(bias, 16)[..., :width].expand(
                q.shape[0], q.shape[1], q.shape[-2], k.shape[-2]
            )
        return aten._scaled_dot_product_efficient_attention.default(
            q, k, v, bias, lse, dropout, causal, scale=scale
        )[0]
    if backend == "cudnn_attention":
        lse = _compute_logsumexp(q, k, v)
        return aten._scaled_dot_product_cudnn_attention.default(
            q, k, v, mask, lse, dropout, causal, False, scale=scale
        )[0]
    bias = _bool_mask_to_float(mask, q.dtype)
    return aten._scaled_dot_product_attention_math.default(
        q, k, v, bias, dropout, causal, None, scale=scale, enable_gqa=gqa
    )[0]


def _varlen_view_copies(t: Any) -> bool:
    """Whether ``t`` (``[B, H, L, D]``) must be copied to be read as FlashAttention 1's packed
    ``[B * L, H, D]`` (``t.transpose(1, 2).reshape(...)`` copies unless batch and sequence
    merge in its strides)."""
    b, _, length, _ = (int(s) for s in t.shape)
    return b > 1 and length > 1 and int(t.stride(0)) != length * int(t.stride(2))


def _legacy_flash(q: Any, k: Any, v: Any, dropout: float, causal: bool, scale: Any) -> Any:
    """FlashAttention 1 as torch 2.0 and 2.1 call it (``_scaled_dot_product_flash_attention_
    cuda`` in aten/src/ATen/native/transformers/cuda/attention.cu of v2.0.0 and v2.1.0): q, k
    and v are reshaped to the packed ``[B * L, H, D]`` layout of its variable-length API (a
    copy each when they are not laid out so, given back when the call ends), and the output
    is made in that layout, ``[B, L, H, D]``-contiguous, then returned as the ``[B, H, L, D]``
    view. From torch 2.2 FlashAttention 2 reads strided inputs and makes its output like the
    query (``empty_like``), so a caller's ``permute(...).contiguous()`` after it, as
    ``nn.MultiheadAttention`` does, copies on 2.0/2.1 and not later: one more ``[B, L, E]``
    tensor kept per layer for the output projection's backward."""
    with torch.no_grad():  # the packed copies: taken and given back inside the call
        packed = [t.transpose(1, 2).reshape(-1, t.shape[1], t.shape[-1]) for t in (q, k, v)]
    out = torch.ops.aten._scaled_dot_product_flash_attention.default(
        q, k, v, dropout, causal, False, scale=scale if scale is not None else q.shape[-1] ** -0.5
    )[0]
    del packed
    if out.transpose(1, 2).is_contiguous():
        return out
    # The packed output: autograd keeps the kernel's own output for backward (the same size
    # as FlashAttention 1's), the caller gets the packed layout.
    return out.transpose(1, 2).contiguous().transpose(1, 2)


def _round(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def _contiguous_copy(grad_out: Any) -> int:
    """The copy the kernel makes of the incoming gradient (``[B, L, H, D]``-contiguous is
    what it reads; a gradient laid out otherwise is copied first)."""
    if grad_out.transpose(1, 2).is_contiguous():
        return 0
    return int(grad_out.numel()) * int(grad_out.element_size())


def _legacy_flash_backward(args: Sequence[Any]) -> int:
    """FlashAttention 1's backward as torch 2.0/2.1 run it (``mha_bwd`` in
    ``cuda/flash_attn/fmha_api.cpp``): packed copies of q, k, v and the incoming gradient
    where they are not laid out ``[B * L, H, D]`` (the output already is), ``softmax_d``,
    float32 ``[B, H, round16(Lq)]``, and a float32 ``dq`` accumulator of ``[B * Lq, H, D]``
    when the keys span more than one block (``blocksize_c``: 256 for head sizes up to 64,
    128 above; the keys rounded to 128, 256 or a multiple of it)."""
    grad_out, q, k, v = args[0], args[1], args[2], args[3]
    b, h, lq, d = (int(s) for s in q.shape)
    lk = int(k.shape[2])
    copied = [t for t in (q, k, v, grad_out) if _varlen_view_copies(t)]
    total = sum(int(t.numel()) * int(t.element_size()) for t in copied)
    total += b * h * _round(lq, 16) * 4
    block = 256 if d <= 64 else 128
    keys = 128 if lk <= 128 else 256 if lk <= 256 else _round(lk, block)
    if keys > block:
        total += b * lq * h * d * 4
    return total


def backward_scratch(name: str, args: Sequence[Any], *, legacy_flash: bool = False) -> int:
    """Bytes a backward attention kernel takes inside (0 for ops without a model).

    * FlashAttention-2 (``mha_bwd`` in flash_api.cpp): ``softmax_d``, float32
      ``[B, H, round128(Lq)]``, and ``dq_accum``, float32 ``[B, round128(Lq), H,
      round(D, 32 or 64)]``; with fewer key/value heads than query heads (GQA), ``dk`` and
      ``dv`` expanded to the query's heads.
    * Memory-efficient (``_efficient_attention_backward``): ``delta``, float32 ``[B, H, Lq]``,
      and the kernel's gradient accumulators (``workspace_size()`` in kernel_backward.h): a
      float32 dQ of ``[B, H, round64(Lq), round64(D)]`` when keys span more than one block,
      and float32 dK, dV where the kernel cannot keep them in registers (float32 inputs or
      head sizes over 64).
    * cuDNN's backward takes a workspace its graph asks for, which no public source sizes;
      it is bounded here by the float32 dQ accumulator FlashAttention would take.

    A gradient that does not arrive ``[B, L, H, D]``-contiguous is copied first (both
    flash and memory-efficient kernels make it contiguous).
    """
    if name.startswith("aten._scaled_dot_product_flash_attention_backward"):
        if legacy_flash:
            return _legacy_flash_backward(args)
        grad_out, q, k = args[0], args[1], args[2]
        b, h, lq, d = (int(s) for s in q.shape)
        hk = int(k.shape[1])
        d_pad = _round(d, 8)
        d_round = _round(d_pad, 32 if d_pad <= 128 else 64)
        lq_r = _round(lq, 128)
        total = b * h * lq_r * 4 + b * lq_r * h * d_round * 4
        if hk != h:
            total += 2 * b * int(k.shape[2]) * h * d_pad * q.element_size()
        return total + _contiguous_copy(grad_out)
    if name.startswith("aten._scaled_dot_product_efficient_attention_backward"):
        q, k = args[1], args[2]
        b, h, lq, d = (int(s) for s in q.shape)
        lk = int(k.shape[2])
        total = b * h * lq * 4  # delta
        if lk > 64:
            total += b * h * _round(lq, 64) * _round(d, 64) * 4
        if q.dtype == torch.float32 or d > 64:
            total += 2 * b * h * _round(lk, 64) * _round(d, 64) * 4
        return total + _contiguous_copy(args[0])
    if name.startswith("aten._scaled_dot_product_cudnn_attention_backward"):
        q = args[1]
        b, h, lq, d = (int(s) for s in q.shape)
        return b * h * _round(lq, 128) * _round(d, 32) * 4
    return 0
