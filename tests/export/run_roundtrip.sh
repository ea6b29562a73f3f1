#!/usr/bin/env bash
# ctest export_roundtrip: reads `nibble export` directories with independent readers (the
# safetensors, compressed-tensors and transformers PyPI packages) in a virtual environment of its
# own, BUILD/export_venv, made here on first use. Exit 77 (SKIP_RETURN_CODE) only when that
# environment is missing and PyPI cannot be reached to make it.
#   run_roundtrip.sh SOURCE_DIR BUILD_DIR NIBBLE_BINARY [PYTHON3]
set -euo pipefail
src=$1 build=$2 nibble=$3 python=${4:-python3}
venv=$build/export_venv
packages=(safetensors compressed-tensors numpy transformers torch sentencepiece protobuf)
if ! "$venv/bin/python" -c "import safetensors, compressed_tensors, numpy, transformers, torch, sentencepiece, google.protobuf" 2>/dev/null; then
  # A venv from an earlier run keeps what it has (pip skips installed packages). Made first (ensurepip
  # needs no network), so that PyPI is probed by the pip that will install, with its own TLS settings.
  if [ ! -x "$venv/bin/python" ]; then
    rm -rf "$venv"
    "$python" -m venv "$venv" ||
      { echo "FAIL: '$python -m venv' cannot make $venv (Debian: apt-get install python3-venv; make deps does)"; exit 1; }
  fi
  probe="$(mktemp -d)"
  if ! "$venv/bin/pip" download --quiet --no-deps --retries 1 --timeout 15 -d "$probe" safetensors > "$probe/log" 2>&1; then
    echo "SKIP: $venv lacks ${packages[*]} and pip cannot reach PyPI to install them ($(tail -1 "$probe/log"));" \
         "run this test where PyPI is reachable (or make that venv by hand)"
    rm -rf "$probe"
    exit 77
  fi
  rm -rf "$probe"
  if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
    # The CPU wheel index of PyTorch is tried first (a few hundred MB instead of the CUDA wheels'
    # gigabytes); where only PyPI is reachable, PyPI's torch works on a CPU as well.
    "$venv/bin/pip" install --quiet --progress-bar off --retries 0 --timeout 15 \
        --index-url https://download.pytorch.org/whl/cpu torch 2>/dev/null ||
      echo "(PyTorch's CPU wheel index is unreachable: torch comes from PyPI)"
  fi
  "$venv/bin/pip" install --quiet --progress-bar off "${packages[@]}"
fi
exec "$venv/bin/python" "$src/tests/export/test_export_roundtrip.py" "$src" "$build" "$nibble"
