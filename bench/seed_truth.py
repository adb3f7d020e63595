"""GPU truth for the three seed systems: each run at the setting memfit plans for this GPU,
its measured peak against the plan's prediction.

    python bench/seed_truth.py                 # all three, on the local GPU (CUDA needed)
    python bench/seed_truth.py --only dqn --steps 10
    python bench/seed_truth.py --smoke         # the same code paths on a CPU, tiny settings

Each system runs in a subprocess of its own (so its allocator starts empty and XLA's settings
apply before JAX starts):

* ``brax``: Brax PPO on ``brax:humanoid`` (mjx), the bundled ``brax_humanoid_ppo`` workload
  planned for ``--gpu local`` from measurements taken on this GPU (``--measure fresh`` in a
  subprocess of its own first, then cached), run with the plan's XLA settings for two
  training steps through ``memfit.integrations.brax.train``; measured: JAX's
  ``peak_bytes_in_use`` against the plan's job buffers (its terms and slack), and whether the
  planned setting ran out of memory;
* ``dqn``: the ``dqn_fire`` example's workload (64 x 64 rasters, its Q-network) with the
  replay buffer on the GPU, planned for the local GPU; the planned buffer allocated and
  ``--steps`` updates at the planned batch; measured: torch's ``max_memory_reserved``
  against the plan less its CUDA context;
* ``act``: the ``act_dual_camera`` example's workload (its policy, two cameras, ``--envs``
  rollouts) planned for the local GPU (``image_size``); ``--steps`` rollout steps at the
  planned resolution; measured as for ``dqn``.

Writes ``bench/out/seed_truth.json`` and ``bench/out/seed_truth.md``. The goal (memfit issue
13): every prediction within 10% of the measured peak, and no planned setting out of memory.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
SYSTEMS = ("brax", "dqn", "act")


def _gpu(smoke: bool) -> str:
    return "RTX 4070" if smoke else "local"


def _result(
    system: str, plan: Any, measured: int | None, predicted: int, **extra: Any
) -> dict[str, Any]:
    error = None if not measured else (predicted - measured) / measured
    return {
        "system": system,
        "gpu": plan.gpu,
        "knobs": dict(plan.knobs),
        "predicted_bytes": predicted,
        "measured_bytes": measured,
        "error": error,
        "plan_predicted_bytes": plan.predicted_bytes,
        "environment": dict(plan.environment),
        **extra,
    }


def run_brax(args: argparse.Namespace) -> dict[str, Any]:
    import memfit
    from memfit.integrations import brax as mbrax

    workload = memfit.load_workload("brax_humanoid_ppo")
    first = memfit.plan(workload, gpu=_gpu(args.smoke), measure="recorded")  # imports no JAX
    if not args.smoke:
        os.environ.update(first.environment)  # XLA's settings, before JAX starts
    import jax
    from brax import envs

    # the measurement taken on this GPU (cached by the parent's --measure fresh run)
    measured = mbrax.measure_ppo("humanoid", backend="mjx")
    plan = memfit.plan(
        workload.model_copy(update={"measurements": measured}),
        gpu=_gpu(args.smoke),
        measure="recorded",
    )
    if plan.environment != first.environment:
        raise SystemExit(f"XLA settings changed with the measurement: {plan.environment}")
    knobs = mbrax.ppo_kwargs(plan)
    if args.smoke:  # a CPU cannot run 65536 humanoids: check the code path at a tiny setting
        knobs = {"num_envs": 8, "batch_size": 8, "num_minibatches": 2, "unroll_length": 5}

    env = envs.get_environment("humanoid", backend="mjx")
    steps = knobs["batch_size"] * knobs["num_minibatches"] * knobs["unroll_length"]
    start = time.perf_counter()
    oom = None
    try:
        mbrax.train(
            env,
            num_timesteps=2 * steps,
            episode_length=1000,
            num_evals=1,
            run_evals=False,
            num_updates_per_batch=2,
            **knobs,
        )
    except Exception as exc:  # an out-of-memory error is a result here, not a crash
        if not memfit.is_oom(exc) and "RESOURCE_EXHAUSTED" not in str(exc):
            raise
        oom = str(exc)[:300]
    stats = jax.devices()[0].memory_stats() or {}
    peak = stats.get("peak_bytes_in_use")
    breakdown = plan.breakdown
    buffers = sum(v for k, v in breakdown.items()
                  if k not in ("cuda_context", "cublas_workspace", "jax_pool_unused"))  # fmt: skip
    return _result(
        "brax",
        plan,
        int(peak) if peak is not None else None,
        buffers,
        ran_knobs=knobs,
        out_of_memory=oom,
        bytes_limit=stats.get("bytes_limit"),
        seconds=round(time.perf_counter() - start, 1),
        measured_platform=measured.provenance.platform,
        notes=plan.notes,
    )


def _torch_device(smoke: bool) -> Any:
    import torch

    if smoke:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SystemExit("seed_truth needs a CUDA GPU (or --smoke on a CPU)")
    return torch.device("cuda")


def _torch_peak(device: Any) -> int | None:
    import torch

    if device.type != "cuda":
        return None
    torch.cuda.synchronize()
    return int(torch.cuda.max_memory_reserved())


def run_dqn(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "examples" / "dqn_fire"))
    import torch
    from env import CHANNELS  # type: ignore[import-not-found]
    from model import NETWORKS  # type: ignore[import-not-found]
    from run import Replay, fire_workload  # type: ignore[import-not-found]

    import memfit

    device = _torch_device(args.smoke)
    size, network, envs = 64, "basic", 8
    workload = fire_workload(size, network, envs, 64 * 2**30, 128)
    workload = workload.model_copy(
        update={"replay": workload.replay.model_copy(update={"placement": "gpu"})}  # type: ignore[union-attr]
    )
    plan = memfit.plan(workload, gpu=_gpu(args.smoke), host_memory_bytes=64 * 2**30)
    capacity = int(plan.knobs["buffer_size"]) if not args.smoke else 1000
    batch = int(workload.settings["batch_size"])
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    replay = Replay(capacity, (len(CHANNELS), size, size), device)
    q = NETWORKS[network](len(CHANNELS), size, 5).to(device)
    target = NETWORKS[network](len(CHANNELS), size, 5).to(device)
    optimizer = torch.optim.Adam(q.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(0)
    replay.size = capacity
    for _ in range(args.steps):
        b = replay.sample(batch, gen, device)
        with torch.no_grad():
            y = b["rew"] + 0.99 * (1 - b["done"]) * target(b["next_obs"]).max(dim=1).values
        qa = q(b["obs"]).gather(1, b["act"].unsqueeze(1)).squeeze(1)
        loss = torch.nn.functional.smooth_l1_loss(qa, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    predicted = plan.predicted_bytes - plan.breakdown["cuda_context"]
    return _result("dqn", plan, _torch_peak(device), predicted, ran_capacity=capacity,
                   batch=batch, notes=plan.notes)  # fmt: skip


def run_act(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "examples" / "act_dual_camera"))
    import torch
    from env import DualCameraEnv  # type: ignore[import-not-found]
    from policy import ActionChunker, ACTPolicy  # type: ignore[import-not-found]
    from run import act_workload  # type: ignore[import-not-found]

    import memfit

    device = _torch_device(args.smoke)
    policy = ACTPolicy(chunk_size=20).to(device).eval()
    plan = memfit.plan(act_workload(policy, args.envs, False), gpu=_gpu(args.smoke))
    size = int(plan.knobs["image_size"]) if not args.smoke else 128
    env = DualCameraEnv(size, device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    chunker = ActionChunker(policy.predict_chunk, policy.chunk_size)
    state = env.reset(args.envs, seed=0)
    obs = env.render(state)
    joints, cube = state["joints"], state["cube"]
    with torch.inference_mode():
        for _ in range(args.steps):
            action = chunker.select_action(obs)
            joints, cube, main, wrist, _reward = env.step(joints, cube, action.float())
            obs = {"main": main, "wrist": wrist, "state": joints}
    predicted = plan.predicted_bytes - plan.breakdown["cuda_context"]
    return _result("act", plan, _torch_peak(device), predicted, image_size=size,
                   envs=args.envs, notes=plan.notes)  # fmt: skip


RUNNERS = {"brax": run_brax, "dqn": run_dqn, "act": run_act}


def _child(system: str, args: argparse.Namespace) -> dict[str, Any]:
    """One system in a subprocess of its own; its JSON result, or the failure."""
    command = [sys.executable, __file__, "--one", system, "--steps", str(args.steps),
               "--envs", str(args.envs)] + (["--smoke"] if args.smoke else [])  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get(
        "PYTHONPATH", "")}  # fmt: skip
    if system == "brax" and not args.smoke:
        # measure on this GPU's XLA backend first, in a process of its own (it starts JAX)
        measure = [sys.executable, "-c",
                   "import sys; from memfit.cli.main import main; sys.exit(main(sys.argv[1:]))",
                   "plan", "brax_humanoid_ppo", "--gpu", "local", "--measure", "fresh",
                   "--json"]  # fmt: skip
        subprocess.run(measure, env=env, capture_output=True, text=True, timeout=args.timeout)
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.timeout)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"system": system, "failed": True, "returncode": done.returncode,
                "stderr": done.stderr[-2000:]}  # fmt: skip
    result: dict[str, Any] = json.loads(lines[-1])
    result["wall_seconds"] = round(time.perf_counter() - start, 1)
    return result


def _markdown(rows: list[dict[str, Any]], machine: str) -> str:
    lines = [
        "# Seed systems: the plan's prediction against the measured peak",
        "",
        f"{machine}",
        "",
        "| system | GPU | knobs | predicted | measured | error | out of memory |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for r in rows:
        if r.get("failed"):
            lines.append(f"| {r['system']} | - | - | - | - | - | failed (rc {r['returncode']}) |")
            continue
        knobs = ", ".join(f"{k}={v}" for k, v in r["knobs"].items())
        measured = r["measured_bytes"]
        error = f"{r['error']:+.1%}" if r["error"] is not None else "-"
        lines.append(
            f"| {r['system']} | {r['gpu']} | {knobs} | {r['predicted_bytes'] / 2**30:.2f} GiB | "
            + (f"{measured / 2**30:.2f} GiB" if measured else "-")
            + f" | {error} | {'yes' if r.get('out_of_memory') else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=SYSTEMS, action="append")
    ap.add_argument("--one", choices=SYSTEMS, help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=20, help="updates / rollout steps to run")
    ap.add_argument("--envs", type=int, default=16, help="parallel ACT rollouts")
    ap.add_argument("--smoke", action="store_true", help="tiny settings on a CPU")
    ap.add_argument("--timeout", type=int, default=600)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(RUNNERS[args.one](args), default=str))
        return 0
    rows = [_child(system, args) for system in (args.only or SYSTEMS)]
    try:
        machine = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=False,
        ).stdout.strip() or "no nvidia-smi"  # fmt: skip
    except OSError:
        machine = "no nvidia-smi"
    OUT.mkdir(parents=True, exist_ok=True)
    stem = "seed_truth_smoke" if args.smoke else "seed_truth"
    (OUT / f"{stem}.json").write_text(
        json.dumps({"machine": machine, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "command": " ".join(sys.argv), "results": rows}, indent=2, default=str)
        + "\n",
        encoding="utf-8",
    )  # fmt: skip
    (OUT / f"{stem}.md").write_text(_markdown(rows, machine), encoding="utf-8")
    print(_markdown(rows, machine))
    failed = [r for r in rows if r.get("failed")]
    for r in failed:
        print(f"{r['system']} failed:\n{r['stderr']}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
