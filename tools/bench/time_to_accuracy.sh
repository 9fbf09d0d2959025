#!/usr/bin/env bash
# Time to accuracy without interference (DynPipe, issue 15): the tiny CNN on Fashion-MNIST trained
# to a fixed test accuracy under 1f1b (PipeDream-Flush), async-1f1b (PipeDream) and 2bw
# (PipeDream-2BW) on the same stages, and under async-1f1b with the stage count DynPipe's planner
# chooses (`strata plan --planner dynpipe`, Algorithm 1, from a warm-up on the same data). Prints,
# per run, the first evaluation at or above the target: its step and the training seconds until
# then (evaluations excluded), and the last evaluation's accuracy. A benchmark, not a test: the
# machine's load changes the seconds (the script prints `uptime` before and after).
#
#   tools/bench/time_to_accuracy.sh [BUILD_DIR] [OUT_DIR]
#
# TARGET (0.80), STEPS (400), EVAL_EVERY (20), STAGES (2), MICRO_BATCHES (4), SCHEDULES
# ("1f1b async-1f1b 2bw"), DYNPIPE (1: also the planner's S; 0: not), DYNPIPE_EPSILON (50: the
# bound's staleness term at the training lr 0.02 is about 10 S^3 for this model).
set -euo pipefail
build=${1:-build}
out=${2:-time-to-accuracy}
target=${TARGET:-0.80}
steps=${STEPS:-400}
eval_every=${EVAL_EVERY:-20}
stages=${STAGES:-2}
micro=${MICRO_BATCHES:-4}
schedules=${SCHEDULES:-1f1b async-1f1b 2bw}
strata="$build/strata"
[[ -x $strata ]] || { echo "error: $strata not found (build first: tools/dev.sh build)" >&2; exit 1; }
mkdir -p "$out"
model=(--model cnn --size tiny --dataset fashion-mnist)
common=("${model[@]}" --batch-size 64 --micro-batches "$micro" --optimizer sgd --momentum 0.9
  --lr 0.02 --steps "$steps" --eval-every "$eval_every" --log-every "$eval_every"
  --test-samples 2000 --seed 1 --threads 1 --workers 0 --progress off)

echo "load before: $(uptime)"
runs=()
train() {  # name stages schedule
  local name=$1 s=$2 schedule=$3 layout=()
  ((s > 1)) && layout=(--stages "$s" --local)
  echo "== $name: --stages $s --schedule $schedule"
  "$strata" train "${common[@]}" "${layout[@]}" --schedule "$schedule" \
    --metrics "$out/$name.jsonl" > "$out/$name.log" 2>&1 || { tail -5 "$out/$name.log"; exit 1; }
  runs+=("$name:$s:$schedule")
}

for schedule in $schedules; do train "$schedule-s$stages" "$stages" "$schedule"; done

if [[ ${DYNPIPE:-1} == 1 ]]; then
  "$strata" profile "${model[@]}" --batch-size 16 --steps 3 --threads 1 --output "$out/profile.json" \
    > "$out/profile.log" 2>&1
  "$strata" plan "${model[@]}" --profile "$out/profile.json" --stages 4 --micro-batches "$micro" \
    --batch-size 64 --planner dynpipe --dynpipe-lr 0.02 --dynpipe-epsilon "${DYNPIPE_EPSILON:-50}" \
    --warmup-steps 8 --threads 1 > "$out/plan.log" 2>&1
  chosen=$(sed -n 's/^chosen: S = \([0-9]*\).*/\1/p' "$out/plan.log")
  [[ -n $chosen ]] || { echo "error: no 'chosen: S = ' in $out/plan.log" >&2; exit 1; }
  echo "dynpipe chose S = $chosen ($out/plan.log)"
  train "dynpipe-s$chosen" "$chosen" async-1f1b
fi
echo "load after: $(uptime)"

python3 - "$out" "$target" "${runs[@]}" <<'EOF'
import json, sys
out, target, runs = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
print(f"\ntarget: test accuracy >= {target:.2f}")
print(f"{'run':<18} {'S':>2} {'schedule':<11} {'step':>6} {'train s':>8} {'last acc':>9} {'samples/s':>10}")
for run in runs:
    name, stages, schedule = run.split(":")
    records = [json.loads(l) for l in open(f"{out}/{name}.jsonl")]
    elapsed = {r["step"]: r["elapsed_s"] for r in records if r.get("type") == "train"}
    rates = [r["samples_per_s"] for r in records if r.get("type") == "train" and "samples_per_s" in r]
    evals = [r for r in records if r.get("type") == "eval"]
    hit = next((r for r in evals if r["accuracy"] >= target), None)
    step = str(hit["step"]) if hit else "-"
    secs = f"{elapsed[hit['step']]:.1f}" if hit and hit["step"] in elapsed else "-"
    last = f"{evals[-1]['accuracy']:.4f}" if evals else "-"
    rate = f"{sorted(rates)[len(rates) // 2]:.0f}" if rates else "-"
    print(f"{name:<18} {stages:>2} {schedule:<11} {step:>6} {secs:>8} {last:>9} {rate:>10}")
EOF
