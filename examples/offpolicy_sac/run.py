"""Off-policy as people write it: SAC from pixels on an 8 GB card, and why Brax/MJX SAC asks
for 49.6 GiB at batch 32 (google-deepmind/mujoco#1431), planned on the CPU.

1. ``sac_pixels_8gb``: DrQ-style SAC from 84x84x3 pixels stacked 3 deep, one conv encoder
   shared by the actor and the twin critics (which read the action), target critics, a
   learned temperature, frames stored once; planned on an 8 GB card, and the same job with
   Stable-Baselines3's buffer layout (observation and next observation, whole stacks);
2. ``brax_mjx_sac@as_reported``: the report's run (max_replay_size left to Brax, so 30M
   transitions of 1,776 bytes on the device): the plan names the replay buffer, 49.62 GiB;
   ``brax_mjx_sac`` plans the largest ``max_replay_size`` that fits the 4090;
3. with brax installed, the model's replay row is checked against Brax's own
   ``UniformSamplingQueue`` (``jax.eval_shape``: nothing is allocated).

    python examples/offpolicy_sac/run.py [--gpu "RTX 4060 Ti 8GB"]
"""

from __future__ import annotations

import argparse
import importlib.util

import memfit
from memfit.errors import InfeasiblePlan

GiB = 2**30


def _show(plan: memfit.Plan, knob: str) -> str:
    where = plan.knobs.get("replay_placement", "gpu")
    return (f"{knob}={plan.knobs[knob]:,} ({where}), device {plan.predicted_bytes / GiB:.2f} "
            f"GiB, host {plan.host_bytes / GiB:.2f} GiB, limited by {plan.binding}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpu", default="RTX 4060 Ti 8GB")
    parser.add_argument("--host-memory", default="16GiB")
    args = parser.parse_args()
    host = memfit.units.parse_bytes(args.host_memory)

    for name in ("sac_pixels_8gb", "sac_pixels_8gb@sb3_buffer"):
        plan = memfit.plan(name, gpu=args.gpu, host_memory_bytes=host)
        print(f"{name} on {plan.gpu}: {_show(plan, 'buffer_size')}")
    on_card = memfit.plan("sac_pixels_8gb", gpu=args.gpu, overrides={}, host_memory_bytes=0)
    print(f"sac_pixels_8gb with no host RAM to spare: {_show(on_card, 'buffer_size')}")

    try:
        memfit.plan("brax_mjx_sac@as_reported", gpu="RTX 4090")
    except InfeasiblePlan as exc:
        print(f"mujoco#1431 as reported: {exc.message}")
    fitted = memfit.plan("brax_mjx_sac", gpu="RTX 4090")
    answer = _show(fitted, "max_replay_size")
    print(f"mujoco#1431 answer: pass max_replay_size to sac.train: {answer}")

    if importlib.util.find_spec("brax") is not None:
        import jax
        import jax.numpy as jnp
        from brax.training import replay_buffers
        from brax.training.types import Transition

        w = memfit.load_workload("brax_mjx_sac")
        obs, act = w.observations.vector, w.action_dim
        dummy = Transition(
            observation=jnp.zeros((obs,)),
            action=jnp.zeros((act,)),
            reward=0.0,
            discount=0.0,
            next_observation=jnp.zeros((obs,)),
            extras={"state_extras": {"truncation": 0.0}, "policy_extras": {}},
        )
        queue = replay_buffers.UniformSamplingQueue(
            max_replay_size=1000, dummy_data_sample=dummy, sample_batch_size=32
        )
        state = jax.eval_shape(queue.init, jax.random.PRNGKey(0))
        brax_row = state.data.shape[1] * state.data.dtype.itemsize
        from memfit.core.families.sac import replay_row_bytes

        model_row = replay_row_bytes(w, w.default_values())[0]
        print(f"Brax's UniformSamplingQueue row: {brax_row} bytes; memfit's model: {model_row}")
        if brax_row != model_row:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
