#!/usr/bin/env bash
# A rehearsal of scripts/gpu-check.sh, without a GPU, in the conditions of the GPU machine it is
# prepared for: no network and none of nibble's Debian -dev packages, only a C++ compiler, CMake,
# ninja and the CUDA toolkit. Run it before a session that has a GPU, so that the first real run
# does not fail on a missing header.
#   1. A Debian 12 minbase root (debootstrap) with g++, cmake and ninja-build, made once and kept
#      (ROOT, default /var/tmp/nibble-gpu-rehearsal; --fresh remakes it). This step alone needs the
#      network. The rehearsal refuses a root where any of nibble's other packages is installed.
#   2. The tree as the device tool sends it: tracked files and untracked ones git does not ignore,
#      plus the carried .offline/ (scripts/offline-bundle.sh makes it when it is missing); the
#      CUDA toolkit bind-mounted read-only at /usr/local/cuda.
#   3. `unshare -n chroot`: the network is gone (checked), then gpu-check.sh runs with
#      NIBBLE_GPU_CHECK_NO_GPU=1 up to the point where a GPU is needed: configure, build, the CUDA
#      tests (host parts pass, GPU parts skip) and the benchmark's "no CUDA device".
# Its output folder (default ./rehearsal-out) gets gpu-check.sh's files (which checks they are what the
# device tool brings back: at most 8 plain files with plain names).
# Needs root, debootstrap, unshare (util-linux) and the CUDA toolkit (CUDA_HOME, default the folder
# /usr/local/cuda points to). Exit status 0 when the rehearsal passed.
# Usage: sudo bash scripts/rehearse-gpu-check.sh [--fresh] [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
fresh=0
if [ "${1:-}" = --fresh ]; then fresh=1; shift; fi
OUT="${1:-$repo/rehearsal-out}"
ROOT="${ROOT:-/var/tmp/nibble-gpu-rehearsal}"
CUDA_HOME="$(readlink -f "${CUDA_HOME:-/usr/local/cuda}")"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
say() { echo "rehearsal: $*"; }
fail() { echo "rehearsal: FAILED: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || fail "needs root (debootstrap, mounts, unshare): sudo bash $0"
for tool in debootstrap unshare chroot git mount; do
  command -v "$tool" > /dev/null || fail "needs '$tool' (Debian: apt-get install debootstrap util-linux git mount)"
done
[ -x "$CUDA_HOME/bin/nvcc" ] || fail "no CUDA toolkit at '$CUDA_HOME' (no bin/nvcc): set CUDA_HOME"
started=$SECONDS

mounts=()
cleanup() {
  local i
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -l "${mounts[i]}" 2> /dev/null || true; done
}
trap cleanup EXIT
bind() {  # bind SOURCE TARGET [ro]
  mkdir -p "$2"
  mount --bind "$1" "$2"
  mounts+=("$2")
  [ "${3:-}" = ro ] && mount -o remount,bind,ro "$2"
  return 0
}

# 1. The root, made once: a compiler, CMake and ninja, as the GPU machine has.
if [ $fresh -eq 1 ] || [ ! -f "$ROOT/.nibble-rehearsal-root" ]; then
  say "making the root $ROOT (debootstrap minbase bookworm + g++ cmake ninja-build; a few minutes, needs the network)"
  rm -rf "$ROOT.partial"
  debootstrap --variant=minbase bookworm "$ROOT.partial" "$MIRROR" > /tmp/nibble-rehearsal-debootstrap.log 2>&1 \
    || { tail -20 /tmp/nibble-rehearsal-debootstrap.log; fail "debootstrap failed (log above)"; }
  mount -t proc proc "$ROOT.partial/proc"
  chroot "$ROOT.partial" /bin/bash -c 'export DEBIAN_FRONTEND=noninteractive; apt-get update -qq &&
      apt-get install -y -qq --no-install-recommends g++ cmake ninja-build > /dev/null && apt-get clean' \
    || { umount -l "$ROOT.partial/proc"; fail "installing g++ cmake ninja-build into the root failed"; }
  umount -l "$ROOT.partial/proc"
  touch "$ROOT.partial/.nibble-rehearsal-root"
  rm -rf "$ROOT"
  mv "$ROOT.partial" "$ROOT"
fi

# The root must lack every package nibble's full build installs, except the compiler's and CMake's.
mapfile -t nibble_packages < <(sed -n '/^packages=(/,/^)/p' scripts/install-deps.sh | tr ' ' '\n' |
  grep -E '^[a-z0-9][a-z0-9.+-]+$' | grep -vE '^(build-essential|cmake|pkg-config|ninja-build|ca-certificates)$')
present=()
for p in "${nibble_packages[@]}" googletest; do
  chroot "$ROOT" dpkg-query -W -f='${Status}' "$p" 2> /dev/null | grep -q "install ok installed" && present+=("$p")
done
[ ${#present[@]} -eq 0 ] || fail "the root $ROOT has packages the GPU machine lacks: ${present[*]} (remake it: --fresh)"
say "root $ROOT: $(chroot "$ROOT" g++ --version | head -1), $(chroot "$ROOT" cmake --version | head -1), ninja $(chroot "$ROOT" ninja --version); none of: ${nibble_packages[*]}"

# 2. The tree as it travels: tracked + untracked-not-ignored files, and the carried .offline/.
[ -f .offline/googletest/CMakeLists.txt ] || bash scripts/offline-bundle.sh .offline
tree="$ROOT/work/nibble"
rm -rf "$ROOT/work"
mkdir -p "$tree" "$ROOT/work/out"
# (--ignore-failed-read: a tracked file deleted in the working tree does not travel either.)
git ls-files -z --cached --others --exclude-standard |
  tar --null -T - --ignore-failed-read -cf - 2> /dev/null | tar -xf - -C "$tree"
tar -cf - .offline | tar -xf - -C "$tree"
size_mib=$(du -sm "$tree" | cut -f1)
say "tree: $size_mib MiB (the device tool sends at most 64)"
[ "$size_mib" -le 64 ] || fail "the tree is $size_mib MiB, over the 64 MiB that travels"

bind /dev "$ROOT/dev"
mount -t proc proc "$ROOT/proc"
mounts+=("$ROOT/proc")
bind "$CUDA_HOME" "$ROOT/usr/local/cuda" ro

# 3. No network, then the check.
jobs="$(nproc)"
set +e
unshare --net chroot "$ROOT" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  HOME=/root LANG=C.UTF-8 JOBS="$jobs" NIBBLE_GPU_CHECK_NO_GPU=1 \
  NIBBLE_SOURCE_REVISION="$(git rev-parse HEAD)$(git diff --quiet HEAD || echo ' + uncommitted changes')" /bin/bash -c '
    for target in 151.101.2.132/80 1.1.1.1/53; do
      if timeout 5 bash -c "exec 3<>/dev/tcp/$target" 2> /dev/null; then
        echo "rehearsal: FAILED: $target is reachable: the network was not removed" >&2; exit 3
      fi
    done
    echo "rehearsal: no network inside (151.101.2.132:80 and 1.1.1.1:53 unreachable)"
    cd /work/nibble && bash scripts/gpu-check.sh /work/out'
rc=$?
set -e
rm -rf "$OUT"
mkdir -p "$OUT"
cp -r "$ROOT/work/out/." "$OUT/"
[ $rc -eq 3 ] && fail "the network was reachable inside the rehearsal"

[ $rc -eq 0 ] || { cat "$OUT/summary.txt" 2> /dev/null; fail "gpu-check.sh exited $rc (its files are in $OUT)"; }
grep -q "^overall: ok" "$OUT/summary.txt" || fail "summary.txt does not say overall: ok"
cat "$OUT/summary.txt"
say "passed in $((SECONDS - started)) s: $(find "$OUT" -type f | wc -l) files in $OUT"
