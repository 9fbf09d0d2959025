#!/usr/bin/env bash
# Prints the CLI's error cases (tests/tools/error_cases.txt) as a Markdown table: per case the
# command and the "error:" line of each binary given, e.g. before and after a change.
#   tools/error_table.sh /tmp/strata-before build/strata > errors.md
set -uo pipefail
cases="$(dirname "$0")/../tests/tools/error_cases.txt"
[ $# -ge 1 ] || { echo "usage: $0 STRATA [STRATA...]" >&2; exit 2; }
header="| # | command |"
rule="| --- | --- |"
for b in "$@"; do header+=" $b |"; rule+=" --- |"; done
echo "$header"
echo "$rule"
n=0
while IFS=$'\t' read -r args expect; do
  case "$args" in '#'* | '') continue ;; esac
  n=$((n + 1))
  row="| $n | \`strata $args\` |"
  for b in "$@"; do
    # The error line(s) and what follows them (a CLI11 parse error has no "error:" prefix).
    out=$(cd /tmp && timeout 60 $b $args 2>&1 </dev/null | grep -v '^\s*$' |
      grep -E -A1 '^(error|\[rank [0-9]+\] error|.*: (The following argument|[^ ]+ not in))' |
      head -n 2 | tr '\n' ' ' | sed 's/|/\\|/g; s/  */ /g')
    [ -n "$out" ] || out=$(cd /tmp && timeout 60 $b $args 2>&1 </dev/null | tail -n 1 | sed 's/|/\\|/g')
    row+=" $out |"
  done
  echo "$row"
done <"$cases"
