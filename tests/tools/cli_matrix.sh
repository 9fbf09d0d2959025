#!/usr/bin/env bash
# One case of the CLI matrix (tests/tools/CMakeLists.txt): `strata train` run as a user runs it,
# in one process, as --local threads or under mpirun, and checked from its --metrics file.
#
# Usage: cli_matrix.sh DATA_DIR WORK_DIR CASE MODE [ARG] -- COMMAND...
#   reference      the one-process run of a family: it must train; its metrics are kept as
#                  WORK_DIR/CASE.jsonl for the layouts of that family
#   same REF       a synchronous layout: it must train, and the loss of every logged step must be
#                  that of the reference REF (WORK_DIR/REF.jsonl) to fp32 rounding (relative 1e-4:
#                  the gradient sums run in another order)
#   trains         an asynchronous layout (other weights by design): it must train
#   refuses TEXT   a layout the engine does not run: it must exit with an error that says TEXT
# "Trains" means: exit status 0, "done: N steps" for every step asked for, every logged loss
# finite, and the last step's loss below the first step's (the cases train on one fixed batch).
# Skips (status 77) when DATA_DIR (the data the command reads) does not exist.
set -u
data_dir="$1"
work_dir="$2"
case_name="$3"
mode="$4"
shift 4
arg=""
if [ "$mode" = same ] || [ "$mode" = refuses ]; then
  arg="$1"
  shift
fi
if [ "$#" -eq 0 ] || [ "$1" != "--" ]; then
  echo "usage: cli_matrix.sh DATA_DIR WORK_DIR CASE MODE [ARG] -- COMMAND..."
  exit 2
fi
shift
if [ ! -e "$data_dir" ]; then
  echo "SKIP: $data_dir does not exist"
  exit 77
fi
mkdir -p "$work_dir"
metrics="$work_dir/$case_name.jsonl"
rm -f "$metrics"
cmd=("$@" --metrics "$metrics")
echo "running: ${cmd[*]}"
output=$(timeout 300 "${cmd[@]}" 2>&1)
rc=$?
echo "$output"

if [ "$mode" = refuses ]; then
  if [ "$rc" -eq 0 ]; then
    echo "FAIL: the command ran; it should have been refused with '$arg'"
    exit 1
  fi
  if ! grep -qF -- "$arg" <<<"$output"; then
    echo "FAIL: the command failed (status $rc) without saying '$arg'"
    exit 1
  fi
  echo "PASS (refused: $arg)"
  exit 0
fi

fail() {
  echo "FAIL: $*"
  exit 1
}
[ "$rc" -eq 0 ] || fail "the command exited with status $rc"

# "step loss" per logged training step, from the JSON Lines of --metrics.
train_losses() {
  grep '"type":"train"' "$1" |
    sed -n 's/.*"loss":\([^,}]*\).*"step":\([0-9]*\).*/\2 \1/p'
}
[ -s "$metrics" ] || fail "no metrics were written to $metrics"
losses=$(train_losses "$metrics")
steps=$(grep -o -- '--steps [0-9]*' <<<"${cmd[*]}" | awk '{print $2}')
grep -qF "done: $steps steps" <<<"$output" || fail "the output lacks 'done: $steps steps'"
[ "$(wc -l <<<"$losses")" -eq "$steps" ] || fail "expected $steps logged steps, got: $losses"
awk '
  { if ($2 != $2 + 0 || $2 ~ /nan|inf/) { print "FAIL: step " $1 " has loss " $2; bad = 1 } }
  NR == 1 { first = $2 }
  { last = $2 }
  END {
    if (bad) exit 1
    if (!(last < first)) { print "FAIL: it does not train: loss " first " at the first step, " last " at the last"; exit 1 }
    print "trains: loss " first " -> " last
  }' <<<"$losses" || exit 1

if [ "$mode" = same ]; then
  reference="$work_dir/$arg.jsonl"
  [ -s "$reference" ] || fail "the reference $reference is missing (run the case $arg first)"
  join <(train_losses "$reference") <(echo "$losses") | awk -v n="$steps" '
    {
      d = $2 - $3; if (d < 0) d = -d
      m = $2 < 0 ? -$2 : $2
      if (d > 1e-4 * m) { print "FAIL: step " $1 ": loss " $3 ", the reference has " $2; bad = 1 }
      ++count
    }
    END {
      if (count != n) { print "FAIL: " count " steps in common with the reference, expected " n; exit 1 }
      if (bad) exit 1
      print "same losses as the reference over " count " steps"
    }' || exit 1
fi
echo "PASS"
