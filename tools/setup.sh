#!/usr/bin/env bash
# Installs the Debian packages Strata builds, tests and trains with, only those missing.
# Needs root (or passwordless sudo); never asks a question.
set -euo pipefail

packages=(
  cmake ninja-build g++ pkg-config
  libprotobuf-dev protobuf-compiler
  libopenblas-dev libopenblas-openmp-dev
  libopenmpi-dev openmpi-bin
  nlohmann-json3-dev libcli11-dev libstb-dev
  libgtest-dev zlib1g-dev
  libxgboost-dev
  clang-format
  dataset-fashion-mnist
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
  as_root=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  as_root=(sudo -n)
else
  echo "setup: missing packages: ${missing[*]}" >&2
  echo "setup: run this script as root (or with passwordless sudo) to install them" >&2
  exit 1
fi

echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt_install() {
  "${as_root[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
}
# Try with the package lists already on the machine; refresh them only if that fails.
if ! apt_install; then
  "${as_root[@]}" apt-get update -q
  apt_install
fi
