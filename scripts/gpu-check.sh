#!/usr/bin/env bash
# The one prepared check of the CUDA backend, for a session that is lent a GPU. It configures and
# builds nibble with CUDA (only the architecture of the GPU present, to keep the build short), runs
# the CUDA tests and the CUDA benchmark, and writes every log under $OUT (default ./gpu-check-out):
#   env.txt          date, nvidia-smi, nvcc, compute capability
#   configure.log    build-cuda.log    build-tests.log
#   test_cuda_*.log  test_cuda_*.xml (gtest)
#   bench.log        nibble_bench_cuda at 8192^3 (GEMMs) and 8192x8192 (quantizers)
#   summary.txt      one line per step with its exit status
# Usage (device tool):  bash scripts/gpu-check.sh            (build + run; about 3-6 minutes on an H200)
#        bash scripts/gpu-check.sh build  then  bash scripts/gpu-check.sh run   (two calls, each under
#        the device tool's 10-minute limit; build outputs stay on a warm machine between calls)
#        BENCH_SIZE=4096 JOBS=16 bash scripts/gpu-check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
STAGE="${1:-all}"  # all | build | run
case "$STAGE" in all|build|run) ;; *) echo "usage: $0 [all|build|run]" >&2; exit 2 ;; esac
OUT="${OUT:-$PWD/gpu-check-out}"
BUILD="${BUILD:-build-gpu}"
JOBS="${JOBS:-$(nproc)}"
BENCH_SIZE="${BENCH_SIZE:-8192}"
mkdir -p "$OUT"
summary="$OUT/summary.txt"
echo "stage: $STAGE" >> "$summary"
step() {  # step NAME TIMEOUT_SECONDS LOG COMMAND...: runs, records the status, never aborts the script
  local name="$1" limit="$2" log="$3"
  shift 3
  local start=$SECONDS
  timeout "$limit" "$@" > "$log" 2>&1
  local rc=$?
  printf '%-22s rc=%-3s %4ss  %s\n' "$name" "$rc" "$((SECONDS - start))" "$log" | tee -a "$summary"
  return $rc
}

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(hostname)"
  nvidia-smi || echo "nvidia-smi failed"
  nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv || true
  (command -v nvcc || ls /usr/local/cuda/bin/nvcc) && (nvcc --version || /usr/local/cuda/bin/nvcc --version)
  cmake --version | head -1
} > "$OUT/env.txt" 2>&1

# Build only for the GPU present: 9.0 -> sm_90 (portable sources); 10.x -> also the sm_100a/103a sources.
cc="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')"
arch_flags=(-DNIBBLE_CUDA_ARCHS=90 -DNIBBLE_CUDA_SM100=OFF)
case "$cc" in
  100) arch_flags=(-DNIBBLE_CUDA_ARCHS=90 -DNIBBLE_CUDA_SM100=ON -DNIBBLE_CUDA_SM100_ARCHS=100a) ;;
  103) arch_flags=(-DNIBBLE_CUDA_ARCHS=90 -DNIBBLE_CUDA_SM100=ON -DNIBBLE_CUDA_SM100_ARCHS=103a) ;;
  "") echo "no compute capability from nvidia-smi; building for sm_90" >> "$OUT/env.txt" ;;
esac
echo "compute capability: ${cc:-unknown}; cmake flags: ${arch_flags[*]}" >> "$OUT/env.txt"
export PATH="/usr/local/cuda/bin:$PATH"

status=0
if [ "$STAGE" != run ]; then
  step configure 300 "$OUT/configure.log" \
    cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DNIBBLE_CUDA=ON -DNIBBLE_BUILD_BENCH=OFF "${arch_flags[@]}" \
    || { echo "configure failed: see configure.log" | tee -a "$summary"; exit 1; }
  # The backend and its benchmark first (they need nothing else), then the tests (which link the
  # whole CPU stack): a test build problem elsewhere in the tree does not cost the benchmark.
  step build-cuda 600 "$OUT/build-cuda.log" cmake --build "$BUILD" -j"$JOBS" --target nibble_cuda nibble_bench_cuda \
    || { echo "CUDA backend build failed: see build-cuda.log" | tee -a "$summary"; tail -40 "$OUT/build-cuda.log"; exit 1; }
  step build-tests 500 "$OUT/build-tests.log" \
    cmake --build "$BUILD" -j"$JOBS" --target test_cuda_host test_cuda_quantize test_cuda_gemm \
    || { status=1; tail -40 "$OUT/build-tests.log"; }
fi
[ "$STAGE" = build ] && { echo "overall: $([ $status -eq 0 ] && echo ok || echo FAILED)" | tee -a "$summary"; exit $status; }

if [ -x "$BUILD/tests/test_cuda_gemm" ]; then
  for t in test_cuda_host test_cuda_quantize test_cuda_gemm; do
    step "$t" 300 "$OUT/$t.log" "$BUILD/tests/$t" --gtest_output="xml:$OUT/$t.xml" || status=1
    grep -E "^\[  PASSED  \]|^\[  FAILED  \]|^\[  SKIPPED \] [0-9]+ test" "$OUT/$t.log" | head -20 | tee -a "$summary"
  done
  # On the GPU machine a skip is a failure of the check (typically a driver older than CUDA 13).
  if grep -q "skipping GPU test" "$OUT/test_cuda_quantize.log"; then
    echo "GPU tests SKIPPED: $(grep -m1 'skipping GPU test' "$OUT/test_cuda_quantize.log")" | tee -a "$summary"
    status=1
  fi
else
  echo "tests not built: see build-tests.log" | tee -a "$summary"
  status=1
fi
step bench 600 "$OUT/bench.log" "$BUILD/nibble_bench_cuda" "$BENCH_SIZE" || status=1
cat "$OUT/bench.log"
echo "overall: $([ $status -eq 0 ] && echo ok || echo FAILED)" | tee -a "$summary"
exit $status
