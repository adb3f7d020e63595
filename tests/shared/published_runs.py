"""Published real-GPU measurements of PyTorch runs (``tests/data/published_truth/*.yaml``),
rebuilt from their text and traced by memfit: the runs, the workloads that rebuild them and the
comparison. ``bench/published_truth.py`` runs every one and writes the table;
``tests/estimate/torch/test_published_truth*.py`` run the same comparison in CI.

No weights are loaded: memory does not depend on their values, and the models are built from
their configurations (``from_pretrained`` only adds the download).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import published_kernel_workloads as published_kernels
import yaml

DATA = Path(__file__).resolve().parents[2] / "tests" / "data" / "published_truth"


@dataclass(frozen=True)
class Run:
    """One published run: where it comes from, how it was set up, what was measured."""

    series: str
    name: str
    workload: str
    settings: dict[str, Any]
    measured: float
    unit_bytes: int
    rounding: str
    quantity: str
    gpu: str | None
    runtime: dict[str, str]
    source: str
    # "validation": no rule of memfit was derived from the figure (issue 42); "calibration":
    # the runs the rules were studied on (every series without a ``part:``)
    part: str = "calibration"

    @property
    def measured_bytes(self) -> float:
        """The measured figure in bytes, at the middle of the interval its rounding leaves."""
        if self.rounding == "floor":
            return (self.measured + 0.5) * self.unit_bytes
        return self.measured * self.unit_bytes

    @property
    def tolerance_bytes(self) -> float:
        """Half the width of that interval (the figure's own precision): ``floor`` to whole
        units, ``nearest_<step>`` (``nearest_0.01``) or ``exact``."""
        if self.rounding == "floor":
            return 0.5 * self.unit_bytes
        if self.rounding == "exact":
            return 0.0
        step = float(self.rounding.removeprefix("nearest_"))
        return step / 2 * self.unit_bytes


def load_runs(root: Path = DATA) -> list[Run]:
    """Every run of every source file, in file order."""
    runs: list[Run] = []
    for path in sorted(root.glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        if data.get("framework", "torch") != "torch":
            continue  # JAX sources: bench/published_truth_jax.py
        for item in data["runs"]:
            runs.append(
                Run(
                    series=path.stem,
                    name=item["name"],
                    workload=data["workload"],
                    settings=dict(item.get("settings") or {}),
                    measured=float(item["measured"]),
                    unit_bytes=int(data["unit_bytes"]),
                    rounding=data["rounding"],
                    quantity=data["quantity"],
                    gpu=data.get("gpu"),
                    runtime=dict(data.get("runtime") or {}),
                    source=data["source"]["url"],
                    part=str(data.get("part", "calibration")),
                )
            )
    return runs


# --- The workloads, as the sources ran them ----------------------------------------------------


@dataclass
class Workload:
    """``build``, ``step`` and ``make_batch`` for :func:`memfit.estimate_torch`."""

    build: Callable[[], tuple[Any, Any]]
    step: Callable[[Any, Any, Any], None]
    make_batch: Callable[[int], Any]
    batch: int
    extras: dict[str, Any] = field(default_factory=dict)


def _autocast(dtype: Any | None) -> AbstractContextManager[Any]:
    import torch

    if dtype is None:
        return nullcontext()
    return torch.autocast("cuda", dtype=dtype)


class HfAdamW:
    """transformers' own AdamW of early 2022 (``optim="adamw_hf"``, the Trainer's default
    then; transformers 4.15 ``optimization.py``): a per-parameter loop whose only temporary
    is ``denom``, one parameter's size."""

    def __new__(cls, params: Any, lr: float = 5e-5) -> Any:
        import torch

        class _AdamW(torch.optim.Optimizer):
            def __init__(self, params: Any) -> None:
                defaults = {
                    "lr": lr,
                    "betas": (0.9, 0.999),
                    "eps": 1e-8,
                    "weight_decay": 0.0,
                    "correct_bias": True,
                }
                super().__init__(params, defaults)

            @torch.no_grad()
            def step(self, closure: Any = None) -> None:
                for group in self.param_groups:
                    for p in group["params"]:
                        if p.grad is None:
                            continue
                        grad = p.grad.data
                        state = self.state[p]
                        if len(state) == 0:
                            state["step"] = 0
                            state["exp_avg"] = torch.zeros_like(p.data)
                            state["exp_avg_sq"] = torch.zeros_like(p.data)
                        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                        beta1, beta2 = group["betas"]
                        state["step"] += 1
                        exp_avg.mul_(beta1).add_(grad, alpha=1.0 - beta1)
                        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
                        denom = exp_avg_sq.sqrt().add_(group["eps"])
                        step_size = group["lr"]
                        if group["correct_bias"]:
                            bias_correction1 = 1.0 - beta1 ** state["step"]
                            bias_correction2 = 1.0 - beta2 ** state["step"]
                            step_size = step_size * math.sqrt(bias_correction2) / bias_correction1
                        p.data.addcdiv_(exp_avg, denom, value=-step_size)

        return _AdamW(params)


def hf_bert_large_trainer(settings: dict[str, Any]) -> Workload:
    """bert-large-uncased for sequence classification under the Trainer of early 2022."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification
    from transformers.optimization import Adafactor

    batch = int(settings.get("batch", 4))
    accum = int(settings.get("grad_accum", 1))
    fp16 = bool(settings.get("fp16", False))
    optimizer_name = settings.get("optimizer", "adamw_hf")
    build_only = bool(settings.get("build_only", False))

    def build() -> tuple[Any, Any]:
        config = BertConfig(
            vocab_size=30522,
            hidden_size=1024,
            num_hidden_layers=24,
            num_attention_heads=16,
            intermediate_size=4096,
            max_position_embeddings=512,
            num_labels=2,
            attn_implementation="eager",
        )
        model = BertForSequenceClassification(config)
        if build_only:
            return model, None
        if settings.get("checkpointing"):
            model.gradient_checkpointing_enable()
        model.train()
        if optimizer_name == "adafactor":
            optimizer = Adafactor(
                model.parameters(), lr=5e-5, scale_parameter=False, relative_step=False
            )
        else:
            optimizer = HfAdamW(model.parameters())
        return model, optimizer

    def make_batch(n: int) -> Any:
        if build_only:
            return None
        # The Trainer passes no attention mask; BertModel of transformers 4.15 then made one of
        # ones and added its extended form, (1 - mask) * -10000 in the parameters' dtype
        # (float32), to every layer's scores (get_extended_attention_mask). Today's BERT skips
        # an all-ones mask; passing the extended mask as a 4-D mask restores the addition,
        # which under fp16 autocast makes the scores float32 before softmax.
        return {
            "input_ids": torch.randint(100, 30000, (n, 512)),
            "attention_mask": torch.zeros(n, 1, 1, 512),
            "labels": torch.zeros(n, dtype=torch.long),
        }

    def step(model: Any, optimizer: Any, batch: Any) -> None:
        if build_only:
            return
        for _ in range(accum):
            with _autocast(torch.float16 if fp16 else None):
                loss = model(**batch).loss
            if accum > 1:
                loss = loss / accum
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        model.zero_grad(set_to_none=False)  # torch < 2.0: gradients zeroed, kept

    return Workload(build, step, make_batch, batch)


class _VitEncoderBlock:
    """torchvision's ``EncoderBlock`` (LayerNorm, MultiheadAttention, MLP with GELU)."""


def _torchvision_vit(num_classes: int) -> Any:
    """torchvision's ``vit_l_16`` rebuilt layer for layer (torchvision has no CPU wheel here):
    patch 16, hidden 1024, 24 layers, 16 heads, MLP 4096, LayerNorm eps 1e-6, the class token
    and learned position embedding; the head replaced by ``Linear(1024, num_classes)``."""
    import torch
    from torch import nn

    hidden, heads, mlp, layers, patch, image = 1024, 16, 4096, 24, 16, 224

    class EncoderBlock(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln_1 = nn.LayerNorm(hidden, eps=1e-6)
            self.self_attention = nn.MultiheadAttention(hidden, heads, batch_first=True)
            self.ln_2 = nn.LayerNorm(hidden, eps=1e-6)
            self.mlp = nn.Sequential(
                nn.Linear(hidden, mlp), nn.GELU(), nn.Dropout(0.0), nn.Linear(mlp, hidden)
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.ln_1(x)
            y, _ = self.self_attention(y, y, y, need_weights=False)
            x = y + x
            return x + self.mlp(self.ln_2(x))

    class VisionTransformer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            seq = (image // patch) ** 2 + 1
            self.conv_proj = nn.Conv2d(3, hidden, kernel_size=patch, stride=patch)
            self.class_token = nn.Parameter(torch.zeros(1, 1, hidden))
            self.pos_embedding = nn.Parameter(torch.empty(1, seq, hidden).normal_(std=0.02))
            self.layers = nn.Sequential(*(EncoderBlock() for _ in range(layers)))
            self.ln = nn.LayerNorm(hidden, eps=1e-6)
            self.heads = nn.Sequential(nn.Linear(hidden, num_classes))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            n = x.shape[0]
            x = self.conv_proj(x).reshape(n, hidden, -1).permute(0, 2, 1)
            x = torch.cat([self.class_token.expand(n, -1, -1), x], dim=1)
            x = self.ln(self.layers(x + self.pos_embedding))
            return self.heads(x[:, 0])

    return VisionTransformer()


def torchvision_vit_l16_cifar(settings: dict[str, Any]) -> Workload:
    """ViT-L/16 fine-tuned on CIFAR-10 at 224x224 (rasbt/pytorch-memory-optim): plain
    PyTorch or Lightning Fabric ("16-mixed", "bf16-true"), Adam or SGD, micro-batches."""
    import torch
    import torch.nn.functional as F

    batch = int(settings.get("batch", 64))
    accum = int(settings.get("grad_accum", 1))
    precision = settings.get("precision", "32-true")
    build_only = bool(settings.get("build_only", False))
    dtype = torch.bfloat16 if precision == "bf16-true" else torch.float32

    def build() -> tuple[Any, Any]:
        model = _torchvision_vit(10)
        if build_only:
            if settings.get("cast") == "float16":
                model = model.to(torch.float16)
            return model, None
        model = model.to(dtype)
        if settings.get("optimizer") == "sgd":
            optimizer: Any = torch.optim.SGD(model.parameters(), lr=0.01)
        else:
            optimizer = torch.optim.Adam(
                model.parameters(),
                lr=5e-5,
            )
        return model, optimizer

    def make_batch(n: int) -> Any:
        if build_only:
            return None
        # The loader's float32 images on the device; Fabric's "bf16-true" converts them in
        # its module's forward (convert_input), the float32 batch held by the loop
        return torch.randn(n, 3, 224, 224), torch.randint(0, 10, (n,))

    def step(model: Any, optimizer: Any, data: Any) -> None:
        if build_only:
            return
        features, targets = data
        features = features.to(dtype)
        model.train()
        mixed = torch.float16 if precision == "16-mixed" else None
        if accum == 1:
            with _autocast(mixed):
                loss = F.cross_entropy(model(features), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        else:
            for _ in range(accum):
                with _autocast(mixed):
                    loss = F.cross_entropy(model(features), targets) / accum
                loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        model.eval()  # the validation pass (inside the measured peak)
        with torch.no_grad(), _autocast(mixed):
            model(features)

    return Workload(build, step, make_batch, batch)


class _GradScaler23:
    """The device work of torch 2.3's ``torch.cuda.amp.GradScaler`` (``torch/amp/
    grad_scaler.py``): the scale and growth tracker made on the first ``scale``, the loss
    times the scale, ``unscale_``'s float32 reciprocal and ``found_inf`` with the in-place
    ``_amp_foreach_non_finite_check_and_unscale_`` over the gradients, and the in-place
    ``_amp_update_scale_``. (A CPU build of torch disables its own GradScaler for
    ``"cuda"``; the trace needs the ops.) ``step`` skips ``found_inf.item()``, which reads
    no memory, and steps."""

    def __init__(self) -> None:
        self.scale_t: Any = None
        self.tracker: Any = None
        self.found_inf: Any = None

    def scale(self, loss: Any) -> Any:
        import torch

        if self.scale_t is None:
            self.scale_t = torch.full((), 2.0**16, dtype=torch.float32)
            self.tracker = torch.full((), 0, dtype=torch.int32)
        return loss * self.scale_t

    def step(self, optimizer: Any) -> None:
        import torch

        inv_scale = self.scale_t.double().reciprocal().float()
        found_inf = torch.full((), 0.0, dtype=torch.float32)
        grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        with torch.no_grad():
            torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)
        self.found_inf = found_inf  # held in the optimizer's state until update()
        optimizer.step()

    def update(self) -> None:
        import torch

        torch._amp_update_scale_(self.scale_t, self.tracker, self.found_inf, 2.0, 0.5, 2000)
        self.found_inf = None


def _leftover_loss(loss_fn: Any, output: Any, target: Any, autocast: Any) -> Any:
    """The loss a notebook cell's last iteration left in ``loss``, rebuilt without its graph
    (the graph's parameters are held apart, see :func:`efficient_dl_amp_mlp`)."""
    import torch

    with torch.no_grad(), _autocast(autocast):
        return loss_fn(output, target)


def efficient_dl_amp_mlp(settings: dict[str, Any]) -> Workload:
    """mryab/efficient-dl-systems, week 2 seminar (``practice.ipynb``, torch 2.3.0): the AMP
    section's MLP (``Linear(d, d)``, ReLU, ``Linear(d, d)``, ReLU, ``Linear(d, d)``), batch
    512, MSE against a random target, SGD (foreach, no momentum), ``zero_grad()`` to None,
    run in full precision, ``.half()``, under fp16 autocast and with autocast and a
    GradScaler; then the tensor-core cell (d 8192 and 8191, autocast and GradScaler).

    The notebook's cells run in one process, so what earlier cells left on the device is
    live when ``reset_peak_memory_stats()`` starts each figure: the last MNIST model with
    its Adam state, the 50 + 50 input and target batches, the previous cell's ``output``
    and ``loss``, and in the tensor-core cell everything built before the timer (the
    d 6144 net of the cell before, both nets and all four data lists, the warm-up's last
    forward with its graph). Each traced step is one loop iteration."""
    import torch
    from torch import nn

    mode = str(settings["mode"])
    dim = int(settings.get("dim", 6144))
    batch = 512

    def mlp(d: int) -> nn.Module:  # the seminar's create_model(d, d, 3)
        return nn.Sequential(
            nn.Linear(d, d), nn.ReLU(), nn.Linear(d, d), nn.ReLU(), nn.Linear(d, d)
        )

    def mnist_model() -> nn.Module:  # week02 seminar/train.py's create_model()
        return nn.Sequential(
            nn.Conv2d(1, 20, 5),
            nn.ReLU(),
            nn.MaxPool2d(4),
            nn.Conv2d(20, 10, 3),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(40, 128),
            nn.ReLU(),
            nn.Linear(128, 1024),
            nn.ReLU(),
            nn.Linear(1024, 10),
        )

    tensor_core = mode in ("amp_8192", "amp_8191")

    def build() -> tuple[Any, Any]:
        held = nn.Module()
        # the MNIST cells' last model (bf16 autocast, Adam: exp_avg and exp_avg_sq on the
        # device, the step count on the CPU)
        held.mnist = mnist_model()
        held.mnist_adam = [
            (torch.zeros_like(p), torch.zeros_like(p)) for p in held.mnist.parameters()
        ]
        # those cells trained it (forward on this thread, backward on the autograd engine's
        # device thread): both threads' cuBLAS handles and workspaces exist before the cells
        # below, as they do in the notebook's process
        held.mnist(torch.randn(8, 1, 28, 28)).sum().backward()
        for p in held.mnist.parameters():
            p.grad = None  # optimizer.zero_grad()
        if not tensor_core:
            # the cell before's net: its last ``output`` and ``loss`` still hold their graph,
            # whose AccumulateGrad nodes hold that net's parameters (freed when both names
            # are rebound in this cell's first iteration)
            if mode in ("half", "amp_scaler"):
                held.old_net = mlp(dim)
            elif mode == "amp":
                held.old_net = mlp(dim).half()
            held.net = mlp(dim).half() if mode == "half" else mlp(dim)
            return held, torch.optim.SGD(held.net.parameters(), lr=0.001)
        held.net_6144 = mlp(6144)  # the AMP-with-scaling cell's net, its gradients None
        held.scaler_6144 = _GradScaler23()
        held.scaler_6144.scale(torch.zeros(()))
        held.net = mlp(8192)
        held.net_8191 = mlp(8191)
        if mode == "amp_8191":
            held.net, held.net_8191 = held.net_8191, held.net
        return held, torch.optim.SGD(held.net.parameters(), lr=0.001)

    def make_batch(_n: int) -> Any:
        dims = (8192, 8191) if tensor_core else (dim,)
        sets = []
        if tensor_core:
            sets.append([torch.randn(batch, 6144) for _ in range(100)])
        for d in dims:
            sets.append([torch.randn(batch, d) for _ in range(100)])  # 50 inputs, 50 targets
        if tensor_core and mode == "amp_8191":
            sets[1], sets[2] = sets[2], sets[1]
        return {"sets": sets, "carry": {}, "i": [0]}

    loss_fn = nn.MSELoss()

    def step(held: Any, opt: Any, data: Any) -> None:
        net = held.net
        pairs = data["sets"][1 if tensor_core else 0]
        carry = data["carry"]
        i = data["i"][0]
        data["i"][0] += 1
        if i == 0:
            # what the cell before left: its last ``output``, and its last ``loss`` as
            # ``MSELoss`` returned it (a reduced loss keeps the unreduced buffer's storage:
            # Loss.cpp's TORCH_META_FUNC(mse_loss) sizes the output to the broadcast inputs,
            # then resize_({}))
            half = torch.float16
            if mode == "half":  # after the full-precision cell
                carry["output"] = torch.empty(batch, 6144)
                carry["loss"] = _leftover_loss(loss_fn, carry["output"], pairs[99], None)
            elif mode == "amp":  # after the half-precision cell
                carry["output"] = torch.empty(batch, 6144, dtype=half)
                carry["loss"] = _leftover_loss(loss_fn, carry["output"], pairs[99].half(), None)
            elif mode == "amp_scaler":  # after the autocast cell
                carry["output"] = torch.empty(batch, 6144, dtype=half)
                carry["loss"] = _leftover_loss(loss_fn, carry["output"], pairs[99], half)
            elif mode == "amp_8192":  # after the autocast + GradScaler cell (d 6144)
                last = torch.empty(batch, 6144, dtype=half)
                carry["loss"] = _leftover_loss(loss_fn, last, data["sets"][0][99], half)
                del last
                with torch.autocast("cuda", dtype=half):  # the warm-up's last forward
                    carry["output"] = net(pairs[49])
            elif mode == "amp_8191":  # after the d 8192 loop
                carry["output"] = torch.empty(batch, 8192, dtype=half)
                carry["loss"] = _leftover_loss(loss_fn, carry["output"], data["sets"][2][99], half)
                held.scaler_8192 = _GradScaler23()
                held.scaler_8192.scale(torch.zeros(()))
            if mode in ("amp_scaler", "amp_8192", "amp_8191"):
                carry["scaler"] = _GradScaler23()
        x, target = pairs[i % 50], pairs[50 + i % 50]
        if mode == "half":
            carry["output"] = net(x.half())
            carry["loss"] = loss_fn(carry["output"], target.half())
        else:
            with _autocast(None if mode == "full" else torch.float16):
                carry["output"] = net(x)
                carry["loss"] = loss_fn(carry["output"], target)
        if hasattr(held, "old_net"):
            del held.old_net  # the cell before's graph is gone with its output and loss
        if mode in ("full", "half"):
            carry["loss"].backward()
            opt.step()
        else:
            if mode == "amp":
                carry["loss"].backward()
                opt.step()
            else:
                scaler = carry["scaler"]
                scaler.scale(carry["loss"]).backward()
                scaler.step(opt)
                scaler.update()
        opt.zero_grad()

    return Workload(build, step, make_batch, batch)


def hexz_alphazero_forward(settings: dict[str, Any]) -> Workload:
    """dnswlt/hexz ``pyhexz/apm.py`` (2024-11-16): ``HexzNeuralNetwork(blocks=10,
    model_type="resnet")`` of ``pyhexz/model.py``, an AlphaZero-style policy/value network
    (the 11-channel 11 x 10 board; a Conv2d-BatchNorm2d-ReLU stem and nine residual blocks of
    128 filters, no conv biases; a policy head of a 1x1 conv to 2 channels, BatchNorm, ReLU
    and ``Linear(220, 220)``, the invalid moves set to -1e3 as the docstring says the AMP run
    needs; a value head of a 1x1 conv to 1 channel, BatchNorm, ReLU, ``Linear(110, 110)``,
    ReLU, ``Linear(110, 1)`` and tanh). A batch of 512 random boards and masks; each traced
    step is one of the 100 forward passes, in training mode with autograd on and the outputs
    dropped, in float32 or under fp16 autocast (``amp``)."""
    import torch
    from torch import nn

    amp = bool(settings["amp"])
    filters, blocks, batch = 128, 10, 512

    def conv(c_in: int, c_out: int, k: int = 3) -> nn.Module:
        return nn.Conv2d(c_in, c_out, kernel_size=k, bias=False, padding="same")

    class ResidualBlock(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1, self.bn1 = conv(filters, filters), nn.BatchNorm2d(filters)
            self.relu = nn.ReLU()
            self.conv2, self.bn2 = conv(filters, filters), nn.BatchNorm2d(filters)

        def forward(self, x: Any) -> Any:
            residual = x
            x = self.relu(self.bn1(self.conv1(x)))
            x = self.bn2(self.conv2(x))
            x += residual
            return self.relu(x)

    class HexzNeuralNetwork(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            stem = nn.Sequential(conv(11, filters), nn.BatchNorm2d(filters), nn.ReLU())
            self._torso = nn.ModuleList([stem] + [ResidualBlock() for _ in range(blocks - 1)])
            self.policy_head = nn.Sequential(
                conv(filters, 2, 1), nn.BatchNorm2d(2), nn.ReLU(), nn.Flatten(),
                nn.Linear(2 * 11 * 10, 2 * 11 * 10),
            )  # fmt: skip
            self.value_head = nn.Sequential(
                conv(filters, 1, 1), nn.BatchNorm2d(1), nn.ReLU(), nn.Flatten(),
                nn.Linear(11 * 10, 11 * 10), nn.ReLU(), nn.Linear(11 * 10, 1),
            )  # fmt: skip

        def forward(self, b: Any, action_mask: Any) -> Any:
            x = b
            for block in self._torso:
                x = block(x)
            policy = self.policy_head(x)
            policy = policy.where(action_mask.flatten(1), torch.full_like(policy, -1e3))
            return policy, torch.tanh(self.value_head(x))

    def build() -> tuple[Any, Any]:
        return HexzNeuralNetwork(), None

    def make_batch(n: int) -> Any:
        return torch.rand((n, 11, 11, 10)), torch.rand((n, 2, 11, 10)) < 0.5

    def step(model: Any, _opt: Any, data: Any) -> None:
        with _autocast(torch.float16 if amp else None):
            model(*data)

    return Workload(build, step, make_batch, batch)


WORKLOADS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "hf_bert_large_trainer": hf_bert_large_trainer,
    "torchvision_vit_l16_cifar": torchvision_vit_l16_cifar,
    "efficient_dl_amp_mlp": efficient_dl_amp_mlp,
    "hexz_alphazero_forward": hexz_alphazero_forward,
    **published_kernels.WORKLOADS,
}


# --- Tracing and comparing ---------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """One run: what memfit predicts against what the source measured."""

    run: Run
    predicted_bytes: int
    error: float
    seconds: float
    deviations: list[str]

    def row(self) -> str:
        mib = 2**20
        return (
            f"| {self.run.series} | {self.run.name} | {self.run.quantity} | "
            f"{self.run.measured_bytes / mib:,.0f} | {self.predicted_bytes / mib:,.0f} | "
            f"{self.error:+.1%} |"
        )


@contextmanager
def cuda_figures_scratch() -> Iterator[None]:
    """Measure only the kernel scratch that counts in the CUDA figures this corpus compares:
    the device-generic losses' buffers (``mse_loss`` and the other reduced losses, counted
    in every figure, as a user's ``estimate_torch`` counts them by default). The CPU-only
    scratch (oneDNN convolutions, CPU flash attention) counts in a CPU trace's
    ``exact_peak`` alone; measuring it would run the convolutions for real, seconds a run,
    for no figure compared here."""
    from memfit.estimate.torch import _measured_scratch

    saved = dict(_measured_scratch.CPU_SCRATCH_OPS)
    _measured_scratch.CPU_SCRATCH_OPS.clear()
    try:
        yield
    finally:
        _measured_scratch.CPU_SCRATCH_OPS.update(saved)


def trace(run: Run) -> Any:
    """Rebuild ``run``'s workload and trace it for the source's GPU and runtime, counting the
    scratch the CUDA figures count (:func:`cuda_figures_scratch`): the one trace of a
    published run that :func:`predict`, ``bench/bands.py`` and ``bench/trace_fingerprint.py``
    all take, so that none of them counts a run differently."""
    import memfit

    workload = WORKLOADS[run.workload](run.settings)
    with cuda_figures_scratch():
        return memfit.estimate_torch(
            workload.build,
            workload.step,
            workload.make_batch,
            [workload.batch],
            gpu=run.gpu,
            device="cpu",
            runtime=run.runtime,
            kernel_scratch=True,
        )


def predict(run: Run) -> Outcome:
    """Rebuild ``run``'s workload and trace it for the source's GPU and runtime."""
    started = time.perf_counter()
    est = trace(run)
    seconds = time.perf_counter() - started
    point = est.points[0]
    figure = {
        "device_used": point.device_used_peak,
        "reserved_peak": point.reserved_peak,
        "allocated_peak": point.allocated_peak,
    }[run.quantity]
    assert figure is not None, f"{run.name}: no {run.quantity} figure"
    error = (figure - run.measured_bytes) / run.measured_bytes
    return Outcome(run, figure, error, seconds, list(est.deviations))


def outcomes(runs: list[Run]) -> Iterator[Outcome]:
    for run in runs:
        yield predict(run)
