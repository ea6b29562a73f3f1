#!/usr/bin/env bash
# ctest offline_cuda_build: keeps scripts/gpu-check.sh and the NIBBLE_CUDA_ONLY build from rotting
# between the sessions that have a GPU (scripts/rehearse-gpu-check.sh is the full rehearsal: a root
# without network or -dev packages; this test runs in the ordinary build environment).
#   1. gpu-check.sh as the GPU machine runs it, with NIBBLE_GPU_CHECK_NO_GPU=1: configure, build,
#      the CUDA tests (host parts pass, GPU parts skip), the benchmark's "no CUDA device".
#   2. An audit of what that build used, because here every -dev package is installed and a stray
#      #include <fmt/format.h> would build and then fail on the GPU machine: every header any
#      object was compiled from (ninja -t deps) is the tree's, the build's, the CUDA toolkit's,
#      GoogleTest's sources', the compiler's, or a C library / kernel header (dpkg -S: libc6-dev,
#      linux-libc-dev, libstdc++/libgcc); every shared library the programs load (ldd) is the C and
#      C++ runtime's, OpenMP's (libgomp) or the CUDA toolkit's.
# Usage: offline_cuda_build_test.sh SOURCE_DIR WORK_DIR
set -uo pipefail
source_dir="$(readlink -f "$1")"
work="$(readlink -f "$2")"
build="$work/offline-cuda"
out="$work/offline-cuda-out"
rm -rf "$out"
command -v ninja > /dev/null || { echo "FAIL: ninja is missing (make deps installs ninja-build)"; exit 1; }

JOBS="${JOBS:-2}" BUILD="$build" NIBBLE_GPU_CHECK_NO_GPU=1 bash "$source_dir/scripts/gpu-check.sh" "$out" > "$work/offline-cuda.log" 2>&1
rc=$?
cat "$out/summary.txt" 2> /dev/null
if [ $rc -ne 0 ]; then
  echo "FAIL: scripts/gpu-check.sh exited $rc; its logs:"
  tail -40 "$out/configure.log" "$out/build.log" "$out/tests.log" 2> /dev/null
  exit 1
fi
grep -q "GPU tests skipped: [1-9]" "$out/summary.txt" || { echo "FAIL: the CUDA tests did not run their GPU parts (not even to skip)"; exit 1; }

cuda_root="$(readlink -f "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")/..")"
gtest_root="$(sed -n 's/^googletest: sources at //p' "$out/env.txt")"
allowed_roots=("$source_dir/" "$build/" "$cuda_root/" /usr/lib/gcc/ /usr/include/c++/ /usr/include/x86_64-linux-gnu/c++/)
[ -n "$gtest_root" ] && allowed_roots+=("$(readlink -f "$gtest_root")/")
allowed_packages='^(libc6-dev|linux-libc-dev|libcrypt-dev|libstdc\+\+-[0-9]+-dev|libgcc-[0-9]+-dev)(:[a-z0-9]+)?$'

# (Relative paths in ninja's log are relative to the build folder.)
mapfile -t headers < <(cd "$build" && ninja -t deps | grep -E '^    ' | sed 's/^ *//' | sort -u | xargs -r readlink -f | sort -u)
[ ${#headers[@]} -gt 100 ] || { echo "FAIL: ninja -t deps listed only ${#headers[@]} files: the audit would see nothing"; exit 1; }
outside=()
for h in "${headers[@]}"; do
  ok=0
  for root in "${allowed_roots[@]}"; do [[ "$h" == "$root"* ]] && { ok=1; break; }; done
  [ $ok -eq 0 ] && outside+=("$h")
done
bad=()
if [ ${#outside[@]} -gt 0 ]; then
  while IFS= read -r line; do
    package="${line%%: /*}" file="${line#*: }"
    IFS=', ' read -r -a owners <<< "$package"
    for owner in "${owners[@]}"; do [[ "$owner" =~ $allowed_packages ]] || bad+=("$file (from $owner)"); done
  done < <(dpkg -S "${outside[@]}" 2>&1 | sed 's/^dpkg-query: no path found matching pattern /?: /')
fi
if [ ${#bad[@]} -gt 0 ]; then
  echo "FAIL: the NIBBLE_CUDA_ONLY build read headers the GPU machine does not have:"
  printf '  %s\n' "${bad[@]}" | sort -u | head -40
  exit 1
fi

libs_bad=()
for program in "$build/nibble_bench_cuda" "$build"/tests/test_cuda_*; do
  [ -x "$program" ] || continue
  while read -r name path; do
    real="$(readlink -f "$path")"
    [[ "$real" == "$cuda_root/"* ]] && continue
    [[ "$name" =~ ^(linux-vdso|libc|libm|libmvec|libgcc_s|libstdc\+\+|libgomp|libpthread|libdl|librt|ld-linux-x86-64)\.so ]] && continue
    libs_bad+=("$(basename "$program"): $name => $real")
  done < <(ldd "$program" | sed -n 's/^\s*\(\S*\) => \(\S*\) .*/\1 \2/p; s/^\s*\(linux-vdso\S*\) .*/\1 -/p')
done
if [ ${#libs_bad[@]} -gt 0 ]; then
  echo "FAIL: the CUDA-only programs load libraries beyond the C/C++ runtime, OpenMP and the CUDA toolkit:"
  printf '  %s\n' "${libs_bad[@]}"
  exit 1
fi
echo "PASS: gpu-check.sh built and ran the CUDA backend alone; ${#headers[@]} headers audited (${#outside[@]} from libc, the kernel or the compiler), libraries: C/C++ runtime, OpenMP, CUDA toolkit"
