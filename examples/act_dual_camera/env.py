"""A batched bimanual reaching task rendered by two synthetic cameras per step.

Each environment has two 7-joint arms (a 14-dim state) and one cube. The main camera looks
at the table from above: the cube and both grippers are drawn as soft coloured discs on a
textured table. The wrist camera is mounted on the left gripper: it shows the same scene
zoomed four times around the gripper, so the cube fills it when the gripper is near. Both
are RGB ``uint8`` images of ``image_size x image_size`` rendered with batched tensor
operations.

The environment is functional, as Brax's are: ``step(state, action) -> (state, obs,
reward)`` holds no per-environment data of its own, so a step can be run in chunks of
environments (which is what :class:`memfit.RolloutGuard` does when memory runs out).
"""

from __future__ import annotations

import torch


class DualCameraEnv:
    """Render and step ``num_envs`` environments.

    Args:
        image_size: Side of both camera images in pixels.
        device: Torch device.
    """

    def __init__(self, image_size: int, device: str | torch.device = "cpu") -> None:
        self.image_size, self.device = image_size, torch.device(device)
        s = image_size
        lin = torch.linspace(0.0, 1.0, s, device=self.device)
        self.yy, self.xx = torch.meshgrid(lin, lin, indexing="ij")
        checker = ((self.yy * 8).floor() + (self.xx * 8).floor()) % 2
        self.table = torch.stack([0.55 + 0.1 * checker, 0.45 + 0.1 * checker, 0.35 + 0.0 * checker])

    def reset(self, num_envs: int, seed: int = 0) -> dict[str, torch.Tensor]:
        """A new state for ``num_envs`` environments."""
        g = torch.Generator().manual_seed(seed)
        return {
            "joints": (torch.rand(num_envs, 14, generator=g) - 0.5).to(self.device),
            "cube": (0.2 + 0.6 * torch.rand(num_envs, 2, generator=g)).to(self.device),
        }

    @staticmethod
    def grippers(joints: torch.Tensor) -> torch.Tensor:
        """Gripper positions ``(n, 2 arms, 2)`` in the unit square (a planar forward model)."""
        arms = joints.view(-1, 2, 7)
        angle = torch.cumsum(arms, dim=2)
        reach = 0.12 * torch.stack([torch.cos(angle), torch.sin(angle)], dim=3).sum(dim=2)
        base = torch.tensor([[0.25, 0.05], [0.75, 0.05]], device=joints.device)
        return (base + reach).clamp(0.0, 1.0)

    def _disc(self, centre: torch.Tensor, radius: float, zoom: torch.Tensor | None) -> torch.Tensor:
        yy, xx = self.yy, self.xx
        if zoom is not None:  # wrist camera: view a 1/4-size window centred on ``zoom``
            yy = zoom[:, 0].view(-1, 1, 1) + (yy - 0.5) / 4
            xx = zoom[:, 1].view(-1, 1, 1) + (xx - 0.5) / 4
        d2 = (yy - centre[:, 0].view(-1, 1, 1)) ** 2 + (xx - centre[:, 1].view(-1, 1, 1)) ** 2
        return torch.exp(-d2 / (2 * radius**2))

    def render(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Observations: ``main`` and ``wrist`` images ``(n, 3, H, W)`` uint8, ``state``."""
        grip = self.grippers(state["joints"])
        images = []
        for zoom in (None, grip[:, 0]):
            cube = self._disc(state["cube"], 0.04, zoom)
            left = self._disc(grip[:, 0], 0.025, zoom)
            right = self._disc(grip[:, 1], 0.025, zoom)
            img = self.table.unsqueeze(0) * (1 - cube).unsqueeze(1)
            img = img + cube.unsqueeze(1) * torch.tensor([0.9, 0.1, 0.1], device=self.device).view(
                1, 3, 1, 1
            )
            img = (
                img * (1 - 0.8 * (left + right)).unsqueeze(1)
                + 0.8 * (left + right).unsqueeze(1) * 0.2
            )
            images.append((img.clamp(0, 1) * 255).to(torch.uint8))
        return {"main": images[0], "wrist": images[1], "state": state["joints"]}

    def step(
        self, joints: torch.Tensor, cube: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Move the joints towards ``action`` (target positions); render.

        Returns:
            ``(joints, cube, main, wrist, reward)``, every one batched over environments.
        """
        joints = joints + 0.2 * (action.to(joints.dtype).clamp(-1, 1) - joints)
        state = {"joints": joints, "cube": cube}
        obs = self.render(state)
        dist = (self.grippers(joints)[:, 0] - cube).norm(dim=1)
        return joints, cube, obs["main"], obs["wrist"], -dist
