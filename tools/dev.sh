#!/usr/bin/env bash
# One entry point for a fresh machine:
#   tools/dev.sh train [strata train flags...]   set up, build, run the default training job
#   tools/dev.sh test                            set up, build, run every test
#   tools/dev.sh build                           set up and build only
# Environment: BUILD_DIR (default: build), JOBS (default: all cores), CMAKE_ARGS (extra flags).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build_dir="${BUILD_DIR:-build}"
jobs="${JOBS:-$(nproc)}"
command="${1:-train}"
shift || true

"$root/tools/setup.sh"

generator=()
if command -v ninja >/dev/null && [ ! -f "$build_dir/Makefile" ]; then generator=(-G Ninja); fi
# lld links the test programs several times faster than ld (setup.sh installs it).
linker=()
if command -v ld.lld >/dev/null; then
  linker=(-DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=lld -DCMAKE_SHARED_LINKER_FLAGS=-fuse-ld=lld)
fi
# shellcheck disable=SC2086
cmake -S . -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "${linker[@]}" ${CMAKE_ARGS:-}
cmake --build "$build_dir" -j "$jobs"

case "$command" in
  build) ;;
  train)
    exec "$build_dir/strata" train "$@"
    ;;
  test)
    start=$(date +%s)
    ctest --test-dir "$build_dir" --output-on-failure -j "$jobs" --timeout 900 "$@"
    echo "tests passed in $(( $(date +%s) - start ))s"
    ;;
  *)
    echo "usage: tools/dev.sh train|test|build" >&2
    exit 2
    ;;
esac
