#!/usr/bin/env bash
# Prepares, on a connected machine, what an offline GPU machine needs beyond its compiler, CMake and
# CUDA toolkit to build and test nibble's CUDA backend (scripts/gpu-check.sh): GoogleTest's sources,
# from Debian's `googletest` package (apt-get download, then dpkg -x; no root needed), unpacked into
# DIR/googletest with a MANIFEST naming the package, its version and its checksum. DIR (default
# .offline, ignored by git) travels with the source tree: copy the tree with it, or name it in the
# device tool's `carry`. Where apt has no package lists (a container never updated), the installed
# /usr/src/googletest is copied instead. About 2 MB.
# Usage: bash scripts/offline-bundle.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${1:-.offline}"
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
if (cd "$work" && apt-get download googletest > "$work/download.log" 2>&1); then
  deb="$(ls "$work"/googletest_*.deb)"
  dpkg -x "$deb" "$work/unpacked"
  source_dir="$work/unpacked/usr/src/googletest"
  origin="$(basename "$deb") (apt-get download), sha256 $(sha256sum "$deb" | cut -d' ' -f1)"
elif [ -f /usr/src/googletest/CMakeLists.txt ]; then
  source_dir=/usr/src/googletest
  origin="/usr/src/googletest of the installed googletest $(dpkg-query -W -f='${Version}' googletest 2>/dev/null || echo '(version unknown)') (apt-get download failed: $(tail -1 "$work/download.log"))"
else
  echo "offline-bundle: apt-get download googletest failed and /usr/src/googletest is absent:" >&2
  cat "$work/download.log" >&2
  echo "run it on a connected Debian or Ubuntu machine (after apt-get update), or install googletest" >&2
  exit 1
fi
[ -f "$source_dir/CMakeLists.txt" ] || { echo "offline-bundle: $source_dir holds no CMakeLists.txt" >&2; exit 1; }
# Into place by a rename: an interrupted run leaves the previous bundle whole.
rm -rf "$DIR/googletest.partial"
cp -r "$source_dir" "$DIR/googletest.partial"
rm -rf "$DIR/googletest"
mv "$DIR/googletest.partial" "$DIR/googletest"
{
  echo "made: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")"
  echo "googletest: $origin"
} > "$DIR/MANIFEST"
echo "offline-bundle: $DIR/googletest ($(du -sh "$DIR/googletest" | cut -f1)); $(tail -1 "$DIR/MANIFEST")"
