#!/usr/bin/env bash
# Usage: run_dead_rank.sh MODE MPIEXEC BINARY [MPIEXEC FLAGS...]
# Runs BINARY (mpi_dead_rank) in MODE (exit|hang) on 2 ranks; passes when mpirun exits nonzero
# within 30 s (a hang would be killed by `timeout` at 60 s, which fails the test).
set -u
mode="$1"
mpiexec="$2"
binary="$3"
shift 3
start_ns=$(date +%s%N)
timeout 60 "$mpiexec" "$@" -np 2 "$binary" "$mode"
rc=$?
elapsed_ms=$((($(date +%s%N) - start_ns) / 1000000))
echo "mpirun exited with status $rc after ${elapsed_ms} ms"
if [ "$rc" -eq 0 ]; then
  echo "FAIL: the job succeeded although rank 1 died"
  exit 1
fi
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  echo "FAIL: the job hung until timeout killed it"
  exit 1
fi
if [ "$elapsed_ms" -gt 30000 ]; then
  echo "FAIL: the job took more than 30 s to end"
  exit 1
fi
echo "PASS"
