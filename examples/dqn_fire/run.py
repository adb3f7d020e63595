"""DQN on fire-spread rasters, fitted to a small GPU with memfit.

1. Plan: the bundled ``dqn_fire_raster`` workload, resized to this grid and channel count,
   is planned for ``--gpu`` once per Q-network (basic and enhanced). memfit decides the
   replay capacity, the batch size and where the replay buffer lives (GPU or host); the
   enhanced network is used when its plan keeps at least ``--min-buffer`` transitions.
2. Run: the vectorised fire environment and the replay buffer feed a DQN whose update runs
   under :class:`memfit.TrainGuard` (an out-of-memory step is redone in micro-batches with
   the same gradient). On a CPU the run happens under ``memfit.simulate_gpu(--budget)``, so
   tensors count against the small card's budget; a host-placed buffer is kept off it.
   ``--inject-oom`` makes random operations fail to show the guard at work.
3. Watch: a :class:`memfit.Recorder` writes every step to ``--log`` (JSON lines) and logs
   short lines; after each checkpoint memfit's cleanup policy runs.
4. Report: ``memfit report <log>`` draws it.

Small setting (CPU, under a minute): ``python examples/dqn_fire/run.py``.
Full setting on a real 4 GB card: ``python examples/dqn_fire/run.py --size 64 --steps 200000
--buffer-cap 0 --device cuda``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from env import ACTIONS, CHANNELS, FireEnv
from model import NETWORK_SPECS, NETWORKS

import memfit
from memfit.core.workload import BUNDLED_DIR, Workload, parse_workload
from memfit.units import format_bytes, parse_bytes


def host_memory_bytes() -> int:
    """This machine's physical memory (what a host-placed replay buffer may use)."""
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def fire_workload(
    size: int, network: str, num_envs: int, host_bytes: int, batch_size: int
) -> Workload:
    """The bundled DQN workload with this grid, these channels, this Q-network and batch."""
    data = yaml.safe_load((BUNDLED_DIR / "dqn_fire_raster.yaml").read_text(encoding="utf-8"))
    data.pop("variants", None)
    spec = NETWORK_SPECS[network]
    data["name"] = f"dqn_fire_{network}_{size}"
    data["observations"] = {
        "raster": {"channels": len(CHANNELS), "height": size, "width": size, "dtype": "uint8"}
    }
    data["networks"] = {"q": spec, "q_target": {**spec, "target": True}}
    data["replay"] = {**data["replay"], "placement": "auto"}
    data["settings"] = {"num_envs": num_envs, "batch_size": batch_size}
    data["host_memory_bytes"] = host_bytes
    data["constraints"] = {
        "rules": [{"knob": "buffer_size", "divisible_by": num_envs, "name": "buffer per env"}]
    }
    return parse_workload(yaml.safe_dump(data, sort_keys=False), source=data["name"])


def choose(args: argparse.Namespace) -> tuple[str, memfit.Plan]:
    """Plan both networks; take the enhanced one when it keeps --min-buffer transitions."""
    plans: dict[str, memfit.Plan] = {}
    for name in ("enhanced", "basic"):
        workload = fire_workload(args.size, name, args.num_envs, args.host_memory, args.batch_size)
        try:
            plans[name] = memfit.plan(workload, gpu=args.gpu, margin=args.margin)
        except memfit.InfeasiblePlan as exc:
            print(f"plan {name:8s}: does not fit ({exc.message})")
            continue
        p = plans[name]
        print(
            f"plan {name:8s}: buffer_size={p.knobs['buffer_size']} "
            f"batch_size={args.batch_size} replay on {p.knobs['replay_placement']}, "
            f"predicted {format_bytes(p.predicted_bytes)} of {format_bytes(p.budget_bytes)} "
            f"(limited by {p.binding})"
        )
    for name in ("enhanced", "basic"):
        if name in plans and int(plans[name].knobs["buffer_size"]) >= args.min_buffer:
            return name, plans[name]
    if "basic" in plans:
        return "basic", plans["basic"]
    raise memfit.InfeasiblePlan(
        f"neither Q-network fits {args.gpu}",
        smallest_bytes=None,
        budget_bytes=0,
        binding_term=None,
        hint="a smaller grid (--size) or a larger GPU",
    )


class Replay:
    """A uint8 ring buffer of transitions on the device the plan chose."""

    def __init__(self, capacity: int, obs_shape: tuple[int, ...], device: torch.device) -> None:
        self.capacity, self.device, self.size, self.pos = capacity, device, 0, 0
        self.obs = torch.zeros((capacity, *obs_shape), dtype=torch.uint8, device=device)
        self.next_obs = torch.zeros_like(self.obs)
        self.act = torch.zeros(capacity, dtype=torch.int64, device=device)
        self.rew = torch.zeros(capacity, device=device)
        self.done = torch.zeros(capacity, device=device)

    @property
    def nbytes(self) -> int:
        return sum(
            t.numel() * t.element_size()
            for t in (self.obs, self.next_obs, self.act, self.rew, self.done)
        )

    def add(self, obs: Any, act: Any, rew: Any, next_obs: Any, done: Any) -> None:
        n = obs.shape[0]
        idx = (torch.arange(n) + self.pos) % self.capacity
        idx = idx.to(self.device)
        self.obs[idx] = obs.to(self.device)
        self.next_obs[idx] = next_obs.to(self.device)
        self.act[idx] = act.to(self.device)
        self.rew[idx] = rew.to(self.device)
        self.done[idx] = done.float().to(self.device)
        self.pos = (self.pos + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def sample(self, batch: int, gen: torch.Generator, device: torch.device) -> dict[str, Any]:
        idx = torch.randint(0, self.size, (batch,), generator=gen).to(self.device)
        return {
            "obs": self.obs[idx].to(device),
            "act": self.act[idx].to(device),
            "rew": self.rew[idx].to(device),
            "next_obs": self.next_obs[idx].to(device),
            "done": self.done[idx].to(device),
        }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", default="3.68GiB", help="GPU to plan for (name or size)")
    ap.add_argument("--budget", default="3.68GiB", help="simulated GPU budget on a CPU")
    ap.add_argument("--device", default="cpu", help="cpu (simulated GPU) or cuda")
    ap.add_argument("--size", type=int, default=48, help="grid side in cells")
    ap.add_argument("--num-envs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=160, help="environment steps (per env)")
    ap.add_argument("--learning-starts", type=int, default=64, help="transitions first")
    ap.add_argument("--train-every", type=int, default=4, help="env steps per update")
    ap.add_argument("--buffer-cap", type=int, default=4000, help="cap the planned buffer (0: none)")
    ap.add_argument(
        "--batch-size", type=int, default=128, help="the DQN's batch (CleanRL's default)"
    )
    ap.add_argument("--batch-cap", type=int, default=64, help="cap the batch (0: none)")
    ap.add_argument("--min-buffer", type=int, default=100_000)
    ap.add_argument("--margin", default="10%")
    ap.add_argument("--host-memory", type=parse_bytes, default=host_memory_bytes())
    ap.add_argument("--inject-oom", type=float, default=0.001, help="chance an op fails")
    ap.add_argument("--chaos-updates", type=int, default=10, help="updates with --inject-oom")
    ap.add_argument("--checkpoint-every", type=int, default=50)
    ap.add_argument("--log", default=str(Path(tempfile.gettempdir()) / "dqn_fire.jsonl"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    network, plan = choose(args)
    capacity = int(plan.knobs["buffer_size"])
    batch = args.batch_size
    if args.buffer_cap:
        capacity = min(capacity, args.buffer_cap)
    if args.batch_cap:
        batch = min(batch, args.batch_cap)
    on_gpu = plan.knobs["replay_placement"] == "gpu"
    print(
        f"chosen: {network} Q-network, replay {capacity} transitions on the "
        f"{'GPU' if on_gpu else 'host'}, batch {batch} (plan: {plan.knobs['buffer_size']}, "
        f"{args.batch_size})"
    )
    Path(args.log).unlink(missing_ok=True)
    device = torch.device(args.device)
    sim: Any = (
        memfit.simulate_gpu(args.budget) if device.type == "cpu" else contextlib.nullcontext()
    )
    with (
        sim as gpu,
        memfit.Recorder(args.log, log_every=100) as rec,
        tempfile.TemporaryDirectory(prefix="dqn_fire_ckpt_") as ckpt_name,
    ):
        env = FireEnv(args.num_envs, args.size, device=device, seed=args.seed)
        q = NETWORKS[network](len(CHANNELS), args.size, len(ACTIONS)).to(device)
        target = copy.deepcopy(q)
        optimizer = torch.optim.Adam(q.parameters(), lr=1e-4)
        replay_device = device if on_gpu else torch.device("cpu")

        def off_gpu() -> Any:
            """Memory that lives on the host is not counted on the simulated GPU."""
            return gpu.paused() if (gpu is not None and not on_gpu) else contextlib.nullcontext()

        with off_gpu():
            replay = Replay(capacity, env.observation_shape, replay_device)
        print(f"replay buffer: {format_bytes(replay.nbytes)} on {'GPU' if on_gpu else 'host'}")

        def loss_fn(b: dict[str, Any]) -> torch.Tensor:
            with torch.no_grad():
                best = target(b["next_obs"]).max(dim=1).values
                y = b["rew"] + 0.99 * (1.0 - b["done"]) * best
            qa = q(b["obs"]).gather(1, b["act"].unsqueeze(1)).squeeze(1)
            return F.smooth_l1_loss(qa, y)

        guard = memfit.TrainGuard(optimizer, loss_fn, on_event=rec.on_event, max_splits=16)
        # clean up after each checkpoint (gc + empty_cache), measured, reported to the recorder
        # with the training step at which it ran (read from the loop's `step`)
        step = 0
        save = (
            memfit.cleanup.after_call(gc_collect=True, on_event=rec.on_event, step=lambda: step)(
                save_checkpoint
            )
            if args.checkpoint_every
            else None
        )
        gen = torch.Generator().manual_seed(args.seed)
        obs = env.reset()
        losses: list[float] = []
        ckpt_dir = Path(ckpt_name)  # the checkpoints go with it when the run ends

        def chaos(update: int) -> Any:
            """Random out-of-memory errors in updates 10 .. 10 + --chaos-updates."""
            if args.inject_oom <= 0 or not 10 <= update < 10 + args.chaos_updates:
                return contextlib.nullcontext()
            return memfit.testing.inject_oom(args.inject_oom, seed=args.seed + update, limit=1)

        for step in range(args.steps):
            eps = max(0.05, 1.0 - step / (0.5 * args.steps))
            with torch.no_grad():
                greedy = q(obs).argmax(dim=1)
            explore = torch.rand(args.num_envs, generator=gen).to(device) < eps
            random_act = torch.randint(0, len(ACTIONS), (args.num_envs,), generator=gen)
            act = torch.where(explore, random_act.to(device), greedy)
            next_obs, rew, done = env.step(act)
            with off_gpu():
                replay.add(obs, act, rew, next_obs, done)
            obs = next_obs
            if replay.size >= args.learning_starts and step % args.train_every == 0:
                b = replay.sample(batch, gen, device)
                with chaos(guard.steps):
                    losses.append(guard(b))
                del b
            if step % 50 == 0:
                target.load_state_dict(q.state_dict())
            if save is not None and (step + 1) % args.checkpoint_every == 0:
                save(q, optimizer, ckpt_dir / f"step{step + 1}.pt")
            rec.step(step)
        mean_loss = sum(losses[-50:]) / max(1, len(losses[-50:]))
        oom_events = [e for e in guard.events if e.kind == "oom"]
        print(
            f"done: {args.steps} steps x {args.num_envs} envs, {guard.steps} updates, "
            f"loss {mean_loss:.4f}, {len(oom_events)} OOMs survived, splits now {guard.splits}"
        )
        if save is not None:
            stats = save.cleanup.stats
            print(
                f"checkpoints: {stats.calls}, cleanups after them: {stats.cleanups} "
                f"({stats.seconds * 1000:.1f} ms in all)"
            )
        if gpu is not None:
            print(
                f"simulated GPU: peak {format_bytes(gpu.peak_allocated_bytes)} of "
                f"{format_bytes(gpu.budget_bytes)}"
            )
    print(f"memory log: {args.log} (memfit report {args.log} -o dqn_fire.png)")
    print(f"wall time {time.perf_counter() - t0:.1f} s")
    return 0


def save_checkpoint(model: torch.nn.Module, optimizer: Any, path: Path) -> None:
    """Write the model and optimiser state."""
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)


if __name__ == "__main__":
    sys.exit(main())
