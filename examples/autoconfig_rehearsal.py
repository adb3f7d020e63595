"""``memfit.autoconfig`` rehearsed on simulated cards: read what is free now, plan the rest.

On the real card leave ``probe=`` and ``simulate_gpu`` out: memfit then reads torch's
``mem_get_info`` (once torch has started CUDA), JAX's ``memory_stats`` (inside its pool) or
NVML. Run: ``python examples/autoconfig_rehearsal.py`` (CPU, a second).
"""

from __future__ import annotations

import memfit
from memfit.backends import SimulatedDevice

# An 8 GB card right after Isaac Sim started in this process with 2 envs and their cameras:
# nvidia-smi would show 5.3 GiB in use.
card = SimulatedDevice("8GiB", name="NVIDIA GeForce RTX 4060 Ti", used_by_others="5.3GiB")
cfg = memfit.autoconfig("act_dual_camera", overrides={"num_envs": 2}, probe=card)
print(
    cfg.knobs,
    "fits" if cfg.plan.fits else "does not fit",
    f"headroom {memfit.format_bytes(cfg.plan.headroom_bytes)}",
)
for note in cfg.notes:
    print("note:", note)

# The DQN user's "auto-detect the GPU and apply settings", on a 3.68 GiB card (simulated: no
# CUDA context, so a little more than memfit plan --gpu 3.68GiB keeps):
with memfit.simulate_gpu("3.68GiB"):
    cfg = memfit.autoconfig("dqn_fire_raster@device_replay", apply=True)
print(cfg.knobs, cfg.applied)
