#!/usr/bin/env bash
# The GPU checks in one go, for a machine with CUDA torch: FFM's eager associative scan (`bench memory`),
# tests/test_cuda.py, `bench update --compile` (docs/benchmarks.md, "The compiled update"), then the FFM paper's
# efficiency protocol at its sizes for every registered memory (`bench efficiency`; its CSV grows trial by trial,
# so a timeout keeps the trials done; draw it with `python -m analysis efficiency <LOGS>/bench_efficiency.csv
# --out <dir>`). Run from the repository root:
#   bash launch/gpu_check.sh
# What it decides: train.compile is off by default until its current form (fused Adam, FFM in real arithmetic)
# passes tests/test_cuda.py here and its compiled rows beat the graph rows; then `null` is the default again
# (patches/020-compiled-update.md). And whether FFM's associative scan, run eagerly, is as fast as the log-depth
# scan, so that one form could serve eager and compiled runs on CUDA (seq_models/ffm.py, `resolved_aggregator`).
# WHEELS=<folder>: pure-Python wheels to install first where the machine has no network and lacks them
# (hydra-core, omegaconf, antlr4-python3-runtime, gymnasium, farama-notifications; made elsewhere with
# `pip wheel --no-deps -w <folder> hydra-core==1.3.8 omegaconf==2.3.1 antlr4-python3-runtime==4.9.3
# gymnasium==1.4.0 farama-notifications`). LOGS=<folder>: where the logs and the CSV go (runs/gpu-check).
# BUDGET: seconds for the whole script (480 by default: one command of a machine lent for a few minutes, with room
# to run it again); each part runs in what is left of it, at most its own cap, in the order of what it decides:
# FFM's eager associative scan (`bench memory`, 90 s), tests/test_cuda.py (270 s; on 4 workers where pytest-xdist is
# installed: its wheels, pytest-xdist and execnet, go in WHEELS too), `bench update --compile` (120 s), then the
# efficiency protocol in the rest (its CSV keeps the trials done). EFFICIENCY_TRIALS: its trials (the paper's 10).
set -uo pipefail
LOGS="${LOGS:-runs/gpu-check}"
mkdir -p "$LOGS"
if [ -n "${WHEELS:-}" ]; then
  site="$(mktemp -d)"
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$WHEELS"/*.whl || exit 1
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$LOGS/device.txt"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' | tee -a "$LOGS/device.txt"
BUDGET="${BUDGET:-480}"
# part NAME CAP COMMAND...: COMMAND under `timeout`, in at most CAP seconds and what is left of BUDGET; its output
# in $LOGS/NAME.log; its exit status in $status (124: stopped by the clock; skipped when under 20 s are left).
part() {
  local name=$1 cap=$2 left=$((BUDGET - SECONDS))
  shift 2
  if [ "$left" -lt 20 ]; then
    echo "$name: skipped, the budget of $BUDGET s is spent" | tee "$LOGS/$name.log"
    status=124
    return
  fi
  # Separate inductor caches: a part's first compile is a cold one.
  TORCHINDUCTOR_CACHE_DIR="$(mktemp -d)" timeout $((cap < left ? cap : left)) "$@" 2>&1 | tee "$LOGS/$name.log"
  status=${PIPESTATUS[0]}
  echo "$name: exit $status after $SECONDS s"
}
# FFM's associative scan run eagerly against its eager default (the log-depth scan), at the RL and the paper's
# shapes: whether one form could serve eager and compiled runs alike (its compiled rows come from bench update).
part bench_memory_assoc 90 python3 -m pomdp_ffm.bench memory --variants ffm ffm-assoc gru --repeats 10 \
  --csv "$LOGS/bench_memory_assoc.csv"
memory=$status
workers=()
python3 -c 'import xdist' 2>/dev/null && workers=(-n 4)
part test_cuda 270 python3 -m pytest tests/test_cuda.py "${workers[@]}" -q -rP -p no:cacheprovider --durations=15
tests=$status
part bench_update_compile 120 python3 -m pomdp_ffm.bench update --compile --seeds 5 --repeats 20 \
  --csv "$LOGS/bench_update_compile.csv"
bench=$status
part bench_efficiency 600 python3 -m pomdp_ffm.bench efficiency --trials "${EFFICIENCY_TRIALS:-10}" \
  --csv "$LOGS/bench_efficiency.csv"
efficiency=$status
echo "bench memory exit $memory, tests/test_cuda.py exit $tests, bench update --compile exit $bench," \
  "bench efficiency exit $efficiency ($SECONDS s)"
[ "$tests" -eq 0 ] && [ "$bench" -eq 0 ]
