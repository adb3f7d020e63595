"""ACT-style dual-camera policy rollout, fitted to a GPU with memfit.

1. Plan: the bundled ``act_dual_camera`` workload, with this policy's real parameter count,
   backbone and transformer, and the camera side as a knob (``image_size``), is planned for
   ``--gpu`` with ``--num-envs`` rollouts: memfit picks the largest resolution that fits.
2. Run: an environment renders a main and a wrist camera per step at that resolution; the
   policy predicts chunks of actions (optionally with temporal ensembling, optionally under
   autocast). The policy call inside ``select_action`` and ``env.step`` run under
   :class:`memfit.RolloutGuard`: on out-of-memory they are retried, then run in chunks of
   environments. On a CPU the rollout runs under ``memfit.simulate_gpu`` with the plan's
   budget (``--budget`` squeezes it to show the guard chunking).
3. Compare: the same rollout twice, once with the "empty the cache every 10 steps" habit
   (``memfit.cleanup.every(10, gc_collect=True)``), once with memfit's on-pressure policy
   (``memfit.cleanup.on_pressure(gc_collect=True)``): time, cleanups, time in cleanups.
4. Watch: a :class:`memfit.Recorder` per rollout logs memory per step to ``--log``.

Small setting (CPU, under a minute): ``python examples/act_dual_camera/run.py``.
Full setting on an 8 GB card: ``python examples/act_dual_camera/run.py --device cuda
--num-envs 16 --steps 400 --autocast``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from env import DualCameraEnv
from policy import ActionChunker, ACTPolicy, Backbone

import memfit
from memfit.core.workload import BUNDLED_DIR, Workload, parse_workload
from memfit.units import format_bytes

RESOLUTIONS = [128, 192, 256, 320, 384, 448, 512]


def act_workload(policy: ACTPolicy, num_envs: int, autocast: bool) -> Workload:
    """The bundled ACT workload with this policy and ``image_size`` as the knob."""
    data = yaml.safe_load((BUNDLED_DIR / "act_dual_camera.yaml").read_text(encoding="utf-8"))
    # this example renders its frames itself, not with Isaac Sim: the @no_sim case
    data.pop("simulator", None)
    data.pop("variants", None)
    w = Backbone.WIDTHS
    d_model = policy.transformer.d_model
    data["name"] = "act_dual_camera_example"
    data["observations"]["cameras"].update(height="image_size", width="image_size")
    data["networks"] = {"policy": {"params": sum(p.numel() for p in policy.parameters())}}
    data["vision"] = {
        "autocast": autocast,
        "chunk_size": policy.chunk_size,
        "backbone": [
            {"out_channels": w[0], "kernel": 7, "stride": 2, "padding": 3},
            {"kind": "pool", "kernel": 3, "stride": 2, "padding": 1},
            {"out_channels": w[0], "kernel": 3, "stride": 1, "padding": 1, "repeat": 2},
            {"out_channels": w[1], "kernel": 3, "stride": 2, "padding": 1, "repeat": 2},
            {"out_channels": w[2], "kernel": 3, "stride": 2, "padding": 1, "repeat": 2},
            {"out_channels": w[3], "kernel": 3, "stride": 2, "padding": 1, "repeat": 2},
        ],
        "transformer": {
            "dim_model": d_model,
            "ff_dim": 4 * d_model,
            "heads": policy.transformer.encoder.layers[0].self_attn.num_heads,
            "extra_tokens": 1,
        },
    }
    data["settings"] = {"num_envs": num_envs}
    data["knobs"] = {"image_size": {"choices": RESOLUTIONS, "default": 256}}
    data["objective"] = "image_size"
    return parse_workload(yaml.safe_dump(data, sort_keys=False), source=data["name"])


def rollout(
    args: argparse.Namespace,
    policy: ACTPolicy,
    image_size: int,
    budget: int,
    cleanup: Any,
    label: str,
) -> dict[str, Any]:
    """One rollout of ``--steps`` steps; returns its time and cleanup figures."""
    device = torch.device(args.device)
    env = DualCameraEnv(image_size, device)
    log = Path(args.log).with_suffix(f".{label}.jsonl")
    log.unlink(missing_ok=True)
    sim: Any = memfit.simulate_gpu(budget) if device.type == "cpu" else contextlib.nullcontext()
    amp: Any = (
        torch.autocast(device.type, dtype=torch.bfloat16)
        if args.autocast
        else contextlib.nullcontext()
    )
    with sim as gpu, memfit.Recorder(log, log_every=max(1, args.steps // 2)) as rec:
        cleanup.on_event = rec.on_event
        predict = memfit.RolloutGuard(policy.predict_chunk, on_event=rec.on_event)
        env_step = memfit.RolloutGuard(env.step, on_event=rec.on_event)
        chunker = ActionChunker(
            predict, policy.chunk_size, temporal_ensemble=args.temporal_ensemble
        )
        state = env.reset(args.num_envs, seed=args.seed)
        obs = memfit.RolloutGuard(env.render, on_event=rec.on_event)(state)
        joints, cube = state["joints"], state["cube"]
        total_reward = torch.zeros(args.num_envs)
        start = time.perf_counter()
        with torch.inference_mode():
            for step in range(args.steps):
                with amp:
                    action = chunker.select_action(obs)
                joints, cube, main, wrist, reward = env_step(joints, cube, action.float())
                obs = {"main": main, "wrist": wrist, "state": joints}
                total_reward += reward.float().cpu()
                cleanup(step=step)
                rec.step(step)
        seconds = time.perf_counter() - start
        peak = gpu.peak_allocated_bytes if gpu is not None else None
    return {
        "label": label,
        "seconds": seconds,
        "policy_calls": chunker.calls,
        "chunks": predict.splits,
        "guard_events": len(predict.events) + len(env_step.events),
        "cleanups": cleanup.stats.cleanups,
        "cleanup_seconds": cleanup.stats.seconds,
        "checks": cleanup.stats.calls,
        "peak": peak,
        "reward": float(total_reward.mean()) / args.steps,
        "log": str(log),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", default="RTX 3060 Ti", help="GPU to plan for (name or size)")
    ap.add_argument("--num-envs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--device", default="cpu", help="cpu (simulated GPU) or cuda")
    ap.add_argument("--budget", default=None, help="simulated GPU budget (default: the plan's)")
    ap.add_argument("--image-size", type=int, default=None, help="override the plan")
    ap.add_argument("--chunk-size", type=int, default=20)
    ap.add_argument("--autocast", action="store_true", help="bfloat16 autocast for the policy")
    ap.add_argument("--temporal-ensemble", action="store_true")
    ap.add_argument("--margin", default="10%")
    ap.add_argument("--log", default=str(Path(tempfile.gettempdir()) / "act_dual_camera.jsonl"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    policy = ACTPolicy(chunk_size=args.chunk_size).to(args.device).eval()
    n_params = sum(p.numel() for p in policy.parameters())
    plan = memfit.plan(
        act_workload(policy, args.num_envs, args.autocast), gpu=args.gpu, margin=args.margin
    )
    planned = int(plan.knobs["image_size"])
    image_size = args.image_size or planned
    print(
        f"plan for {plan.gpu}: {args.num_envs} rollouts x 2 cameras at {planned}x{planned}, "
        f"predicted {format_bytes(plan.predicted_bytes)} of {format_bytes(plan.budget_bytes)} "
        f"(limited by {plan.binding}); policy {n_params / 1e6:.2f}M parameters"
    )
    top = sorted(plan.breakdown.items(), key=lambda kv: -kv[1])[:4]
    print("  largest terms: " + ", ".join(f"{k} {format_bytes(v)}" for k, v in top))
    budget = memfit.parse_bytes(args.budget) if args.budget else plan.budget_bytes
    # warm up (first-call costs: allocator, kernels), so neither measured rollout pays them
    warm_env = DualCameraEnv(image_size, args.device)
    with torch.inference_mode():
        warm = warm_env.render(warm_env.reset(args.num_envs, seed=args.seed))
        policy.predict_chunk(warm["main"], warm["wrist"], warm["state"])
    results = []
    for label, policy_cleanup in (
        ("every10", memfit.cleanup.every(10, gc_collect=True)),
        ("on_pressure", memfit.cleanup.on_pressure(gc_collect=True)),
    ):
        results.append(rollout(args, policy, image_size, budget, policy_cleanup, label))
    print(f"\nrollout: {args.steps} steps x {args.num_envs} envs at {image_size}x{image_size}")
    print(f"{'cleanup policy':<14} {'time s':>7} {'s/step':>7} {'cleanups':>8} {'cleanup s':>9} "
          f"{'peak':>10} {'guard ev':>8}")  # fmt: skip
    for r in results:
        peak = format_bytes(r["peak"]) if r["peak"] is not None else "n/a"
        print(
            f"{r['label']:<14} {r['seconds']:7.2f} {r['seconds'] / args.steps:7.3f} "
            f"{r['cleanups']:>8} {r['cleanup_seconds']:9.4f} {peak:>10} {r['guard_events']:>8}"
        )
    habit, pressure = results
    saved = habit["seconds"] - pressure["seconds"]
    print(
        f"on-pressure cleaned {pressure['cleanups']} times vs {habit['cleanups']} for the habit; "
        f"time in cleanups {pressure['cleanup_seconds']:.4f} s vs "
        f"{habit['cleanup_seconds']:.4f} s; "
        f"rollout {saved:+.2f} s faster"
    )
    print(f"memory logs: {habit['log']}, {pressure['log']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
