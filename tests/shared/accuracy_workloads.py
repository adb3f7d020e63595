"""Workloads for the estimator's accuracy benchmark and tests: factories returning TorchStep.

Each ``make_*`` function returns a :class:`memfit.estimate.TorchStep` (or ``JaxStep``) and can
be named on the command line: ``memfit estimate bench.estimate_workloads:make_ppo_mlp``.
The models are small stand-ins written here (torchvision is not a dependency): a ResNet-18-like
backbone, an ACT-style policy, a small GPT, a DQN CNN, PPO actor-critic MLPs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from memfit.estimate import JaxStep, TorchStep

__all__ = ["JAX_WORKLOADS", "TORCH_WORKLOADS"]


def _torch() -> Any:
    import torch

    return torch


# --- models -------------------------------------------------------------------------------------


def _resnet18_like(width: int = 64, in_channels: int = 3, out_dim: int = 512) -> Any:
    """A ResNet-18 layout (4 stages of 2 basic blocks, BatchNorm) with ``width`` base channels."""
    torch = _torch()
    nn = torch.nn

    class Basic(nn.Module):  # type: ignore[misc]
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(
                    nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
                )

        def forward(self, x: Any) -> Any:
            out = torch.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            identity = x if self.down is None else self.down(x)
            return torch.relu(out + identity)

    widths = [width, width * 2, width * 4, width * 8]
    layers: list[Any] = [
        nn.Conv2d(in_channels, width, 7, 2, 3, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(),
        nn.MaxPool2d(3, 2, 1),
    ]
    cin = width
    for i, w in enumerate(widths):
        stride = 1 if i == 0 else 2
        layers += [Basic(cin, w, stride), Basic(w, w, 1)]
        cin = w
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, out_dim)]
    return nn.Sequential(*layers)


def _classifier_step(model: Any, opt: Any, batch: Any) -> None:
    torch = _torch()
    x, y = batch
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()


def _regression_step(model: Any, opt: Any, batch: Any) -> None:
    torch = _torch()
    x, y = batch
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def make_resnet18(image: int = 224, classes: int = 1000) -> TorchStep:
    """ResNet-18-like classifier + Adam on ``image`` x ``image`` RGB images."""
    torch = _torch()

    def build() -> tuple[Any, Any]:
        model = _resnet18_like(out_dim=classes)
        return model, torch.optim.Adam(model.parameters(), lr=1e-3)

    def make_batch(b: int) -> Any:
        return torch.randn(b, 3, image, image), torch.randint(0, classes, (b,))

    return TorchStep(build, _classifier_step, make_batch)


def make_bn_convnet(image: int = 64) -> TorchStep:
    """A small conv net with BatchNorm + SGD with momentum."""
    torch = _torch()
    nn = torch.nn

    def build() -> tuple[Any, Any]:
        model = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.BatchNorm2d(64),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(4),
            nn.Flatten(),
            nn.Linear(64 * 16, 10),
        )
        return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def make_batch(b: int) -> Any:
        return torch.randn(b, 3, image, image), torch.randint(0, 10, (b,))

    return TorchStep(build, _classifier_step, make_batch)


def make_ppo_mlp(obs_dim: int = 64, act_dim: int = 8, hidden: int = 256) -> TorchStep:
    """PPO actor-critic MLPs (separate actor and critic, tanh) with the clipped loss, Adam."""
    torch = _torch()
    nn = torch.nn

    class ActorCritic(nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.actor = nn.Sequential(
                nn.Linear(obs_dim, hidden),
                nn.Tanh(),
                nn.Linear(hidden, hidden),
                nn.Tanh(),
                nn.Linear(hidden, act_dim),
            )
            self.critic = nn.Sequential(
                nn.Linear(obs_dim, hidden),
                nn.Tanh(),
                nn.Linear(hidden, hidden),
                nn.Tanh(),
                nn.Linear(hidden, 1),
            )
            self.log_std = nn.Parameter(torch.zeros(act_dim))

    def build() -> tuple[Any, Any]:
        model = ActorCritic()
        return model, torch.optim.Adam(model.parameters(), lr=3e-4)

    def make_batch(b: int) -> Any:
        return (
            torch.randn(b, obs_dim),
            torch.randn(b, act_dim),
            torch.randn(b),
            torch.randn(b),
            torch.randn(b),
        )

    def step(model: Any, opt: Any, batch: Any) -> None:
        obs, actions, old_logp, adv, returns = batch
        mean = model.actor(obs)
        dist = torch.distributions.Normal(mean, model.log_std.exp())
        logp = dist.log_prob(actions).sum(-1)
        ratio = (logp - old_logp).exp()
        policy_loss = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv).mean()
        value_loss = (model.critic(obs).squeeze(-1) - returns).pow(2).mean()
        loss = policy_loss + 0.5 * value_loss - 0.01 * dist.entropy().sum(-1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()

    return TorchStep(build, step, make_batch, batch_knob="minibatch_size")


def make_dqn_cnn(image: int = 84, actions: int = 6) -> TorchStep:
    """Nature-DQN CNN on ``image`` x ``image`` x 4 stacked frames, Huber TD loss, Adam."""
    torch = _torch()
    nn = torch.nn

    def net() -> Any:
        size = image
        for k, s in ((8, 4), (4, 2), (3, 1)):
            size = (size - k) // s + 1
        return nn.Sequential(
            nn.Conv2d(4, 32, 8, 4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, 2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, 1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(64 * size * size, 512),
            nn.ReLU(),
            nn.Linear(512, actions),
        )

    def build() -> tuple[Any, Any]:
        model = nn.ModuleDict({"online": net(), "target": net()})
        model["target"].requires_grad_(False)
        return model, torch.optim.Adam(model["online"].parameters(), lr=1e-4)

    def make_batch(b: int) -> Any:
        obs = torch.rand(b, 4, image, image)
        nxt = torch.rand(b, 4, image, image)
        return obs, torch.randint(0, actions, (b,)), torch.randn(b), nxt, torch.zeros(b)

    def step(model: Any, opt: Any, batch: Any) -> None:
        obs, act, rew, nxt, done = batch
        with torch.no_grad():
            target = rew + 0.99 * (1 - done) * model["target"](nxt).max(-1).values
        q = model["online"](obs).gather(1, act[:, None]).squeeze(1)
        loss = torch.nn.functional.smooth_l1_loss(q, target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return TorchStep(build, step, make_batch)


def make_gpt(vocab: int = 8192, seq: int = 256, dim: int = 384, layers: int = 6) -> TorchStep:
    """A small GPT (pre-norm blocks, causal scaled_dot_product_attention) + AdamW."""
    torch = _torch()
    nn = torch.nn
    heads = max(1, dim // 64)

    class Block(nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.ln1 = nn.LayerNorm(dim)
            self.qkv = nn.Linear(dim, 3 * dim)
            self.proj = nn.Linear(dim, dim)
            self.ln2 = nn.LayerNorm(dim)
            self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

        def forward(self, x: Any) -> Any:
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, heads, dim // heads).unbind(2)
            y = nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
            )
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, dim))
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(vocab, dim)
            self.pos = nn.Embedding(seq, dim)
            self.blocks = nn.ModuleList([Block() for _ in range(layers)])
            self.ln = nn.LayerNorm(dim)
            self.head = nn.Linear(dim, vocab, bias=False)

        def forward(self, idx: Any) -> Any:
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln(x))

    def build() -> tuple[Any, Any]:
        model = GPT()
        return model, torch.optim.AdamW(model.parameters(), lr=3e-4)

    def make_batch(b: int) -> Any:
        return torch.randint(0, vocab, (b, seq)), torch.randint(0, vocab, (b, seq))

    def step(model: Any, opt: Any, batch: Any) -> None:
        idx, tgt = batch
        logits = model(idx)
        loss = nn.functional.cross_entropy(logits.view(-1, vocab), tgt.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return TorchStep(build, step, make_batch)


def make_checkpointed_mlp(dim: int = 512, depth: int = 8) -> TorchStep:
    """A deep MLP whose blocks run under activation checkpointing (non-reentrant), Adam."""
    torch = _torch()
    nn = torch.nn
    from torch.utils.checkpoint import checkpoint

    class Net(nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(
                [
                    nn.Sequential(nn.Linear(dim, dim * 2), nn.GELU(), nn.Linear(dim * 2, dim))
                    for _ in range(depth)
                ]
            )
            self.out = nn.Linear(dim, 1)

        def forward(self, x: Any) -> Any:
            for block in self.blocks:
                x = x + checkpoint(block, x, use_reentrant=False)
            return self.out(x)

    def build() -> tuple[Any, Any]:
        model = Net()
        return model, torch.optim.Adam(model.parameters())

    def make_batch(b: int) -> Any:
        return torch.randn(b, dim), torch.randn(b, 1)

    return TorchStep(build, _regression_step, make_batch)


def make_transformer_block(dim: int = 256, seq: int = 64) -> TorchStep:
    """One nn.TransformerEncoderLayer (batch first) + Adam, MSE to a random target."""
    torch = _torch()
    nn = torch.nn

    def build() -> tuple[Any, Any]:
        model = nn.TransformerEncoderLayer(dim, 4, dim * 4, dropout=0.0, batch_first=True)
        return model, torch.optim.Adam(model.parameters())

    def make_batch(b: int) -> Any:
        return torch.randn(b, seq, dim), torch.randn(b, seq, dim)

    return TorchStep(build, _regression_step, make_batch)


def make_act_policy(
    image: int = 256, cameras: int = 2, chunk: int = 50, dim: int = 256
) -> TorchStep:
    """ACT-style policy: a ResNet-18-like backbone per camera frame, a transformer over the
    image tokens and the joint state, and an action-chunk head; L1 loss, AdamW."""
    torch = _torch()
    nn = torch.nn

    class ACT(nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            backbone = _resnet18_like()
            self.backbone = nn.Sequential(*list(backbone.children())[:-3])  # to the last stage
            self.proj = nn.Conv2d(512, dim, 1)
            self.state = nn.Linear(14, dim)
            self.encoder = nn.TransformerEncoder(
                nn.TransformerEncoderLayer(dim, 8, dim * 4, dropout=0.0, batch_first=True), 4
            )
            self.queries = nn.Parameter(torch.zeros(chunk, dim))
            self.decoder = nn.TransformerDecoder(
                nn.TransformerDecoderLayer(dim, 8, dim * 4, dropout=0.0, batch_first=True), 1
            )
            self.head = nn.Linear(dim, 14)

        def forward(self, images: Any, qpos: Any) -> Any:
            b = images.shape[0]
            feats = self.proj(self.backbone(images.flatten(0, 1)))  # (b*cams, dim, h, w)
            tokens = feats.flatten(2).transpose(1, 2).reshape(b, -1, dim)
            tokens = torch.cat([self.state(qpos)[:, None], tokens], dim=1)
            memory = self.encoder(tokens)
            out = self.decoder(self.queries.expand(b, -1, -1), memory)
            return self.head(out)

    def build() -> tuple[Any, Any]:
        model = ACT()
        return model, torch.optim.AdamW(model.parameters(), lr=1e-5)

    def make_batch(b: int) -> Any:
        return (
            torch.randn(b, cameras, 3, image, image),
            torch.randn(b, 14),
            torch.randn(b, chunk, 14),
        )

    def step(model: Any, opt: Any, batch: Any) -> None:
        images, qpos, actions = batch
        loss = nn.functional.l1_loss(model(images, qpos), actions)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return TorchStep(build, step, make_batch)


def make_jax_ppo(obs_dim: int = 64, act_dim: int = 8, hidden: int = 256) -> JaxStep:
    """A JAX PPO update step (actor-critic MLPs, clipped loss, Adam written out by hand)."""
    import jax
    import jax.numpy as jnp

    def init(key: Any) -> Any:
        sizes = [(obs_dim, hidden), (hidden, hidden), (hidden, act_dim + 1)]
        keys = jax.random.split(key, len(sizes))
        return [
            (jax.random.normal(k, s) / jnp.sqrt(s[0]), jnp.zeros(s[1]))
            for k, s in zip(keys, sizes, strict=True)
        ]

    def forward(params: Any, obs: Any) -> Any:
        x = obs
        for w, b in params[:-1]:
            x = jnp.tanh(x @ w + b)
        w, b = params[-1]
        out = x @ w + b
        return out[:, :act_dim], out[:, act_dim]

    def loss_fn(params: Any, batch: Any) -> Any:
        obs, actions, old_logp, adv, returns = batch
        mean, value = forward(params, obs)
        logp = -0.5 * jnp.sum((actions - mean) ** 2, axis=-1)
        ratio = jnp.exp(logp - old_logp)
        pg = -jnp.mean(jnp.minimum(ratio * adv, jnp.clip(ratio, 0.8, 1.2) * adv))
        return pg + 0.5 * jnp.mean((value - returns) ** 2)

    def update(params: Any, m: Any, v: Any, batch: Any) -> Any:
        grads = jax.grad(loss_fn)(params, batch)
        m = jax.tree_util.tree_map(lambda a, g: 0.9 * a + 0.1 * g, m, grads)
        v = jax.tree_util.tree_map(lambda a, g: 0.999 * a + 0.001 * g * g, v, grads)
        params = jax.tree_util.tree_map(
            lambda p, a, b: p - 3e-4 * a / (jnp.sqrt(b) + 1e-8), params, m, v
        )
        return params, m, v

    def make_args(b: int) -> tuple[Any, ...]:
        params = jax.eval_shape(init, jax.random.PRNGKey(0))
        f32 = jnp.float32
        batch = (
            jax.ShapeDtypeStruct((b, obs_dim), f32),
            jax.ShapeDtypeStruct((b, act_dim), f32),
            jax.ShapeDtypeStruct((b,), f32),
            jax.ShapeDtypeStruct((b,), f32),
            jax.ShapeDtypeStruct((b,), f32),
        )
        return params, params, params, batch

    return JaxStep(update, make_args, batch_knob="minibatch_size")


#: Name -> (factory, batch sizes) for the accuracy benchmark.
TORCH_WORKLOADS: dict[str, tuple[Callable[[], TorchStep], tuple[int, int, int]]] = {
    "ppo_mlp_small": (lambda: make_ppo_mlp(64, 8, 256), (1024, 4096, 16384)),
    "ppo_mlp_large": (lambda: make_ppo_mlp(256, 24, 1024), (1024, 4096, 16384)),
    "dqn_cnn_84": (lambda: make_dqn_cnn(84), (32, 128, 512)),
    "dqn_cnn_128": (lambda: make_dqn_cnn(128), (32, 128, 256)),
    "act_2cam_256": (lambda: make_act_policy(256), (4, 8, 16)),
    "act_2cam_384": (lambda: make_act_policy(384), (4, 8, 16)),
    "act_2cam_512": (lambda: make_act_policy(512), (2, 4, 8)),
    "resnet18_224": (lambda: make_resnet18(224), (16, 32, 64)),
    "gpt_small": (lambda: make_gpt(), (4, 8, 16)),
    "bn_convnet": (lambda: make_bn_convnet(64), (64, 128, 256)),
    "checkpointed_mlp": (lambda: make_checkpointed_mlp(), (256, 1024, 4096)),
    "transformer_block": (lambda: make_transformer_block(), (16, 64, 256)),
}

JAX_WORKLOADS: dict[str, tuple[Callable[[], JaxStep], tuple[int, int, int]]] = {
    "jax_ppo_update": (lambda: make_jax_ppo(), (1024, 4096, 16384)),
}
