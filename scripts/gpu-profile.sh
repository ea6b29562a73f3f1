#!/usr/bin/env bash
# A closer look than gpu-check.sh's, for a GPU session that has time left after it: builds only
# nibble_profile_cuda (NIBBLE_CUDA_ONLY, .offline carried as for gpu-check), times every kernel kind
# at GPT-2 small's shape (profile-gpt2.txt), then reads the hardware counters of the kernels named in
# KERNELS (regular expressions, one ncu run each, the first launch that matches) with Nsight Compute
# at the GPU's own clocks (ncu.txt). Usage: bash scripts/gpu-profile.sh OUT_DIR
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${1:?usage: gpu-profile.sh OUT_DIR}"
BUILD="${BUILD:-build-profile}"
KERNELS="${KERNELS:-forward_kernel backward_kv_kernel backward_q_kernel rmsnorm_gain_kernel nvfp4_tile_kernel cross_entropy_forward_kernel}"
mkdir -p "$OUT"
command -v nvcc > /dev/null || export PATH=/usr/local/cuda/bin:$PATH
generator=()
command -v ninja > /dev/null && generator=(-G Ninja)
cmake -S . -B "$BUILD" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DNIBBLE_CUDA_ONLY=ON \
  -DNIBBLE_GTEST_SOURCE_DIR="$PWD/.offline/googletest" -DNIBBLE_CUDA_ARCHS=90 -DNIBBLE_CUDA_SM100=OFF > "$OUT/build.log" 2>&1 &&
  cmake --build "$BUILD" -j"$(nproc)" --target nibble_profile_cuda >> "$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }
timeout 120 "$BUILD/nibble_profile_cuda" --gpt2 > "$OUT/profile-gpt2.txt" 2>&1
echo "profile rc=$?"
ncu="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2> /dev/null | head -1)"
: > "$OUT/ncu.txt"
for k in $KERNELS; do
  echo "### $k" >> "$OUT/ncu.txt"
  timeout 90 "$ncu" --clock-control none -k "regex:$k" --launch-count 1 --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
    "$BUILD/nibble_profile_cuda" --gpt2 2>&1 | grep -v "^nibble\|^shape\|^  [a-zA-Z(].*  [0-9]" >> "$OUT/ncu.txt"
  echo "ncu $k rc=$?"
done
