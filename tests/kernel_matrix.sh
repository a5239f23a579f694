#!/usr/bin/env bash
# The default suite (`make test`'s) under other CPU kernel paths of this machine: the tests hold on any IEEE-754
# machine, so every row must pass. Each row names the environment that picks the path: ATen's vectorised kernels
# (ATEN_CPU_CAPABILITY), oneDNN's (DNNL_MAX_CPU_ISA), MKL's (MKL_ENABLE_INSTRUCTIONS), and torch's intra-op threads
# (OMP_NUM_THREADS; the tests that pin one thread still do). A row asks for at most what the CPU has: a request above
# it falls back to the CPU's own. Usage: bash tests/kernel_matrix.sh [PYTHON] (make test-matrix).
set -uo pipefail
PY="${1:-python3}"
ROWS=(
  "native|"
  "avx2|ATEN_CPU_CAPABILITY=avx2 DNNL_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2"
  "sse4|ATEN_CPU_CAPABILITY=default DNNL_MAX_CPU_ISA=SSE41 MKL_ENABLE_INSTRUCTIONS=SSE4_2"
  "1 thread|OMP_NUM_THREADS=1"
  "2 threads|OMP_NUM_THREADS=2"
)
summary=()
failed=0
for row in "${ROWS[@]}"; do
  name="${row%%|*}"
  settings="${row#*|}"
  echo "== $name: ${settings:-(as the CPU chooses)}"
  env $settings "$PY" -c 'import torch; print("ATen", torch.backends.cpu.get_cpu_capability(), "threads", torch.get_num_threads())'
  start=$SECONDS
  env $settings "$PY" -m pytest -q -m "not slow" -n 2 --dist worksteal -p no:cacheprovider 2>&1 | tail -n 15
  status=${PIPESTATUS[0]}
  line="$name: exit $status in $((SECONDS - start)) s"
  summary+=("$line")
  echo "$line"
  [ "$status" -eq 0 ] || failed=1
done
printf '%s\n' "" "kernel matrix:" "${summary[@]}"
exit "$failed"
