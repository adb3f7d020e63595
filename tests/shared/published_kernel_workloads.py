"""Published GPU runs whose memory turns on the kernel CUDA runs, rebuilt from their text.

The workloads of ``tests/data/published_truth/`` whose figures depend on CUDA's kernels rather
than on the CPU's (dropout's mask, the attention backend, cuDNN's workspace), for
``bench/published_truth.py``. Each function takes a run's ``settings`` and returns the
``build``, ``step`` and ``make_batch`` of :func:`memfit.estimate_torch`, rebuilt as the
source's code ran them (cited per workload).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any


@dataclass
class Rebuilt:
    """``build``, ``step`` and ``make_batch`` for :func:`memfit.estimate_torch`."""

    build: Callable[[], tuple[Any, Any]]
    step: Callable[[Any, Any, Any], None]
    make_batch: Callable[[int], Any]
    batch: int
    extras: dict[str, Any] = field(default_factory=dict)


# --- rasbt/LLMs-from-scratch, ch05/10_llm-training-speed: GPT-2 124M on an A100 ------------


def _gpt2_from_scratch(cfg: dict[str, Any], step: int) -> Any:
    """The chapter's GPT model as ``00_orig.py`` (step 0) and the README's steps 1-7 change
    it: the causal mask made on the fly (1), PyTorch's LayerNorm and GELU (6),
    ``scaled_dot_product_attention`` with a fused qkv projection (7)."""
    import torch
    from torch import nn

    class MultiHeadAttention(nn.Module):  # 00_orig.py
        def __init__(self) -> None:
            super().__init__()
            d = cfg["emb_dim"]
            self.num_heads, self.head_dim, self.d_out = cfg["n_heads"], d // cfg["n_heads"], d
            self.W_query = nn.Linear(d, d, bias=cfg["qkv_bias"])
            self.W_key = nn.Linear(d, d, bias=cfg["qkv_bias"])
            self.W_value = nn.Linear(d, d, bias=cfg["qkv_bias"])
            self.out_proj = nn.Linear(d, d)
            self.dropout = nn.Dropout(cfg["drop_rate"])
            if step < 1:
                n = cfg["context_length"]
                self.register_buffer("mask", torch.triu(torch.ones(n, n), diagonal=1))

        def forward(self, x: Any) -> Any:
            b, t, _ = x.shape
            keys = self.W_key(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
            queries = self.W_query(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
            values = self.W_value(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
            scores = queries @ keys.transpose(2, 3)
            if step < 1:
                mask_bool = self.mask.bool()[:t, :t]
            else:  # step 1: the mask made on the fly
                mask_bool = torch.triu(
                    torch.ones(t, t, device=x.device, dtype=torch.bool), diagonal=1
                )
            scores.masked_fill_(mask_bool, -torch.inf)
            weights = torch.softmax(scores / keys.shape[-1] ** 0.5, dim=-1)
            weights = self.dropout(weights)
            context = (weights @ values).transpose(1, 2).reshape(b, t, self.d_out)
            return self.out_proj(context)

    class PyTorchMultiHeadAttention(nn.Module):  # 01_opt_single_gpu.py
        def __init__(self) -> None:
            super().__init__()
            d = cfg["emb_dim"]
            self.num_heads, self.head_dim, self.d_out = cfg["n_heads"], d // cfg["n_heads"], d
            self.qkv = nn.Linear(d, 3 * d, bias=cfg["qkv_bias"])
            self.proj = nn.Linear(d, d)
            self.dropout = cfg["drop_rate"]

        def forward(self, x: Any) -> Any:
            b, t, _ = x.shape
            qkv = self.qkv(x).view(b, t, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
            queries, keys, values = qkv
            p = 0.0 if not self.training else self.dropout
            context = nn.functional.scaled_dot_product_attention(
                queries, keys, values, attn_mask=None, dropout_p=p, is_causal=True
            )
            return self.proj(context.transpose(1, 2).contiguous().view(b, t, self.d_out))

    class LayerNorm(nn.Module):
        def __init__(self, emb_dim: int) -> None:
            super().__init__()
            self.eps = 1e-5
            self.scale = nn.Parameter(torch.ones(emb_dim))
            self.shift = nn.Parameter(torch.zeros(emb_dim))

        def forward(self, x: Any) -> Any:
            mean = x.mean(dim=-1, keepdim=True)
            var = x.var(dim=-1, keepdim=True, unbiased=False)
            norm_x = (x - mean) / torch.sqrt(var + self.eps)
            return self.scale * norm_x + self.shift

    class GELU(nn.Module):
        def forward(self, x: Any) -> Any:
            inner = torch.sqrt(torch.tensor(2.0 / torch.pi)) * (x + 0.044715 * torch.pow(x, 3))
            return 0.5 * x * (1 + torch.tanh(inner))

    def norm(d: int) -> nn.Module:
        return nn.LayerNorm(d) if step >= 6 else LayerNorm(d)

    class FeedForward(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            d = cfg["emb_dim"]
            act = nn.GELU(approximate="tanh") if step >= 6 else GELU()
            self.layers = nn.Sequential(nn.Linear(d, 4 * d), act, nn.Linear(4 * d, d))

        def forward(self, x: Any) -> Any:
            return self.layers(x)

    class TransformerBlock(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.att = PyTorchMultiHeadAttention() if step >= 7 else MultiHeadAttention()
            self.ff = FeedForward()
            self.norm1, self.norm2 = norm(cfg["emb_dim"]), norm(cfg["emb_dim"])
            self.drop_shortcut = nn.Dropout(cfg["drop_rate"])

        def forward(self, x: Any) -> Any:
            x = self.drop_shortcut(self.att(self.norm1(x))) + x
            return self.drop_shortcut(self.ff(self.norm2(x))) + x

    class GPTModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok_emb = nn.Embedding(cfg["vocab_size"], cfg["emb_dim"])
            self.pos_emb = nn.Embedding(cfg["context_length"], cfg["emb_dim"])
            self.drop_emb = nn.Dropout(cfg["drop_rate"])
            self.trf_blocks = nn.Sequential(*[TransformerBlock() for _ in range(cfg["n_layers"])])
            self.final_norm = norm(cfg["emb_dim"])
            self.out_head = nn.Linear(cfg["emb_dim"], cfg["vocab_size"], bias=False)

        def forward(self, idx: Any) -> Any:
            _, t = idx.shape
            x = self.tok_emb(idx) + self.pos_emb(torch.arange(t, device=idx.device))
            x = self.trf_blocks(self.drop_emb(x))
            return self.out_head(self.final_norm(x))

    return GPTModel()


def rasbt_gpt2_speed(settings: dict[str, Any]) -> Rebuilt:
    """GPT-2 124M trained on Middlemarch (rasbt/LLMs-from-scratch ch05/10): the README's
    baseline and its optimisation steps 1-7, each cumulative, before ``torch.compile``."""
    import torch
    import torch.nn.functional as F

    step_no = int(settings.get("step", 0))
    batch = int(settings.get("batch", 8))
    cfg = {
        "vocab_size": 50257,
        "context_length": 1024,
        "emb_dim": 768,
        "n_heads": 12,
        "n_layers": 12,
        "drop_rate": 0.1,
        "qkv_bias": False,
    }
    dtype = torch.bfloat16 if step_no >= 5 else torch.float32
    steps_done = [0]

    def build() -> tuple[Any, Any]:
        steps_done[0] = 0  # each batch size's trace starts a run
        model = _gpt2_from_scratch(cfg, step_no).to(dtype)
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=5e-4, weight_decay=0.1, fused=True if step_no >= 3 else None
        )
        return model, optimizer

    def make_batch(n: int) -> Any:
        ids = torch.randint(0, cfg["vocab_size"], (n, cfg["context_length"]))
        return ids, torch.randint(0, cfg["vocab_size"], (n, cfg["context_length"]))

    def loss_of(model: Any, data: Any) -> Any:
        inp, tgt = data
        logits = model(inp)
        return F.cross_entropy(logits.flatten(0, 1), tgt.flatten())

    def step(model: Any, optimizer: Any, data: Any) -> None:
        model.train()
        optimizer.zero_grad()
        loss = loss_of(model, data)
        loss.backward()
        optimizer.step()
        if steps_done[0] % 15 == 0:
            # evaluate_model at step 0 and every 15th: one train and one validation batch
            model.eval()
            with torch.no_grad():
                loss_of(model, data)
                loss_of(model, data)
            model.train()
        steps_done[0] += 1

    return Rebuilt(build, step, make_batch, batch)


# --- pytorch/pytorch#50990: one Conv2d(32, 32, 3) on 512 Atari-size frames on a V100 --------


def pytorch_50990_conv(settings: dict[str, Any]) -> Rebuilt:
    """``nn.Conv2d(32, 32, 3)`` on a ``512x32x84x84`` input, float32 or ``.half()``,
    forward only (the issue's script, torch 1.7.1)."""
    import torch
    from torch import nn

    half = bool(settings.get("half", False))
    batch = int(settings.get("batch", 512))

    def build() -> tuple[Any, Any]:
        model = nn.Conv2d(32, 32, 3, stride=1)
        if half:
            model = model.half()
        return model, None

    def make_batch(n: int) -> Any:
        x = torch.randn(n, 32, 84, 84)
        return x.half() if half else x

    def step(model: Any, _opt: Any, x: Any) -> None:
        model(x)

    return Rebuilt(build, step, make_batch, batch)


# --- linkedin/Liger-Kernel's kernel benchmarks: the plain PyTorch side ("huggingface") --------


def liger_benchmark(settings: dict[str, Any]) -> Rebuilt:
    """One memory benchmark of Liger-Kernel's ``benchmark/scripts/benchmark_<kernel>.py``, its
    plain PyTorch provider: the module and input made on the GPU, then ``full()`` (forward,
    ``y.backward(dy, retain_graph=True)``) run ten times, each after
    ``reset_peak_memory_stats()``; the figure is the median ``max_memory_allocated()``: a
    steady call (the input's and parameters' gradients from the call before kept).

    ``kernel``: ``swiglu`` / ``geglu`` (transformers' ``LlamaMLP``: gate, up and down
    projections without bias, ``act(gate(x)) * up(x)``; ``dy = randn_like(y)`` made in each
    call), ``rms_norm`` (the script's own ``LlamaRMSNorm``: float32 weight, the input upcast),
    ``layer_norm`` / ``group_norm`` (``torch.nn.LayerNorm`` / ``GroupNorm``; ``dy`` made
    once), ``cross_entropy`` (``nn.CrossEntropyLoss()`` on float32 logits, ``loss.backward()``),
    ``kl_div`` (``nn.KLDivLoss(reduction="batchmean")`` on ``randn(...).log_softmax(-1)`` of a
    leaf against a softmax target, ``backward(retain_graph=True)``), ``tvd`` (the script's
    ``TorchTVDLoss("batchmean")``, ``abs(p - q) / 2`` summed over the batch, on the softmax of
    a leaf against a softmax target, ``backward(retain_graph=True)``), ``jsd`` (the script's
    ``TorchJSD``: two ``KLDivLoss("batchmean", log_target=True)`` against the log of the
    mixture, on log-softmax inputs), ``megatron_rms_norm``
    (``torch.nn.RMSNorm`` in bfloat16 on ``[S, B, H]``, ``y.sum().backward()``),
    ``sparsemax`` (the script's ``torch_sparsemax`` on ``[B * T, V]``: ``torch.sort``,
    ``torch.cumsum``, the support and threshold; ``dy`` made once). The norm
    scripts also make Liger's module, whose float32 weights (and biases) stay on the GPU:
    counted.
    """
    import torch
    import torch.nn.functional as F
    from torch import nn

    kernel = str(settings["kernel"])
    dtype = getattr(torch, str(settings.get("dtype", "float32")))

    class LlamaMLP(nn.Module):  # transformers 4.44 modeling_llama.LlamaMLP (pretraining_tp 1)
        def __init__(self, hidden: int, inter: int, act: str) -> None:
            super().__init__()
            self.gate_proj = nn.Linear(hidden, inter, bias=False)
            self.up_proj = nn.Linear(hidden, inter, bias=False)
            self.down_proj = nn.Linear(inter, hidden, bias=False)
            self.act = act

        def forward(self, x: Any) -> Any:
            gate = self.gate_proj(x)
            gate = F.silu(gate) if self.act == "silu" else F.gelu(gate, approximate="tanh")
            return self.down_proj(gate * self.up_proj(x))

    class LlamaRMSNorm(nn.Module):  # the benchmark script's copy of transformers' module
        def __init__(self, hidden: int, eps: float) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(hidden))
            self.variance_epsilon = eps

        def forward(self, hidden_states: Any) -> Any:
            input_dtype = hidden_states.dtype
            hidden_states = hidden_states.to(torch.float32)
            variance = hidden_states.pow(2).mean(-1, keepdim=True)
            hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
            return self.weight * hidden_states.to(input_dtype)

    class Sparsemax(nn.Module):  # benchmark_sparsemax.py's torch_sparsemax (liger 0.5.8)
        def forward(self, x: Any) -> Any:
            dim = x.dim() - 1
            input_sorted, _ = torch.sort(x, dim=dim, descending=True)
            cumsum_input = torch.cumsum(input_sorted, dim=dim)
            size = x.size(dim)
            range_tensor = torch.arange(1, size + 1, device=x.device, dtype=x.dtype)
            shape = [1] * x.dim()
            shape[dim] = size
            range_tensor = range_tensor.view(shape)
            k_bound = 1 + range_tensor * input_sorted
            support = k_bound > cumsum_input
            k = support.sum(dim=dim, keepdim=True).clamp(min=1)
            support_sum = (input_sorted * support).sum(dim=dim, keepdim=True)
            tau = (support_sum - 1) / k
            return torch.clamp(x - tau, min=0)

    class Bench(nn.Module):
        """The provider's module, Liger's weights and the benchmark's tensors."""

        def __init__(self) -> None:
            super().__init__()
            eps = float(settings.get("eps", 1e-6))
            self.dy: Any = None
            liger_params = 0
            if kernel in ("swiglu", "geglu"):
                self.layer: nn.Module = LlamaMLP(
                    int(settings["hidden_size"]),
                    int(settings["intermediate_size"]),
                    "silu" if kernel == "swiglu" else "gelu_tanh",
                )
                self.layer = self.layer.to(dtype)
                shape: tuple[int, ...] = (
                    int(settings["B"]),
                    int(settings["T"]),
                    int(settings["hidden_size"]),
                )
            elif kernel == "rms_norm":
                n = int(settings["N"])
                liger_params = n
                self.layer = LlamaRMSNorm(n, eps)
                shape = (int(settings["M"]), n)
            elif kernel == "layer_norm":
                n = int(settings["N"])
                liger_params = 2 * n
                self.layer = nn.LayerNorm(n, eps=eps)
                shape = (int(settings["M"]), n)
            elif kernel in ("cross_entropy", "kl_div", "tvd", "jsd"):
                rows, vocab = int(settings["B"]) * int(settings["T"]), int(settings["V"])
                self.layer = nn.Identity()
                shape = (rows, vocab)
            elif kernel == "megatron_rms_norm":
                n = int(settings["N"])
                self.layer = nn.RMSNorm(n, eps=eps).to(dtype)
                shape = (int(settings["S"]), int(settings["B"]), n)
            elif kernel == "sparsemax":
                self.layer = Sparsemax()
                shape = (int(settings["B"]) * int(settings["T"]), int(settings["V"]))
            elif kernel == "group_norm":
                c = int(settings["C"])
                liger_params = 2 * c
                groups = c // int(settings["channels_per_group"])
                self.layer = nn.GroupNorm(groups, c, eps=eps)
                shape = (int(settings["M"]), c, int(settings["H"]))
            else:
                raise ValueError(f"unknown Liger benchmark kernel {kernel!r}")
            # Liger's module, made first in the script (its float32 weights stay on the GPU)
            self.liger = torch.empty(liger_params) if liger_params else None
            self.x = torch.randn(shape, dtype=dtype)
            self.target: Any = None
            if kernel == "cross_entropy":
                self.x.requires_grad_(True)
                self.target = torch.randint(shape[1], (shape[0], 1)).squeeze(1)
                return
            if kernel == "kl_div":  # the log-probabilities of a leaf, a softmax target
                self.x = self.x.requires_grad_(True).log_softmax(dim=-1)
                self.target = torch.randn(shape).softmax(dim=-1)
                return
            if kernel == "tvd":  # the probabilities of a leaf, a softmax target
                self.x = self.x.requires_grad_(True).softmax(dim=-1)
                self.target = torch.randn(shape).softmax(dim=-1)
                return
            if kernel == "jsd":  # the log-probabilities of a leaf and of a target
                self.x = self.x.requires_grad_(True).log_softmax(dim=-1)
                self.target = torch.randn(shape).log_softmax(dim=-1)
                return
            if kernel not in ("swiglu", "geglu", "megatron_rms_norm"):
                self.dy = torch.randn_like(self.x)
            self.x.requires_grad_(True)

    def tvd_loss(p: Any, q: Any) -> Any:  # TorchTVDLoss.forward: tvd is freed on return
        tvd = torch.abs(p - q) / 2.0
        return torch.sum(tvd) / p.size(0)

    def jsd_loss(log_p: Any, log_q: Any) -> Any:  # benchmark_jsd.py's TorchJSD.forward
        m = 0.5 * (torch.exp(log_p) + torch.exp(log_q))
        log_m = torch.log(m)
        kl = partial(F.kl_div, reduction="batchmean", log_target=True)
        return 0.5 * (kl(log_m, log_p) + kl(log_m, log_q))

    def build() -> tuple[Any, Any]:
        return Bench(), None

    def make_batch(_n: int) -> Any:
        return None

    def step(bench: Any, _opt: Any, _batch: Any) -> None:
        if kernel == "cross_entropy":  # torch.nn.CrossEntropyLoss(); loss.backward()
            F.cross_entropy(bench.x, bench.target).backward()
            return
        if kernel == "kl_div":  # nn.KLDivLoss(reduction="batchmean"); retain_graph=True
            F.kl_div(bench.x, bench.target, reduction="batchmean").backward(retain_graph=True)
            return
        if kernel == "jsd":  # TorchJSD(); y.backward(retain_graph=True)
            jsd_loss(bench.x, bench.target).backward(retain_graph=True)
            return
        if kernel == "tvd":  # TorchTVDLoss("batchmean"); y.backward(retain_graph=True)
            tvd_loss(bench.x, bench.target).backward(retain_graph=True)
            return
        if kernel == "megatron_rms_norm":  # y = layer(x); y.sum().backward() (y held)
            y = bench.layer(bench.x)
            y.sum().backward()
            return
        y = bench.layer(bench.x)
        dy = bench.dy if bench.dy is not None else torch.randn_like(y)
        y.backward(dy, retain_graph=True)

    return Rebuilt(build, step, make_batch, 1)


WORKLOADS: dict[str, Callable[[dict[str, Any]], Rebuilt]] = {
    "rasbt_gpt2_speed": rasbt_gpt2_speed,
    "pytorch_50990_conv": pytorch_50990_conv,
    "liger_benchmark": liger_benchmark,
}
