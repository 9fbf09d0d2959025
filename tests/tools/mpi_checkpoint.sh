#!/usr/bin/env bash
# Checkpoints under mpirun: SIGUSR1 sent to mpirun (which forwards it to every rank) stops a
# 2-stage pipeline of 2 processes after a checkpoint, exit status 0; --resume auto under mpirun
# then ends byte-equal to an uninterrupted run.
#
# usage: mpi_checkpoint.sh MPIEXEC STRATA_BINARY [MPIEXEC_FLAGS...]
# STRATA_LAYOUT (environment) replaces the layout "--stages 2" (e.g. "--groups 2 --stages 2
# --dp-delay 2": the processes are as many as groups x stages).
set -euo pipefail
mpiexec=${1:?usage: mpi_checkpoint.sh MPIEXEC STRATA_BINARY [FLAGS...]}
strata=${2:?usage: mpi_checkpoint.sh MPIEXEC STRATA_BINARY [FLAGS...]}
shift 2
work=$(mktemp -d "${TMPDIR:-/tmp}/strata_mpi_ckpt.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
read -r -a layout <<< "${STRATA_LAYOUT:---stages 2}"
groups=1 stages=1
for ((i = 0; i + 1 < ${#layout[@]}; ++i)); do
  [[ ${layout[i]} == --groups ]] && groups=${layout[i + 1]}
  [[ ${layout[i]} == --stages ]] && stages=${layout[i + 1]}
done
np=$((groups * stages))
args=(train --model mlp --size tiny --dataset synthetic-images --image-size 8 --train-samples 512
      --test-samples 32 --batch-size 16 --threads 1 --workers 0 --seed 4 "${layout[@]}"
      --micro-batches 2 --steps 400 --log-every 1 --progress off)

"$mpiexec" "$@" -np "$np" "$strata" "${args[@]}" --checkpoint-dir "$work/straight" \
  > "$work/straight.log" 2>&1 || fail "uninterrupted run: $(tail -3 "$work/straight.log")"

"$mpiexec" "$@" -np "$np" "$strata" "${args[@]}" --checkpoint-dir "$work/ckpt" --save-every 1 \
  --keep-last 2 > "$work/stopped.log" 2>&1 &
pid=$!
for _ in $(seq 600); do
  grep -q "^step 20/400" "$work/stopped.log" 2> /dev/null && break
  sleep 0.05
done
kill -USR1 $pid
status=0
wait $pid || status=$?
((status == 0)) || fail "the stopped run exited with $status: $(tail -5 "$work/stopped.log")"
grep -q "stopped at step" "$work/stopped.log" || fail "no stop: $(tail -5 "$work/stopped.log")"
stopped=$(grep -o "stopped at step [0-9]*" "$work/stopped.log" | grep -o "[0-9]*$")
((stopped < 400)) || fail "the signal came after the end"

"$mpiexec" "$@" -np "$np" "$strata" "${args[@]}" --checkpoint-dir "$work/ckpt" --resume auto \
  > "$work/resumed.log" 2>&1 || fail "resumed run: $(tail -3 "$work/resumed.log")"
grep -q "resumed at step $stopped" "$work/resumed.log" || fail "did not resume at $stopped"
for f in "$work/straight/step-000400/tensors"/*.bin; do
  cmp -s "$f" "$work/ckpt/step-000400/tensors/$(basename "$f")" || fail "$(basename "$f") differs"
done
echo "PASS ($np ranks, ${layout[*]}): stopped at step $stopped by SIGUSR1 through mpirun; resumed run equals the uninterrupted one"
