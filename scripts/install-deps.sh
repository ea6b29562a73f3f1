#!/usr/bin/env bash
# Installs the Debian packages nibble needs, if any is missing. Idempotent; silent when all are present.
# Installed with --no-install-recommends, so what a package only recommends but the build needs is
# listed by name (ocl-icd-opencl-dev: libdnnl-dev's CMake package looks for OpenCL). python3-venv: the
# export_roundtrip test makes a virtual environment for the PyPI readers it checks exports with, and
# ca-certificates lets Python reach PyPI over HTTPS (minbase Debian has no CA bundle).
set -euo pipefail
packages=(
  build-essential cmake pkg-config ninja-build ca-certificates
  libgtest-dev libgmock-dev libbenchmark-dev
  libfmt-dev nlohmann-json3-dev libcli11-dev
  libdnnl-dev ocl-icd-opencl-dev libopenblas-dev
  libyaml-cpp-dev libsentencepiece-dev libpcre2-dev libicu-dev libcairo2-dev libxxhash-dev
  zlib1g-dev libzstd-dev
  libopenmpi-dev openmpi-bin openssh-client
  clang libclang-rt-14-dev
  python3-numpy python3-torch python3-venv
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "install-deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
