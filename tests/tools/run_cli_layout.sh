#!/usr/bin/env bash
# Usage: run_cli_layout.sh REQUIRED_DIR COMMAND... -- EXPECTED...
# Runs COMMAND (strata train, directly or through mpirun) and passes when it exits with status 0
# and its output contains every EXPECTED string. Skips (status 77) when REQUIRED_DIR (the data
# the command reads) does not exist.
set -u
required="$1"
shift
cmd=()
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do
  cmd+=("$1")
  shift
done
if [ "$#" -eq 0 ]; then
  echo "usage: run_cli_layout.sh REQUIRED_DIR COMMAND... -- EXPECTED..."
  exit 2
fi
shift
if [ -n "$required" ] && [ ! -d "$required" ]; then
  echo "SKIP: $required does not exist"
  exit 77
fi
echo "running: ${cmd[*]}"
output=$(timeout 120 "${cmd[@]}" 2>&1)
rc=$?
echo "$output"
if [ "$rc" -ne 0 ]; then
  echo "FAIL: the command exited with status $rc"
  exit 1
fi
for expected in "$@"; do
  if ! grep -qF -- "$expected" <<<"$output"; then
    echo "FAIL: the output lacks '$expected'"
    exit 1
  fi
done
echo "PASS"
