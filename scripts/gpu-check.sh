#!/usr/bin/env bash
# The one prepared check of the CUDA backend on a GPU machine that may have no network and none of
# nibble's Debian -dev packages: only a C++ compiler, CMake (ninja if present) and the CUDA toolkit.
# It builds the CUDA backend alone (-DNIBBLE_CUDA_ONLY=ON: format -> kernels/cpu without oneDNN ->
# kernels/cuda -> ops -> recipe, model and the training core, the CUDA tests, nibble_bench_cuda and
# nibble_bench_train) for the GPU present, runs every CUDA test, the GEMM benchmark (the program behind
# `nibble bench gemm --device cuda`) and the training benchmark, and writes into OUT_DIR:
#   env.txt        date, host, nvidia-smi, nvcc, cmake, compiler, GoogleTest used, cmake flags
#   configure.log  build.log  tests.log (the five test programs, one after another)  bench.log
#   train-bench.log  nibble_bench_train --device cuda (none, bf16, nvfp4) and bench/torch_train.py --device
#                  cuda on the same model, with the ratios; then the same at the GPT-2-small shape
#   profile.txt    nibble_profile_cuda: CUDA-event time per kernel kind at the bench shape and attention
#                  forward/backward at contexts 256, 1024, 2048 (compare with nibble bench train --predict)
#   summary.txt    one line per step with its exit status and seconds, each test program's verdict,
#                  and "overall: ok" or "overall: FAILED"
# GoogleTest: the sources scripts/offline-bundle.sh unpacks into .offline/googletest (carry that
# folder to the GPU machine), else Debian's /usr/src/googletest, else an installed GoogleTest.
#
# Usage:  bash scripts/gpu-check.sh [OUT_DIR]        (default ./gpu-check-out; or $OUT)
#   From this workplace's device tool, after `bash scripts/offline-bundle.sh` here:
#   run(command="NIBBLE_SOURCE_REVISION=<commit> bash scripts/gpu-check.sh $OUT", carry=[".offline"],
#       timeout_s=540): one call, eight files back; the rehearsal (scripts/rehearse-gpu-check.sh)
#   took 84 s on 2 cores up to where the GPU is needed.
# Environment: BUILD (build folder, default build-gpu), JOBS (default nproc), BENCH_SIZE (8192),
#   GPU_CHECK_DEADLINE (seconds, default 1500: later steps are cut short or skipped, named in summary.txt),
#   NIBBLE_CUDA_ARCHS (e.g. 90; default from the GPU's compute capability),
#   NIBBLE_GPU_CHECK_NO_GPU=1: a rehearsal on a machine without a GPU (scripts/rehearse-gpu-check.sh,
#   the offline_cuda_build test): GPU tests that skip and a benchmark that finds no device are
#   expected; on a GPU machine they are failures.
# Exit status: 0 when every step passed, 1 otherwise (summary.txt says which).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-${OUT:-$PWD/gpu-check-out}}"
BUILD="${BUILD:-build-gpu}"
JOBS="${JOBS:-$(nproc)}"
BENCH_SIZE="${BENCH_SIZE:-8192}"
NO_GPU="${NIBBLE_GPU_CHECK_NO_GPU:-0}"
DEADLINE="${GPU_CHECK_DEADLINE:-1500}"
mkdir -p "$OUT" || { echo "gpu-check: cannot create the output folder '$OUT'" >&2; exit 2; }
summary="$OUT/summary.txt"
: > "$summary"
started=$SECONDS
note() { echo "$*" | tee -a "$summary"; }
step() {  # step NAME TIMEOUT_SECONDS LOG COMMAND...: runs (output appended to LOG), records the status
  local name="$1" limit="$2" log="$3"
  shift 3
  # The device lease is short: no step may run past the check's own deadline (GPU_CHECK_DEADLINE
  # seconds from the start), so that a hung kernel still leaves time for summary.txt to be written.
  local left=$((DEADLINE - (SECONDS - started)))
  if [ "$left" -le 5 ]; then
    printf '%-20s rc=%-3s %4ss  %s\n' "$name" "skip" 0 "past the ${DEADLINE}s deadline (GPU_CHECK_DEADLINE)" | tee -a "$summary"
    return 124
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local start=$SECONDS
  echo "### $name: $*" >> "$log"
  timeout "$limit" "$@" >> "$log" 2>&1
  local rc=$?
  printf '%-20s rc=%-3s %4ss  %s\n' "$name" "$rc" "$((SECONDS - start))" "$(basename "$log")" | tee -a "$summary"
  return $rc
}
finish() {
  # What the device tool brings back: at most 8 plain files, named in letters, digits, . _ - only.
  local count bad
  count=$(find "$OUT" -type f | wc -l)
  bad="$(find "$OUT" -type f -printf '%f\n' | grep -vE '^[A-Za-z0-9._-]+$' || true)"
  [ "$count" -le 8 ] || { note "error: $OUT holds $count files; the device tool brings back at most 8"; set -- 1; }
  [ -z "$bad" ] || { note "error: file names the device tool does not bring back: $bad"; set -- 1; }
  note "total: $((SECONDS - started)) s"
  note "overall: $([ "$1" -eq 0 ] && echo ok || echo FAILED)"
  exit "$1"
}

# The GPU machine reaches no package registry: the GoogleTest sources travel in .offline/ (made by
# scripts/offline-bundle.sh, carried with run(..., carry=[".offline"])). Without them the check
# stops here, in its first second, instead of after a configure that fails or finds another copy;
# NIBBLE_GPU_CHECK_SYSTEM_GTEST=1 accepts Debian's or an installed GoogleTest instead.
if [ ! -f .offline/googletest/CMakeLists.txt ] && [ "${NIBBLE_GPU_CHECK_SYSTEM_GTEST:-0}" != 1 ] && [ "$NO_GPU" != 1 ]; then
  note "error: .offline/googletest is missing (.offline/ was not carried): run 'bash scripts/offline-bundle.sh' on the development machine and carry it (run(..., carry=[\".offline\"])), or set NIBBLE_GPU_CHECK_SYSTEM_GTEST=1 to use an installed GoogleTest"
  finish 1
fi

# nvcc: on PATH, else the usual toolkit folders.
for dir in "${CUDA_HOME:-}" /usr/local/cuda /opt/cuda; do
  [ -n "$dir" ] && [ -x "$dir/bin/nvcc" ] && ! command -v nvcc > /dev/null && export PATH="$dir/bin:$PATH"
done
if ! command -v nvcc > /dev/null; then
  note "error: no nvcc on PATH nor in \$CUDA_HOME/bin, /usr/local/cuda/bin, /opt/cuda/bin: install the CUDA toolkit or set CUDA_HOME"
  finish 1
fi

gtest_flags=()
gtest_used="installed (find_package)"
for src in "$PWD/.offline/googletest" /usr/src/googletest; do
  if [ -f "$src/CMakeLists.txt" ]; then
    gtest_flags=(-DNIBBLE_GTEST_SOURCE_DIR="$src")
    gtest_used="sources at $src"
    break
  fi
done

# The device machine reaches no package registry: without the carried sources nor an installed
# GoogleTest the configure step would fail minutes in; say what to carry now instead.
if [ -z "${gtest_flags[*]}" ] && ! ls /usr/lib/*/cmake/GTest /usr/lib/cmake/GTest /usr/local/lib*/cmake/GTest > /dev/null 2>&1; then
  note "error: no GoogleTest here (.offline/googletest was not carried, none installed): run 'bash scripts/offline-bundle.sh' on the development machine and carry .offline (run(..., carry=[\".offline\"]))"
  finish 1
fi
# NCCL's own warnings (bootstrap, transport) in the test logs, without its info chatter.
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"

# Only the GPU present: its compute capability, e.g. 9.0 -> 90; 10.x also builds the sm_100a/103a sources.
cc="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')"
archs="${NIBBLE_CUDA_ARCHS:-${cc:-90}}"
arch_flags=(-DNIBBLE_CUDA_ARCHS="$archs" -DNIBBLE_CUDA_SM100=OFF)
case "$cc" in
  100) arch_flags=(-DNIBBLE_CUDA_ARCHS=90 -DNIBBLE_CUDA_SM100=ON -DNIBBLE_CUDA_SM100_ARCHS=100a) ;;
  103) arch_flags=(-DNIBBLE_CUDA_ARCHS=90 -DNIBBLE_CUDA_SM100=ON -DNIBBLE_CUDA_SM100_ARCHS=103a) ;;
esac
generator=()
command -v ninja > /dev/null && generator=(-G Ninja)

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(hostname 2>/dev/null || cat /etc/hostname 2>/dev/null)  cores: $(nproc)"
  echo "source: ${NIBBLE_SOURCE_REVISION:-$(git rev-parse HEAD 2>/dev/null || echo 'not a git checkout (set NIBBLE_SOURCE_REVISION)')}"
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv 2>&1
  else
    echo "nvidia-smi: not on PATH"
  fi
  echo "nvcc: $(command -v nvcc)"; nvcc --version | tail -2
  cmake --version | head -1
  echo "c++: $(c++ --version 2>&1 | head -1)"
  echo "generator: ${generator[*]:-Unix Makefiles}"
  echo "googletest: $gtest_used"
  echo "compute capability: ${cc:-unknown (no nvidia-smi)}; cmake flags: ${arch_flags[*]}"
  [ "$NO_GPU" = 1 ] && echo "rehearsal: NIBBLE_GPU_CHECK_NO_GPU=1 (no GPU expected)"
} > "$OUT/env.txt" 2>&1

# NCCL (several GPUs): the toolkit's when it has one, else the nvidia-nccl wheel next to PyTorch.
nccl_flags=()
if [ -z "${NIBBLE_NCCL_ROOT:-}" ]; then
  NIBBLE_NCCL_ROOT="$("${PYTHON:-python3}" -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)"
fi
[ -n "${NIBBLE_NCCL_ROOT:-}" ] && nccl_flags=(-DNIBBLE_NCCL_ROOT="$NIBBLE_NCCL_ROOT")
: > "$OUT/configure.log"
step configure 300 "$OUT/configure.log" cmake -S . -B "$BUILD" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DNIBBLE_CUDA_ONLY=ON "${gtest_flags[@]}" "${arch_flags[@]}" "${nccl_flags[@]}" || { tail -30 "$OUT/configure.log"; finish 1; }
note "$(grep -m1 -o 'NCCL .*found.*' "$OUT/configure.log" || echo 'NCCL: not reported')"
: > "$OUT/build.log"
step build 600 "$OUT/build.log" cmake --build "$BUILD" -j"$JOBS" || { tail -40 "$OUT/build.log"; finish 1; }

status=0
: > "$OUT/tests.log"
for t in test_cuda_host test_cuda_quantize test_cuda_gemm test_cuda_backend test_cuda_training test_cuda_collective; do
  if [ ! -x "$BUILD/tests/$t" ]; then
    note "$t: not built (see build.log)"
    status=1
    continue
  fi
  before=$(wc -l < "$OUT/tests.log")
  step "$t" 150 "$OUT/tests.log" "$BUILD/tests/$t" || status=1
  verdicts="$(tail -n +"$((before + 1))" "$OUT/tests.log" | grep -E '^\[  (PASSED|FAILED|SKIPPED) *\] [0-9]+ test|^\[  FAILED  \] [A-Za-z]')"
  [ -n "$verdicts" ] && echo "$verdicts" | sed "s/^/  $t /" | tee -a "$summary"
done
skips=$(grep -c "skipping GPU test" "$OUT/tests.log")
if [ "$NO_GPU" = 1 ]; then
  note "GPU tests skipped: $skips (expected: no GPU in a rehearsal)"
elif [ "$skips" -gt 0 ]; then
  note "GPU tests SKIPPED on a GPU machine ($skips): $(grep -m1 'skipping GPU test' "$OUT/tests.log")"
  status=1
fi

: > "$OUT/bench.log"
step bench 600 "$OUT/bench.log" "$BUILD/nibble_bench_cuda" "$BENCH_SIZE"
bench_rc=$?
if [ "$NO_GPU" = 1 ] && [ $bench_rc -eq 2 ] && grep -q "no CUDA device" "$OUT/bench.log"; then
  note "bench: no CUDA device, as expected in a rehearsal"
elif [ $bench_rc -ne 0 ]; then
  status=1
fi
cat "$OUT/bench.log"

# The profile: each kernel kind alone, timed with CUDA events, at the bench shape; attention at three
# context lengths. Its table is what `nibble bench train --predict` is compared with, kind by kind.
: > "$OUT/profile.txt"
step profile 150 "$OUT/profile.txt" "$BUILD/nibble_profile_cuda"
profile_rc=$?
if [ "$NO_GPU" = 1 ] && [ $profile_rc -eq 2 ] && grep -q "no CUDA device" "$OUT/profile.txt"; then
  note "profile: no CUDA device, as expected in a rehearsal"
elif [ $profile_rc -ne 0 ]; then
  status=1
fi

# Training (device=cuda): nibble's recipes on the bench model, then PyTorch on the same model and GPU
# when this machine's Python has a CUDA build of it, with the ratios.
: > "$OUT/train-bench.log"
train_json="$BUILD/nibble-train-bench.json"  # kept out of OUT: the device tool brings back at most 8 files
step train-bench 300 "$OUT/train-bench.log" "$BUILD/nibble_bench_train" --device cuda --recipes none,bf16,nvfp4 \
  --json "$train_json"
train_rc=$?
if [ "$NO_GPU" = 1 ] && [ $train_rc -eq 2 ] && grep -q "no CUDA device" "$OUT/train-bench.log"; then
  note "train-bench: no CUDA device, as expected in a rehearsal"
elif [ $train_rc -ne 0 ]; then
  status=1
else
  python="${PYTHON:-python3}"
  if "$python" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" > /dev/null 2>&1; then
    step torch-train 300 "$OUT/train-bench.log" "$python" bench/torch_train.py --device cuda --modes fp32,bf16 \
      --vs-nibble "$train_json" || status=1
  else
    note "torch-train: $python has no CUDA build of PyTorch here; nibble's rates only"
  fi
fi
# The GPT-2-small shape (12 x 768, 12 heads, context 1024, batch 8, vocab 50304), where the GEMMs
# dominate: the quantized recipes with the LM head in BF16 (PyTorch's autocast runs it in BF16 too),
# then nvfp4 with nibble's default FP32 head; FP32 (none) is left out (its attention is the per-row kernel).
if [ $train_rc -eq 0 ]; then
  gpt2=(--layers 12 --width 768 --heads 12 --context 1024 --batch 8 --vocab 50304)
  gpt2_json="$BUILD/nibble-train-bench-gpt2.json"
  step train-gpt2 300 "$OUT/train-bench.log" "$BUILD/nibble_bench_train" --device cuda "${gpt2[@]}" \
    --recipes bf16,nvfp4 --set precision_map=lm_head=bf16 --json "$gpt2_json" || status=1
  step train-gpt2-fp32head 300 "$OUT/train-bench.log" "$BUILD/nibble_bench_train" --device cuda "${gpt2[@]}" \
    --recipes nvfp4 || status=1
  if [ -f "$gpt2_json" ] && "${PYTHON:-python3}" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" > /dev/null 2>&1; then
    step torch-gpt2 300 "$OUT/train-bench.log" "${PYTHON:-python3}" bench/torch_train.py --device cuda --modes fp32,bf16 \
      --vs-nibble "$gpt2_json" || status=1
  fi
fi
cat "$OUT/train-bench.log"
finish $status
