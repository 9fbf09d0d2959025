#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz, STRATA_FUZZ=ON with clang) if needed and runs each for
# SECONDS (default 60; `tools/fuzz.sh 600` for the 10-minute runs), then prints one line per
# target: executions per second, coverage (libFuzzer's final cov: edges and ft: features),
# corpus size and crashes.
#
#   tools/fuzz.sh [SECONDS] [TARGET...]      default: every target
#
# Environment: BUILD_DIR (default: build-fuzz), JOBS (build jobs, default: all cores), FUZZ_ARGS
# (extra libFuzzer flags, e.g. "-jobs=4 -workers=4"). Each target grows a working corpus in
# BUILD_DIR/fuzz/corpus/<target> seeded from tests/fuzz/corpus/<target> (the checked-in seeds are
# never written); crash inputs land in BUILD_DIR/fuzz/artifacts/<target>/: copy a real one to
# tests/fuzz/regressions/<target>/ with the fix, and ctest replays it from then on.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
seconds="${1:-60}"
shift || true
build_dir="${BUILD_DIR:-build-fuzz}"
jobs="${JOBS:-$(nproc)}"

all_targets=()
for f in tests/fuzz/*_fuzz.cpp; do
  name="$(basename "$f" _fuzz.cpp)"
  all_targets+=("$name")
done
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then targets=("${all_targets[@]}"); fi

if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  CC="${CC:-clang}" CXX="${CXX:-clang++}" cmake -S . -B "$build_dir" -G Ninja \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_FUZZ=ON -DSTRATA_WITH_CUDA=OFF \
    -DSTRATA_WITH_MPI=OFF >/dev/null
fi
cmake --build "$build_dir" -j "$jobs" --target "${targets[@]/%/_fuzz}"

work="$build_dir/fuzz"
summary=()
for name in "${targets[@]}"; do
  corpus="$work/corpus/$name"
  artifacts="$work/artifacts/$name/"
  log="$work/logs/$name.log"
  mkdir -p "$corpus" "$artifacts" "$(dirname "$log")"
  cp -n tests/fuzz/corpus/"$name"/* "$corpus"/ 2>/dev/null || true
  before=$(find "$artifacts" -type f | wc -l)
  echo "== $name: ${seconds}s (log: $log)"
  # shellcheck disable=SC2086
  OMP_NUM_THREADS=1 "$build_dir/tests/fuzz/${name}_fuzz" -max_total_time="$seconds" \
    -print_final_stats=1 -artifact_prefix="$artifacts" -timeout=10 ${FUZZ_ARGS:-} \
    "$corpus" "tests/fuzz/corpus/$name" >"$log" 2>&1 || true
  after=$(find "$artifacts" -type f | wc -l)
  execs=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  # The last status line libFuzzer printed: "#N  DONE  cov: X ft: Y corp: Z/..."
  status=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$status")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$status")
  corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$status")
  crashes=$((after - before))
  line=$(printf '%-20s %8s exec/s %10s runs  cov: %-6s ft: %-6s corp: %-5s crashes: %s' "$name" \
    "${execs:-?}" "${runs:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$crashes")
  if [ "$crashes" -gt 0 ]; then
    why=$(grep -m1 -E 'ERROR: |runtime error|fuzz property failed|deadly signal' "$log" || true)
    line+="  (${why:0:100};"
    line+=" inputs in $artifacts)"
  fi
  echo "$line"
  summary+=("$line")
done

echo
echo "fuzzing summary (${seconds}s per target):"
printf '%s\n' "${summary[@]}"
