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
# BUDGET: seconds for the whole script (480 by default: one command of a machine lent for a few minutes); each part
# runs in what is left of it, at most its cap, and starts only if what it needs is left (a part cut short keeps
# what it printed; `bench update` prints at its end, so it needs its whole time):
#   memory      FFM's eager associative scan, `bench memory`             cap  90 s, needs  45 s
#   tests       tests/test_cuda.py (on 4 workers where pytest-xdist is)  cap 270 s, needs  30 s
#   update      `bench update --compile`                                 cap 240 s, needs 200 s
#   efficiency  the paper's efficiency protocol (its CSV keeps trials)   the rest,  needs  20 s
# PARTS: which of them, in that order (all four by default), e.g. PARTS="update efficiency" for a second run.
# EFFICIENCY_TRIALS: the efficiency protocol's trials (the paper's 10).
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
PARTS=" ${PARTS:-memory tests update efficiency} "
declare -A status
# part NAME CAP NEED COMMAND...: COMMAND under `timeout`, in at most CAP seconds and what is left of BUDGET, if NEED
# seconds are left; its output in $LOGS/NAME.log, its exit status in status[NAME] (124: stopped by the clock).
part() {
  local name=$1 cap=$2 need=$3 left=$((BUDGET - SECONDS))
  shift 3
  if [[ "$PARTS" != *" $name "* ]]; then
    status[$name]="not asked"
  elif [ "$left" -lt "$need" ]; then
    echo "$name: skipped, $left of the $BUDGET s left and it needs $need" | tee "$LOGS/$name.log"
    status[$name]="skipped"
  else
    # Separate inductor caches: a part's first compile is a cold one.
    TORCHINDUCTOR_CACHE_DIR="$(mktemp -d)" timeout $((cap < left ? cap : left)) "$@" 2>&1 | tee "$LOGS/$name.log"
    status[$name]=${PIPESTATUS[0]}
    echo "$name: exit ${status[$name]} after $SECONDS s"
  fi
}
# FFM's associative scan run eagerly against its eager default (the log-depth scan), at the RL and the paper's
# shapes: whether one form could serve eager and compiled runs alike (bench update times it in graph replays).
part memory 90 45 python3 -m pomdp_ffm.bench memory --variants ffm ffm-assoc gru --repeats 10 \
  --csv "$LOGS/bench_memory_assoc.csv"
workers=()
python3 -c 'import xdist' 2>/dev/null && workers=(-n 4)
part tests 270 30 python3 -m pytest tests/test_cuda.py "${workers[@]}" -q -rP -p no:cacheprovider --durations=15
part update 240 200 python3 -m pomdp_ffm.bench update --compile --seeds 5 --repeats 20 \
  --csv "$LOGS/bench_update_compile.csv"
part efficiency 100000 20 python3 -m pomdp_ffm.bench efficiency --trials "${EFFICIENCY_TRIALS:-10}" \
  --csv "$LOGS/bench_efficiency.csv"
echo "memory: ${status[memory]}, tests: ${status[tests]}, update: ${status[update]}," \
  "efficiency: ${status[efficiency]} (exit statuses; $SECONDS s)"
for name in tests update; do
  case "${status[$name]}" in 0 | "not asked") ;; *) exit 1 ;; esac
done
