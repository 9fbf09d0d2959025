#!/usr/bin/env bash
# Kill test of checkpoint writing: runs `strata train --checkpoint-dir D --save-every 1 --resume
# auto` RUNS times, each killed with SIGKILL after a random delay (most of a step's time is spent
# writing and fsyncing its checkpoint, so most kills land mid-write), then once more to the end.
# Checks that
#   - every run resumes from the newest complete checkpoint (the newest step-NNNNNN/ directory;
#     interrupted writes are left as step-NNNNNN.tmp/ and must be ignored), or starts fresh
#     when there is none, and never fails to load (a partial checkpoint would fail its checks);
#   - the final weights, buffers and optimizer state equal, byte for byte, those of a run that
#     was never interrupted.
#
# usage: kill_checkpoint.sh STRATA_BINARY [RUNS=20] [SEED=$RANDOM]
set -euo pipefail

strata=${1:?usage: kill_checkpoint.sh STRATA_BINARY [RUNS] [SEED]}
runs=${2:-20}
seed=${3:-$RANDOM}
RANDOM=$seed
work=$(mktemp -d "${TMPDIR:-/tmp}/strata_kill.XXXXXX")
trap 'rm -rf "$work"' EXIT
steps=150
args=(train --model mlp --size tiny --dataset synthetic-images --image-size 8 --train-samples 512
      --test-samples 32 --batch-size 16 --threads 1 --workers 0 --seed 9 --steps $steps
      --log-every 1000 --progress off)

fail() { echo "FAIL: $*"; exit 1; }

echo "kill test: $runs runs, seed $seed, $steps steps, work dir $work"
"$strata" "${args[@]}" --checkpoint-dir "$work/reference" > "$work/reference.log" 2>&1 ||
  fail "the reference run failed: $(tail -3 "$work/reference.log")"

# The newest complete checkpoint: the highest step-NNNNNN directory (no suffix).
newest() {
  local best=""
  for d in "$work/ckpt"/step-[0-9]*; do
    [[ -d $d && $(basename "$d") =~ ^step-[0-9]+$ ]] && best=$d
  done
  echo "$best"
}

mid_write=0
start=$SECONDS
for ((i = 1; i <= runs; i++)); do
  expected=$(newest)
  delay=$(printf '0.%03d' $((RANDOM % 400 + 20)))
  "$strata" "${args[@]}" --checkpoint-dir "$work/ckpt" --save-every 1 --keep-last 3 \
    --resume auto > "$work/run$i.log" 2>&1 &
  pid=$!
  sleep "$delay"
  kill -9 $pid 2> /dev/null || true
  status=0
  { wait $pid; } 2> /dev/null || status=$?
  log=$work/run$i.log
  if grep -q "resumed from" "$log"; then
    [[ -n $expected ]] || fail "run $i resumed ($(grep -o 'resumed from [^:]*' "$log")) but no checkpoint was complete"
    grep -q "resumed from $expected:" "$log" ||
      fail "run $i $(grep -o 'resumed from [^:]*' "$log"), expected $expected"
  elif grep -q "no complete checkpoint" "$log"; then
    [[ -z $expected ]] || fail "run $i started fresh although $expected is complete"
  fi
  grep -q "error:" "$work/run$i.log" && fail "run $i: $(grep error: "$work/run$i.log")"
  if ((status == 0)); then
    echo "run $i finished before its kill at ${delay}s"
    break
  fi
  ((status == 137)) || fail "run $i exited with status $status: $(tail -3 "$work/run$i.log")"
  ls -d "$work/ckpt"/*.tmp > /dev/null 2>&1 && mid_write=$((mid_write + 1))
  now=$(newest)
  echo "run $i: killed after ${delay}s; newest complete checkpoint ${now##*/}" \
       "$(ls -d "$work/ckpt"/*.tmp 2> /dev/null | xargs -r -n1 basename | sed 's/^/(partial: /; s/$/)/')"
done

expected=$(newest)
"$strata" "${args[@]}" --checkpoint-dir "$work/ckpt" --save-every 1 --keep-last 3 --resume auto \
  > "$work/final.log" 2>&1 || fail "the final run failed: $(tail -3 "$work/final.log")"
[[ -z $expected ]] || grep -q "resumed from $expected:" "$work/final.log" ||
  fail "the final run did not resume from $expected"
final=$work/ckpt/$(printf 'step-%06d' $steps)
ref=$work/reference/$(printf 'step-%06d' $steps)
n=0
for f in "$ref"/tensors/*.bin; do
  cmp -s "$f" "$final/tensors/$(basename "$f")" || fail "$(basename "$f") differs from the reference"
  n=$((n + 1))
done
((n > 0)) || fail "no tensor files in $ref"
echo "PASS: $runs kills ($mid_write left a partial checkpoint behind), every resume took the" \
     "newest complete checkpoint; final $n tensor files equal the uninterrupted run's" \
     "($((SECONDS - start)) s)"
