#!/usr/bin/env bash
# ctest tokenizer_reference_ids: compares `nibble prepare --tokenizer FILE` with the reference
# tokenizer libraries from PyPI (tokenizers, tiktoken, sentencepiece; transformers for the export)
# in a virtual environment of its own, BUILD/tokenizer_venv, made here on first use. Exit 77
# (SKIP_RETURN_CODE) only when that environment is missing and PyPI cannot be reached to make it.
#   run_reference.sh SOURCE_DIR BUILD_DIR NIBBLE_BINARY [PYTHON3]
set -euo pipefail
src=$1 build=$2 nibble=$3 python=${4:-python3}
venv=$build/tokenizer_venv
packages=(tokenizers tiktoken sentencepiece transformers)
if ! "$venv/bin/python" -c "import tokenizers, tiktoken, sentencepiece, transformers" 2>/dev/null; then
  if [ ! -x "$venv/bin/python" ]; then
    rm -rf "$venv"
    "$python" -m venv "$venv" ||
      { echo "FAIL: '$python -m venv' cannot make $venv (Debian: apt-get install python3-venv; make deps does)"; exit 1; }
  fi
  probe="$(mktemp -d)"
  if ! "$venv/bin/pip" download --quiet --no-deps --retries 1 --timeout 15 -d "$probe" tiktoken > "$probe/log" 2>&1; then
    echo "SKIP: $venv lacks ${packages[*]} and pip cannot reach PyPI to install them ($(tail -1 "$probe/log"));" \
         "run this test where PyPI is reachable (or make that venv by hand)"
    rm -rf "$probe"
    exit 77
  fi
  rm -rf "$probe"
  "$venv/bin/pip" install --quiet --progress-bar off "${packages[@]}"
fi
work=$build/tokenizer_reference
rm -rf "$work"
exec "$venv/bin/python" "$src/tests/tokenizers/test_reference_ids.py" "$src" "$work" "$nibble"
