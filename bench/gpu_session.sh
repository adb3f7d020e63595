#!/usr/bin/env bash
# Every check that needs a CUDA GPU, in one go, for a session that has one for a few minutes.
#
#   bash bench/gpu_session.sh OUTDIR [SECONDS]
#
# Nine lanes run side by side (each check measures its own process's allocator, so they do not
# disturb each other's memory figures):
#   A: pytest tests/gpu tests/runtime/test_fit_cuda.py
#   B: python bench/accuracy.py --jobs 6
#   C: python bench/fit_search.py --cuda --quick, python bench/recorder_overhead.py, then
#      python bench/query_cost.py
#   D: python bench/gpu_truth.py --jobs 4 (the GPU truth corpus: tests/data/gpu_truth/<gpu>/;
#      entries already stored are skipped, so a second session goes on where one stopped; the
#      replay table, python bench/gpu_truth.py --report, needs no GPU: run it where the corpus
#      lands)
#   E: python bench/cuda_kernel_allocs.py (issue 29: what each CUDA kernel allocates, op by
#      op: dropout, every attention backend, cuDNN convolutions at RL sizes in fp16/fp32,
#      cuBLASLt; against what the trace assumes for this GPU)
#   F: python bench/xla_deviceless.py (issue 30: the same JAX steps compiled on the device and
#      deviceless for the same card, memory_stats() after compile and after steps)
#   G: python bench/published_rerun_jax.py (issue 30: the published JAX programs run on this
#      card, each in a fresh process, against memfit's deviceless prediction for this card)
#   H: python bench/gpu_truth.py --limit-gib 8 --jobs 2 (issue 48: the same PyTorch workloads
#      with the caching allocator capped at 8 GiB, torch.cuda.set_per_process_memory_fraction,
#      into tests/data/gpu_truth/<gpu>-limit-8gib/: cuDNN's workspaces are elastic, torch
#      skips an engine whose workspace it cannot allocate, so a small card's budget is where
#      the workspaces users meet are measured; lane D's entries are the same runs uncapped)
#   I: python bench/xla_conv_sort.py --device (issue 41: JAX convolutions and sorts of several
#      shapes, each cuDNN candidate's scratch from XLA's autotuning log and the BFC allocator's
#      log, beside memfit's deviceless figure; bench/out/xla_conv_sort_device.json)
# then, alone on the card, python bench/seed_truth.py (issue 13: the seed systems at their
# planned settings, which fill the card), then the timing benchmark, python
# bench/guard_overhead.py (its DDP part runs two gloo processes on the CPU).
# Logs go to OUTDIR/*.log and OUTDIR/logs.tar.gz, the benchmarks' own files (bench/out) to
# OUTDIR/bench_out.tar.gz and the corpus to OUTDIR/gpu_truth.tar.gz (commit
# tests/data/gpu_truth/ from the repository).
set -uo pipefail
out=${1:?usage: bash bench/gpu_session.sh OUTDIR [SECONDS]}
budget=${2:-540}
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
start=$(date +%s)
left() { echo $(( budget - ($(date +%s) - start) )); }
{ nvidia-smi; python3 -c 'import torch, jax; print(torch.__version__, torch.version.cuda, jax.__version__, jax.devices())'; } >"$out/env.log" 2>&1
lane_a() {
  # one process: the GPU tests cap and empty the one allocator (pytest-xdist would start one
  # worker per core beside the other lanes)
  timeout $(( budget / 2 )) python3 -m pytest -q -n 0 -p no:cacheprovider tests/gpu tests/runtime/test_fit_cuda.py -m "gpu" -rA
}
lane_b() { timeout $(( budget * 2 / 3 )) python3 bench/accuracy.py --jobs 6; }
lane_c() {
  timeout $(( budget / 3 )) python3 bench/fit_search.py --cuda --quick
  timeout 90 python3 bench/recorder_overhead.py --steps 300 --repeats 3 --background-seconds 5
  timeout 60 python3 bench/query_cost.py
}
lane_a >"$out/pytest_gpu.log" 2>&1 &
a=$!
lane_b >"$out/accuracy.log" 2>&1 &
b=$!
lane_d() { timeout $(( budget * 2 / 3 )) python3 bench/gpu_truth.py --jobs 4; }
lane_c >"$out/fit_recorder.log" 2>&1 &
c=$!
lane_e() { timeout $(( budget / 3 )) python3 bench/cuda_kernel_allocs.py; }
lane_e >"$out/cuda_kernel_allocs.log" 2>&1 &
e=$!
lane_d >"$out/gpu_truth.log" 2>&1 &
d=$!
lane_f() { timeout $(( budget / 2 )) python3 bench/xla_deviceless.py; }
lane_f >"$out/xla_deviceless.log" 2>&1 &
f=$!
lane_g() { timeout $(( budget * 2 / 3 )) python3 bench/published_rerun_jax.py --jobs 6 --timeout 200; }
lane_g >"$out/published_rerun_jax.log" 2>&1 &
g=$!
lane_h() { timeout $(( budget * 2 / 3 )) python3 bench/gpu_truth.py --limit-gib 8 --jobs 2; }
lane_h >"$out/gpu_truth_8gib.log" 2>&1 &
h=$!
lane_i() { timeout $(( budget / 2 )) python3 bench/xla_conv_sort.py --device; }
lane_i >"$out/xla_conv_sort.log" 2>&1 &
i=$!
wait $a; echo "pytest rc=$?" >>"$out/summary.log"
wait $b; echo "accuracy rc=$?" >>"$out/summary.log"
wait $c; echo "fit/recorder rc=$?" >>"$out/summary.log"
wait $d; echo "gpu_truth rc=$?" >>"$out/summary.log"
wait $e; echo "cuda_kernel_allocs rc=$?" >>"$out/summary.log"
wait $f; echo "xla_deviceless rc=$?" >>"$out/summary.log"
wait $g; echo "published_rerun_jax rc=$?" >>"$out/summary.log"
wait $h; echo "gpu_truth 8 GiB rc=$?" >>"$out/summary.log"
wait $i; echo "xla_conv_sort rc=$?" >>"$out/summary.log"
# --- issue 13: the seed systems at their planned settings, plan vs measured peak ------------
# (Brax humanoid mjx, DQN fire rasters, ACT dual camera; writes bench/out/seed_truth.{json,md})
t=$(left)
if [ "$t" -gt 120 ]; then
  timeout $(( t - 20 )) python3 bench/seed_truth.py --timeout $(( t - 30 )) >"$out/seed_truth.log" 2>&1
  echo "seed_truth rc=$?" >>"$out/summary.log"
fi
# --- end of issue 13 block ----------------------------------------------------------------------
t=$(left)
if [ "$t" -gt 60 ]; then
  timeout $(( t - 15 )) python3 bench/guard_overhead.py >"$out/guard_overhead.log" 2>&1
  echo "guard_overhead rc=$?" >>"$out/summary.log"
fi
(cd "$out" && tar czf logs.tar.gz ./*.log)
tar czf "$out/bench_out.tar.gz" bench/out 2>/dev/null
tar czf "$out/gpu_truth.tar.gz" tests/data/gpu_truth 2>/dev/null
cat "$out/summary.log"
