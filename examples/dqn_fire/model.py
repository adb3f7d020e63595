"""Q-networks for the fire rasters: a basic Nature-DQN CNN and an enhanced dueling one.

``NETWORK_SPECS`` describes each network the way a memfit workload does (convolutions and
layer widths), so the planner sizes the same networks the script builds.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def _conv_out(size: int, kernel: int, stride: int, padding: int = 0) -> int:
    return (size + 2 * padding - kernel) // stride + 1


class BasicQNet(nn.Module):
    """Nature DQN: three convolutions and one hidden layer."""

    def __init__(self, channels: int, size: int, actions: int) -> None:
        super().__init__()
        s = _conv_out(_conv_out(_conv_out(size, 8, 4), 4, 2), 3, 1)
        self.features = nn.Sequential(
            nn.Conv2d(channels, 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
            nn.Flatten(),
        )  # fmt: skip
        self.head = nn.Sequential(nn.Linear(64 * s * s, 512), nn.ReLU(), nn.Linear(512, actions))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(obs.float() / 255.0))


class _Residual(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(width, width, 3, padding=1), nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.body(x))


class EnhancedQNet(nn.Module):
    """A dueling Q-network with residual stages: stride-2 stem, two residual stages, a
    stride-2 reduction, then value and advantage heads."""

    def __init__(self, channels: int, size: int, actions: int) -> None:
        super().__init__()
        s = _conv_out(_conv_out(_conv_out(size, 3, 2, 1), 3, 2, 1), 3, 2, 1)
        self.features = nn.Sequential(
            nn.Conv2d(channels, 32, 3, stride=2, padding=1), nn.ReLU(),
            _Residual(32),
            nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(),
            _Residual(64),
            nn.Conv2d(64, 64, 3, stride=2, padding=1), nn.ReLU(),
            nn.Flatten(),
        )  # fmt: skip
        flat = 64 * s * s
        self.value = nn.Sequential(nn.Linear(flat, 256), nn.ReLU(), nn.Linear(256, 1))
        self.advantage = nn.Sequential(nn.Linear(flat, 256), nn.ReLU(), nn.Linear(256, actions))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        h = self.features(obs.float() / 255.0)
        adv = self.advantage(h)
        return self.value(h) + adv - adv.mean(dim=1, keepdim=True)


NETWORKS: dict[str, type[nn.Module]] = {"basic": BasicQNet, "enhanced": EnhancedQNet}

#: Each network as memfit's workload schema describes it (for the planner).
NETWORK_SPECS: dict[str, dict[str, Any]] = {
    "basic": {
        "conv": [
            {"out_channels": 32, "kernel": 8, "stride": 4},
            {"out_channels": 64, "kernel": 4, "stride": 2},
            {"out_channels": 64, "kernel": 3, "stride": 1},
        ],
        "layers": [512, 5],
    },
    "enhanced": {
        "conv": [
            {"out_channels": 32, "kernel": 3, "stride": 2, "padding": 1},
            {"out_channels": 32, "kernel": 3, "stride": 1, "padding": 1, "repeat": 2},
            {"out_channels": 64, "kernel": 3, "stride": 2, "padding": 1},
            {"out_channels": 64, "kernel": 3, "stride": 1, "padding": 1, "repeat": 2},
            {"out_channels": 64, "kernel": 3, "stride": 2, "padding": 1},
        ],
        # value and advantage heads side by side: 2 x 256 hidden, 1 + 5 outputs
        "layers": [512, 6],
    },
}
