#!/usr/bin/env bash
# Runs a CUDA test executable linked with a failing device probe (tests/engine/CMakeLists.txt)
# twice: without STRATA_REQUIRE_GPU its GPU tests skip and it passes; with STRATA_REQUIRE_GPU=1
# none of them skips, they fail, and the executable fails.
#   require_gpu.sh TEST_EXECUTABLE
set -u
exe=${1:?usage: require_gpu.sh TEST_EXECUTABLE}
fail() { echo "require_gpu.sh: $*" >&2; exit 1; }

out=$(env -u STRATA_REQUIRE_GPU "$exe" 2>&1); rc=$?
[[ $rc == 0 ]] || { echo "$out"; fail "without STRATA_REQUIRE_GPU: exit status $rc, expected 0"; }
skipped=$(grep -c '^\[  SKIPPED \] [A-Za-z].*(' <<<"$out")
[[ $skipped -gt 0 ]] || { echo "$out"; fail "without STRATA_REQUIRE_GPU: no test skipped"; }

out=$(STRATA_REQUIRE_GPU=1 "$exe" 2>&1); rc=$?
[[ $rc != 0 ]] || { echo "$out"; fail "with STRATA_REQUIRE_GPU=1: exit status 0, expected a failure"; }
grep -q '^\[  SKIPPED \] [A-Za-z]' <<<"$out" && { echo "$out"; fail "with STRATA_REQUIRE_GPU=1: a test still skipped"; }
failed=$(grep -c '^\[  FAILED  \] [A-Za-z].*(' <<<"$out")
[[ $failed == "$skipped" ]] || { echo "$out"; fail "with STRATA_REQUIRE_GPU=1: $failed tests failed, expected the $skipped that skipped without it"; }
grep -q 'STRATA_REQUIRE_GPU=1, but' <<<"$out" || { echo "$out"; fail "the failures do not say why"; }
echo "require_gpu.sh: $skipped GPU tests skip without STRATA_REQUIRE_GPU and fail with it"
