#!/usr/bin/env bash
# The test suite under AddressSanitizer and UndefinedBehaviorSanitizer: configures a CPU build
# with STRATA_SANITIZE=ON in BUILD_DIR (default build-asan), builds it and runs ctest there (the
# unit tests, the CLI matrix and every other CLI test), with the given ctest arguments.
#
#   tools/sanitize.sh                    everything
#   tools/sanitize.sh -L cli_matrix      the CLI matrix only
#
# Environment: BUILD_DIR, JOBS (default: all cores), CMAKE_ARGS (extra configure flags).
# A report stops the process (UBSan without recovery; AddressSanitizer always), so the test that
# ran it fails with the report in its output. Leak checking is on except for the tests that run
# mpirun (tests/CMakeLists.txt: Open MPI's unloaded plugins' allocations are not ours) and
# libraries' own allocations named in tests/sanitize/lsan.supp.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build_dir="${BUILD_DIR:-build-asan}"
jobs="${JOBS:-$(nproc)}"
generator=()
if command -v ninja >/dev/null && [ ! -f "$build_dir/Makefile" ]; then generator=(-G Ninja); fi
# lld links the ~110 test programs several times faster than ld (tools/setup.sh installs it).
linker=()
if command -v ld.lld >/dev/null; then
  linker=(-DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=lld -DCMAKE_SHARED_LINKER_FLAGS=-fuse-ld=lld)
fi
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
# shellcheck disable=SC2086
# -O1 and line tables only (-g1): what the sanitizers' reports need (file:line in every frame),
# at about half the compile and link time of -O2 -g.
cmake -S . -B "$build_dir" "${generator[@]}" "${launcher[@]}" "${linker[@]}" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
  "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" -DSTRATA_SANITIZE=ON -DSTRATA_WITH_CUDA=OFF \
  ${CMAKE_ARGS:-}
cmake --build "$build_dir" -j "$jobs"
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=0:detect_stack_use_after_return=1:strict_string_checks=1:check_initialization_order=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$root/tests/sanitize/lsan.supp:print_suppressions=0}"
start=$(date +%s)
ctest --test-dir "$build_dir" --output-on-failure -j "$jobs" --timeout 1800 "$@"
echo "sanitized tests passed in $(( $(date +%s) - start ))s"
