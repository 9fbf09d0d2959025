#!/usr/bin/env bash
# Fails listing the C++/CUDA sources that clang-format would change.
set -euo pipefail
clang_format="${1:-clang-format}"
mapfile -t files < <(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh' 2>/dev/null || true)
if [ ${#files[@]} -eq 0 ]; then
  mapfile -t files < <(find engine ops graph parallel io models tools tests strata.h \
    -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh')
fi
bad=()
for f in "${files[@]}"; do
  if ! "$clang_format" --dry-run -Werror "$f" >/dev/null 2>&1; then bad+=("$f"); fi
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "not clang-formatted (run: clang-format -i FILE):"
  printf '  %s\n' "${bad[@]}"
  exit 1
fi
echo "clang-format: ${#files[@]} files clean"
