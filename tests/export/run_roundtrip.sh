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
  if ! "$python" - <<'PY'
import sys, urllib.request
try:
    urllib.request.urlopen("https://pypi.org/simple/safetensors/", timeout=15).read(1)
except Exception as e:
    print(f"PyPI is unreachable ({e})", file=sys.stderr)
    sys.exit(1)
PY
  then
    echo "SKIP: $venv lacks ${packages[*]} and PyPI cannot be reached to install them;" \
         "run this test where PyPI is reachable (or make that venv by hand)"
    exit 77
  fi
  # A venv from an earlier run keeps what it has (pip skips installed packages).
  [ -x "$venv/bin/python" ] || { rm -rf "$venv"; "$python" -m venv "$venv"; }
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
