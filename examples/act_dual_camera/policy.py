"""An ACT-style policy: a small ResNet-style backbone per camera, a transformer encoder over
the image-feature tokens and the robot state, and a decoder that predicts a chunk of actions.

As in ACT (Zhao et al., 2023, and LeRobot's ``ACTPolicy``), the policy predicts
``chunk_size`` future actions at once. :class:`ActionChunker` turns chunks into one action per
step: either it plays a chunk out from a queue and predicts again when the queue is empty,
or, with temporal ensembling, it predicts every step and averages every chunk's prediction
for the current step with weights ``exp(-k * age)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn


class _Block(nn.Module):
    """A ResNet basic block (two 3x3 convolutions, batch norm, a projected shortcut)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = (
            nn.Identity()
            if stride == 1 and cin == cout
            else nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout)
            )
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(h)) + self.short(x))


class Backbone(nn.Module):
    """ResNet-style feature extractor with stride 32 (a narrow ResNet-18 layout)."""

    WIDTHS = (32, 64, 128, 256)

    def __init__(self) -> None:
        super().__init__()
        w = self.WIDTHS
        self.stem = nn.Sequential(
            nn.Conv2d(3, w[0], 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(w[0]),
            nn.ReLU(),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
        self.stages = nn.Sequential(
            _Block(w[0], w[0], 1),
            _Block(w[0], w[1], 2),
            _Block(w[1], w[2], 2),
            _Block(w[2], w[3], 2),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stages(self.stem(x))


class ACTPolicy(nn.Module):
    """Two cameras + robot state -> a chunk of ``chunk_size`` actions.

    Args:
        state_dim: Length of the robot state (joint positions).
        action_dim: Length of one action.
        chunk_size: Actions predicted per call.
        dim_model: Transformer width.
        heads: Attention heads.
        layers: Encoder and decoder layers (each).
    """

    def __init__(
        self,
        state_dim: int = 14,
        action_dim: int = 14,
        chunk_size: int = 20,
        dim_model: int = 128,
        heads: int = 4,
        layers: int = 2,
    ) -> None:
        super().__init__()
        self.chunk_size, self.action_dim = chunk_size, action_dim
        self.backbone = Backbone()
        self.project = nn.Conv2d(Backbone.WIDTHS[-1], dim_model, 1)
        self.state_in = nn.Linear(state_dim, dim_model)
        self.camera_embed = nn.Parameter(torch.zeros(2, dim_model))
        self.transformer = nn.Transformer(
            d_model=dim_model,
            nhead=heads,
            num_encoder_layers=layers,
            num_decoder_layers=layers,
            dim_feedforward=4 * dim_model,
            dropout=0.0,
            batch_first=True,
        )
        self.queries = nn.Parameter(torch.randn(chunk_size, dim_model) * 0.02)
        self.action_out = nn.Linear(dim_model, action_dim)

    def _tokens(self, image: torch.Tensor, camera: int) -> torch.Tensor:
        x = image.float() / 255.0  # (n, 3, H, W) uint8 -> float
        feat = self.project(self.backbone(x))  # (n, d, H/32, W/32)
        tokens = feat.flatten(2).transpose(1, 2)  # (n, tokens, d)
        return tokens + self.camera_embed[camera]

    def predict_chunk(
        self, main: torch.Tensor, wrist: torch.Tensor, state: torch.Tensor
    ) -> torch.Tensor:
        """``(n, chunk_size, action_dim)`` actions for ``n`` environments."""
        memory = torch.cat(
            [self.state_in(state).unsqueeze(1), self._tokens(main, 0), self._tokens(wrist, 1)],
            dim=1,
        )
        queries = self.queries.unsqueeze(0).expand(state.shape[0], -1, -1)
        return self.action_out(self.transformer(memory, queries))


class ActionChunker:
    """One action per step from chunk predictions: a queue, or temporal ensembling.

    Args:
        predict: ``predict(main, wrist, state) -> (n, chunk, action_dim)`` (may be guarded).
        chunk_size: Actions per chunk.
        temporal_ensemble: Predict every step and average the overlapping chunks.
        k: Ensembling weight decay: weight ``exp(-k * i)`` for the ``i``-th oldest chunk.
    """

    def __init__(
        self,
        predict: Callable[..., torch.Tensor],
        chunk_size: int,
        *,
        temporal_ensemble: bool = False,
        k: float = 0.01,
    ) -> None:
        self.predict, self.chunk_size = predict, chunk_size
        self.temporal_ensemble, self.k = temporal_ensemble, k
        self.queue: torch.Tensor | None = None  # (n, remaining, action_dim)
        self.history: list[torch.Tensor] = []  # chunks, newest last, aligned to "now"
        self.calls = 0

    def select_action(self, obs: dict[str, Any]) -> torch.Tensor:
        """The action for this step, ``(n, action_dim)``."""
        if self.temporal_ensemble:
            self.calls += 1
            chunk = self.predict(obs["main"], obs["wrist"], obs["state"])
            self.history = [c[:, 1:] for c in self.history if c.shape[1] > 1] + [chunk]
            now = torch.stack([c[:, 0] for c in self.history], dim=0)  # oldest first
            ages = torch.arange(len(self.history) - 1, -1, -1, dtype=now.dtype)
            weights = torch.exp(-self.k * ages).to(now.device)
            return (now * weights.view(-1, 1, 1)).sum(0) / weights.sum()
        if self.queue is None or self.queue.shape[1] == 0:
            self.calls += 1
            self.queue = self.predict(obs["main"], obs["wrist"], obs["state"])
        action, self.queue = self.queue[:, 0], self.queue[:, 1:]
        return action
