#!/usr/bin/env bash
# Trains ResNet-18 (small-image stem) and VGG-11-BN (small) on Fashion-MNIST and prints the test
# accuracy and wall time of each, for the "at least 90%" check of the models issue. A benchmark
# run, not a test: on a 2-core CPU it takes about an hour (ResNet-18 ~27 samples/s, VGG-11-small
# ~110 samples/s).
#
#   tools/bench/vision_accuracy.sh [BUILD_DIR] [OUT_DIR] [EPOCHS]
#
# Extra flags for `strata train` go in $STRATA_TRAIN_FLAGS (e.g. "--device cuda:0").
set -euo pipefail
build=${1:-build}
out=${2:-vision-accuracy}
epochs=${3:-1}
mkdir -p "$out"
strata="$build/strata"
[[ -x $strata ]] || { echo "error: $strata not found (build first: tools/dev.sh build)" >&2; exit 1; }

run() {  # name model size
  local name=$1 model=$2 size=$3
  local start end
  start=$(date +%s)
  # shellcheck disable=SC2086
  "$strata" train --model "$model" --size "$size" --dataset fashion-mnist --epochs "$epochs" \
    --batch-size 64 --optimizer adamw --lr 2e-3 --lr-schedule cosine --warmup-steps 50 \
    --log-every 100 --metrics "$out/$name.jsonl" ${STRATA_TRAIN_FLAGS:-} 2>&1 | tee "$out/$name.log"
  end=$(date +%s)
  echo "$((end - start))" > "$out/$name.seconds"
}

run resnet18 resnet 18
run vgg11-bn-small vgg 11-bn-small

printf '\n%-16s %10s %10s %12s\n' model epochs accuracy wall
for name in resnet18 vgg11-bn-small; do
  acc=$(grep -o 'test accuracy [0-9.]*%' "$out/$name.log" | tail -1 | awk '{print $3}')
  secs=$(cat "$out/$name.seconds")
  printf '%-16s %10s %10s %9dm%02ds\n' "$name" "$epochs" "${acc:-?}" $((secs / 60)) $((secs % 60))
done
