#!/usr/bin/env bash
# Fails listing the C++/CUDA sources that clang-format would change.
set -euo pipefail
clang_format="${1:-clang-format}"
mapfile -t files < <(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh' 2>/dev/null || true)
if [ ${#files[@]} -eq 0 ]; then
  mapfile -t files < <(find engine ops graph parallel io models tools tests strata.h \
    -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh')
fi
# Batches of files over every core first (one clang-format process per file is most of the cost);
# only a batch that fails is checked file by file, to name the files.
check_batch() {
  "$clang_format" --dry-run -Werror "$@" >/dev/null 2>&1 && return 0
  for f in "$@"; do
    if ! "$clang_format" --dry-run -Werror "$f" >/dev/null 2>&1; then echo "$f"; fi
  done
}
export -f check_batch
export clang_format
mapfile -t bad < <(printf '%s\0' "${files[@]}" |
  xargs -0 -n 40 -P "$(nproc 2>/dev/null || echo 2)" bash -c 'check_batch "$@"' _ | sort)
if [ ${#bad[@]} -gt 0 ]; then
  echo "not clang-formatted (run: clang-format -i FILE):"
  printf '  %s\n' "${bad[@]}"
  exit 1
fi
echo "clang-format: ${#files[@]} files clean"
