#!/usr/bin/env bash
# The GPU checks in one go, for a machine with CUDA torch: tests/test_cuda.py, then `bench update --compile`
# (docs/benchmarks.md, "The compiled update"), FFM's eager associative scan (`bench memory`), then the FFM paper's
# efficiency protocol at its sizes for every registered memory (`bench efficiency`; its CSV grows trial by trial,
# so a timeout keeps the trials done; draw it with `python -m analysis efficiency <LOGS>/bench_efficiency.csv
# --out <dir>`). Run from the repository root:
#   bash launch/gpu_check.sh
# WHEELS=<folder>: pure-Python wheels to install first where the machine has no network and lacks them
# (hydra-core, omegaconf, antlr4-python3-runtime, gymnasium, farama-notifications; made elsewhere with
# `pip wheel --no-deps -w <folder> hydra-core==1.3.8 omegaconf==2.3.1 antlr4-python3-runtime==4.9.3
# gymnasium==1.4.0 farama-notifications`). LOGS=<folder>: where the logs and the CSV go (runs/gpu-check).
# TEST_TIMEOUT, BENCH_TIMEOUT, EFFICIENCY_TIMEOUT: seconds for each part (a hang stops, the others still run);
# EFFICIENCY_TRIALS: the efficiency protocol's trials (the paper's 10 by default).
# What it decides: train.compile is off by default until its current form (fused Adam, FFM in real arithmetic)
# passes tests/test_cuda.py here and its compiled rows beat the graph rows; then `null` is the default again
# (patches/020-compiled-update.md).
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
# Separate inductor caches: the benchmark's first compile is then a cold one.
TORCHINDUCTOR_CACHE_DIR="$(mktemp -d)" timeout "${TEST_TIMEOUT:-240}" \
  python3 -m pytest tests/test_cuda.py -q -rP -p no:cacheprovider --durations=15 2>&1 | tee "$LOGS/test_cuda.log"
tests=${PIPESTATUS[0]}
TORCHINDUCTOR_CACHE_DIR="$(mktemp -d)" timeout "${BENCH_TIMEOUT:-270}" \
  python3 -m pomdp_ffm.bench update --compile --seeds 5 --repeats 20 --csv "$LOGS/bench_update_compile.csv" 2>&1 \
  | tee "$LOGS/bench_update_compile.log"
bench=${PIPESTATUS[0]}
# FFM's associative scan run eagerly against its eager default (the log-depth scan): whether one form could serve
# eager and compiled runs alike (its compiled rows are above); at the RL and the paper's shapes.
timeout 180 python3 -m pomdp_ffm.bench memory --variants ffm ffm-assoc gru --repeats 10 \
  --csv "$LOGS/bench_memory_assoc.csv" 2>&1 | tee "$LOGS/bench_memory_assoc.log"
timeout "${EFFICIENCY_TIMEOUT:-300}" python3 -m pomdp_ffm.bench efficiency --trials "${EFFICIENCY_TRIALS:-10}" \
  --csv "$LOGS/bench_efficiency.csv" 2>&1 | tee "$LOGS/bench_efficiency.log"
efficiency=${PIPESTATUS[0]}
echo "tests/test_cuda.py exit $tests, bench update --compile exit $bench, bench efficiency exit $efficiency"
[ "$tests" -eq 0 ] && [ "$bench" -eq 0 ]
