"""A vectorised cellular-automaton fire-spread environment on PyTorch tensors.

Each of ``num_envs`` environments is a ``size x size`` grid. The observation is a stack of
rasters (``CHANNELS``): fuel load, burning cells, burnt cells, terrain height (fire spreads
faster uphill) and the position of one bulldozer the agent drives. Every step the agent
moves the bulldozer one cell (or waits); the cell it enters loses its fuel (a firebreak).
Fire then spreads: a cell ignites with probability ``1 - exp(-rate * pressure)`` where the
pressure sums the burning neighbours, weighted by the wind direction and the slope, and
scaled by the cell's fuel. A burning cell burns out into a burnt one after one step.

The reward is minus the fraction of the grid that caught fire this step; an episode ends when
the fire is out or after ``max_steps``, and that environment is reset in place. Everything
runs on one device as batched tensor operations: no Python loop over environments.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

CHANNELS = ("fuel", "burning", "burnt", "terrain", "bulldozer")
ACTIONS = ("stay", "up", "down", "left", "right")
_MOVES = torch.tensor([[0, 0], [-1, 0], [1, 0], [0, -1], [0, 1]])


class FireEnv:
    """``num_envs`` fire-spread grids stepped together.

    Args:
        num_envs: Environments stepped in one batch.
        size: Grid side in cells.
        device: Torch device of every tensor.
        seed: Seed of the environment's own generator.
        rate: Ignition rate per unit of pressure.
        wind: ``(dy, dx)`` direction the wind blows towards.
        max_steps: Steps before an episode is cut.
    """

    def __init__(
        self,
        num_envs: int,
        size: int = 64,
        *,
        device: str | torch.device = "cpu",
        seed: int = 0,
        rate: float = 0.35,
        wind: tuple[float, float] = (0.0, 1.0),
        max_steps: int = 200,
    ) -> None:
        if num_envs < 1 or size < 8:
            raise ValueError(f"need num_envs >= 1 and size >= 8, got {num_envs}, {size}")
        self.num_envs, self.size, self.device = num_envs, size, torch.device(device)
        self.rate, self.max_steps = rate, max_steps
        self.gen = torch.Generator(device="cpu").manual_seed(seed)
        self.kernel = self._spread_kernel(wind).to(self.device)
        shape = (num_envs, size, size)
        self.fuel = torch.zeros(shape, device=self.device)
        self.burning = torch.zeros(shape, device=self.device)
        self.burnt = torch.zeros(shape, device=self.device)
        self.terrain = torch.zeros(shape, device=self.device)
        self.pos = torch.zeros((num_envs, 2), dtype=torch.long, device=self.device)
        self.t = torch.zeros(num_envs, dtype=torch.long, device=self.device)
        self.reset_envs(torch.ones(num_envs, dtype=torch.bool, device=self.device))

    @property
    def observation_shape(self) -> tuple[int, int, int]:
        """``(channels, height, width)`` of one observation."""
        return (len(CHANNELS), self.size, self.size)

    @staticmethod
    def _spread_kernel(wind: tuple[float, float]) -> torch.Tensor:
        dy, dx = wind
        k = torch.zeros(3, 3)
        for i in range(3):
            for j in range(3):
                if i == 1 and j == 1:
                    continue
                # a neighbour at offset (oy, ox) pushes fire towards -offset: downwind is faster
                oy, ox = i - 1, j - 1
                along = -(oy * dy + ox * dx) / math.hypot(oy, ox)
                k[i, j] = math.exp(0.8 * along) / math.hypot(oy, ox)
        return (k / k.sum()).view(1, 1, 3, 3)

    def _rand(self, *shape: int) -> torch.Tensor:
        return torch.rand(shape, generator=self.gen).to(self.device)

    def reset_envs(self, mask: torch.Tensor) -> None:
        """Start new episodes in the environments where ``mask`` is true."""
        n = int(mask.sum())
        if n == 0:
            return
        s = self.size
        # smooth random fuel and terrain: upsampled coarse noise
        coarse = self._rand(n, 2, s // 8, s // 8)
        smooth = F.interpolate(coarse, size=(s, s), mode="bilinear", align_corners=False)
        self.fuel[mask] = 0.3 + 0.7 * smooth[:, 0]
        self.terrain[mask] = smooth[:, 1]
        self.burnt[mask] = 0.0
        ignite = torch.zeros(n, s, s, device=self.device)
        centre = (self._rand(n, 2) * (s // 2) + s // 4).long().to(self.device)
        ignite[torch.arange(n, device=self.device), centre[:, 0], centre[:, 1]] = 1.0
        self.burning[mask] = ignite
        self.pos[mask] = (self._rand(n, 2) * s).long().clamp_(0, s - 1).to(self.device)
        self.t[mask] = 0

    def observe(self) -> torch.Tensor:
        """The observation batch, ``(num_envs, channels, size, size)`` uint8 in 0..255."""
        dozer = torch.zeros_like(self.fuel)
        dozer[torch.arange(self.num_envs, device=self.device), self.pos[:, 0], self.pos[:, 1]] = 1.0
        planes = torch.stack([self.fuel, self.burning, self.burnt, self.terrain, dozer], dim=1)
        return (planes * 255).round_().to(torch.uint8)

    def reset(self) -> torch.Tensor:
        """Reset every environment; return the observations."""
        self.reset_envs(torch.ones(self.num_envs, dtype=torch.bool, device=self.device))
        return self.observe()

    def step(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Move the bulldozers, spread the fire; return ``(obs, reward, done)``.

        Environments that finish are reset; ``obs`` is then their first observation.
        """
        n, s = self.num_envs, self.size
        idx = torch.arange(n, device=self.device)
        moves = _MOVES.to(self.device)[actions.long()]
        self.pos = (self.pos + moves).clamp_(0, s - 1)
        self.fuel[idx, self.pos[:, 0], self.pos[:, 1]] = 0.0  # cut a firebreak
        pressure = F.conv2d(self.burning.unsqueeze(1), self.kernel, padding=1).squeeze(1)
        uphill = 1.0 + 0.5 * (self.terrain - self.terrain.mean(dim=(1, 2), keepdim=True))
        prob = 1.0 - torch.exp(-self.rate * 8.0 * pressure * uphill.clamp(min=0.1))
        can_burn = (self.fuel > 0.05) & (self.burnt == 0) & (self.burning == 0)
        ignite = can_burn & (self._rand(n, s, s) < prob * self.fuel)
        self.burnt = torch.maximum(self.burnt, self.burning)
        self.burning = ignite.float()
        self.fuel = torch.where(ignite, torch.zeros_like(self.fuel), self.fuel)
        reward = -ignite.float().mean(dim=(1, 2))
        self.t += 1
        done = (self.burning.sum(dim=(1, 2)) == 0) | (self.t >= self.max_steps)
        self.reset_envs(done)
        return self.observe(), reward, done
