"""Where does CUDA run a different kernel than the CPU? A scan of ordinary models.

Runs a set of ordinary training steps (a GPT-style block with dropout and
``scaled_dot_product_attention``, BERT's eager attention, torchvision's ViT attention through
``nn.MultiheadAttention``, a Nature-CNN in float16, an LSTM policy, a batch-norm ResNet block)
under :func:`memfit.estimate_torch` for a CUDA target and lists, from the installed torch:

* every composite operator the trace met whose decomposition differs between fake CUDA and
  fake CPU tensors (:func:`memfit.estimate.torch._cuda_probe.read_rule`): ``direct`` (CUDA runs one
  operator, which the trace then runs), ``differs`` (reported, traced the CPU's way),
  ``unread``;
* every leaf operator whose outputs, run on fake CUDA tensors without gradient, take other
  storage than on the CPU (the fake kernels of the two devices disagree);
* the kernels the trace chose (``est.kernels``).

    python bench/cuda_kernel_scan.py            # writes bench/out/cuda_kernel_scan.{json,md}

It needs no GPU: everything is read from the installed torch's dispatcher and fake kernels.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common


def _models() -> dict[str, tuple[Callable[[], Any], Callable[[int], Any], Any]]:
    import torch
    from torch import nn

    class GptBlock(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln = nn.LayerNorm(256)
            self.qkv = nn.Linear(256, 768)
            self.proj = nn.Linear(256, 256)
            self.mlp = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256))
            self.drop = nn.Dropout(0.1)

        def forward(self, x: Any) -> Any:
            b, s, d = x.shape
            q, k, v = self.qkv(self.ln(x)).view(b, s, 3, 4, 64).permute(2, 0, 3, 1, 4)
            y = nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=True)
            x = x + self.drop(self.proj(y.transpose(1, 2).reshape(b, s, d)))
            return x + self.drop(self.mlp(self.ln(x)))

    class EagerAttention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(256, 768)
            self.drop = nn.Dropout(0.1)

        def forward(self, x: Any) -> Any:
            b, s, d = x.shape
            q, k, v = self.qkv(x).view(b, s, 3, 4, 64).permute(2, 0, 3, 1, 4)
            att = self.drop(torch.softmax(q @ k.transpose(-1, -2) / 8.0, dim=-1))
            return (att @ v).transpose(1, 2).reshape(b, s, d)

    class VitAttention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mha = nn.MultiheadAttention(256, 4, batch_first=True)

        def forward(self, x: Any) -> Any:
            return self.mha(x, x, x, need_weights=False)[0]

    class LstmPolicy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = nn.LSTM(64, 128, batch_first=True)
            self.head = nn.Linear(128, 6)

        def forward(self, x: Any) -> Any:
            return self.head(self.lstm(x)[0])

    def resblock() -> Any:
        return nn.Sequential(
            nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2)
        )

    def nature_cnn() -> Any:
        return nn.Sequential(
            nn.Conv2d(4, 32, 8, 4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, 2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, 1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(3136, 512),
            nn.ReLU(),
            nn.Linear(512, 6),
        ).half()

    return {
        "gpt_block_sdpa_dropout": (GptBlock, lambda n: torch.randn(n, 128, 256), torch.float16),
        "bert_eager_attention": (EagerAttention, lambda n: torch.randn(n, 128, 256), None),
        "vit_multihead_attention": (VitAttention, lambda n: torch.randn(n, 197, 256), None),
        "nature_cnn_fp16": (
            nature_cnn,
            lambda n: torch.randn(n, 4, 84, 84, dtype=torch.float16),
            None,
        ),
        "lstm_policy": (LstmPolicy, lambda n: torch.randn(n, 32, 64), None),
        "batchnorm_resblock": (resblock, lambda n: torch.randn(n, 64, 64, 64), None),
    }


def _leaf_differences(ops: dict[str, tuple[Any, tuple[Any, ...], dict[str, Any]]]) -> list[str]:
    """Leaf ops whose outputs take other storage on fake CUDA tensors than on fake CPU."""
    import torch
    from torch.utils._pytree import tree_flatten, tree_unflatten

    from memfit.estimate.torch._cuda_probe import probing

    out: list[str] = []
    for name, (func, args, kwargs) in sorted(ops.items()):
        leaves, spec = tree_flatten((args, kwargs))
        sizes = []
        try:
            for device in ("cpu", "cuda"):
                with probing() as mode:
                    shadows = []
                    for v in leaves:
                        if isinstance(v, torch.Tensor):
                            with mode:
                                v = torch.empty_strided(
                                    tuple(v.shape), tuple(v.stride()), dtype=v.dtype, device=device
                                )
                        shadows.append(v)
                    a, k = tree_unflatten(shadows, spec)
                    with mode:
                        res = func(*a, **k)
                    sizes.append(
                        sorted(
                            int(t.untyped_storage().nbytes())
                            for t in tree_flatten(res)[0]
                            if isinstance(t, torch.Tensor)
                        )
                    )
        except Exception as exc:  # an op one device's fake kernel refuses: reported as such
            out.append(f"{name}: not comparable ({type(exc).__name__})")
            continue
        if sizes[0] != sizes[1]:
            out.append(f"{name}: CPU {sizes[0]} B vs CUDA {sizes[1]} B")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", default="A100-SXM4-80GB")
    args = parser.parse_args(argv)
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    import memfit
    from memfit.estimate.torch import _cuda_probe

    class Leaves(TorchDispatchMode):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.ops: dict[str, tuple[Any, tuple[Any, ...], dict[str, Any]]] = {}

        def __torch_dispatch__(self, func: Any, types: Any, a: Any = (), k: Any = None) -> Any:
            out = func(*a, **(k or {}))
            if func.namespace == "aten":
                self.ops.setdefault(str(func), (func, tuple(a), dict(k or {})))
            return out

    results: dict[str, Any] = {}
    lines: list[str] = []
    for name, (make, batch, autocast_dtype) in _models().items():
        _cuda_probe._RULES.clear()

        def build(make: Any = make) -> tuple[Any, Any]:
            model = make()
            return model, torch.optim.AdamW(model.parameters())

        def step(model: Any, opt: Any, x: Any, dtype: Any = autocast_dtype) -> None:
            ctx = (
                torch.autocast("cuda", dtype=dtype)
                if dtype
                else torch.autocast("cuda", enabled=False)
            )
            with ctx:
                loss = model(x).float().pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        started = time.perf_counter()
        est = memfit.estimate_torch(build, step, batch, [8], gpu=args.gpu, kernel_scratch=False)
        rules = {
            key[0]: rule.kind for key, rule in _cuda_probe._RULES.items() if rule.kind != "same"
        }
        leaves = Leaves()
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode(), leaves:
            model, opt = build()
            step(model, opt, batch(8))
        diffs = _leaf_differences(leaves.ops)
        kernels = {op: [u.to_dict() for u in uses] for op, uses in est.kernels.items()}
        results[name] = {"composite_rules": rules, "leaf_differences": diffs, "kernels": kernels}
        chosen = [
            f"{op} -> " + ", ".join(u["kernel"] for u in uses) for op, uses in kernels.items()
        ]
        lines.append(
            f"| {name} | {', '.join(f'{k} ({v})' for k, v in sorted(rules.items())) or '-'} | "
            f"{'; '.join(diffs) or '-'} | {'; '.join(chosen) or '-'} |"
        )
        print(lines[-1], f"({time.perf_counter() - started:.1f} s)", flush=True)
    header = (
        f"CUDA kernel scan, {_common.utc_minute()}, torch {torch.__version__}, target "
        f"{args.gpu} (`python bench/cuda_kernel_scan.py`)\n\n"
        "| model | composites CUDA runs otherwise | leaf ops whose CUDA outputs differ | "
        "kernels traced |\n|---|---|---|---|\n"
    )
    _common.write_results("cuda_kernel_scan", results, header + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
