#!/usr/bin/env bash
# Builds each CUDA mutant (tests/CMakeLists.txt, nibble_cuda_mutant) and runs test_cuda_model's tests
# on it: every mutant must fail at least one test. Prints, per mutant, how many tests caught it and
# which. Usage: run_mutants.sh PROJECT_BINARY_DIR TESTS_BINARY_DIR NAME:SOURCE... (or stale:NAME:SOURCE)
# A mutant runs the suites that can reach its source file: the slowest suites of the other kernels
# are left out (the layers' mutants skip the quantize and GEMM suites, the quantize and GEMM mutants
# the layers' and attention suites; releasable memory's run its own tests only), which halves the run of each.
set -u
build_dir=$1 tests_dir=$2
shift 2
missed=0
for name in "$@"; do
  if [[ $name == stale:* ]]; then  # stale:NAME:SOURCE
    IFS=: read -r _ mutant source <<<"$name"
    echo "mutant $mutant: STALE: its site no longer occurs exactly once in src/kernels/cuda/$source; update its nibble_cuda_mutant line in tests/CMakeLists.txt"
    missed=1
    continue
  fi
  IFS=: read -r name source <<<"$name"
  case $source in
    layers.cu | flash_attention.cuh | attention_fp32.cuh) filter='-CudaModelQuantize.*:CudaQuantize.*:CudaModelGemm.*' ;;
    releasable_memory.cpp) filter='CudaModelReleasable.*' ;;  # the only tests that reach it
    *) filter='-CudaModelLayers.*:CudaModelExpLayers.*:CudaModelFlash.*' ;;
  esac
  target=test_cuda_model_mutant_$name
  if ! cmake --build "$build_dir" --target "$target" -j2 >"$tests_dir/$target.build.log" 2>&1; then
    echo "mutant $name: FAILED TO BUILD (see $tests_dir/$target.build.log)"
    missed=1
    continue
  fi
  log=$tests_dir/$target.log
  "$tests_dir/$target" --gtest_brief=1 --gtest_filter="$filter" >"$log" 2>&1
  status=$?
  caught=$(grep -c '^\[  FAILED  \] [A-Za-z]' "$log")
  if [ "$status" -eq 0 ]; then
    echo "mutant $name: NOT CAUGHT (every test passed)"
    missed=1
  elif [ "$caught" -eq 0 ]; then
    echo "mutant $name: caught (the test binary died with status $status: $(tail -n 1 "$log"))"
  else
    echo "mutant $name: caught by $caught tests: $(grep '^\[  FAILED  \] [A-Za-z]' "$log" | sed 's/^\[  FAILED  \] //; s/ (.*//' | sort -u | tr '\n' ' ')"
  fi
done
exit $missed
