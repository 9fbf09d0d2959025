#!/usr/bin/env bash
# Trains ResNet-18 (small-image stem, 1 epoch) and VGG-11-BN-small (2 epochs) on Fashion-MNIST
# and prints the test accuracy and wall time of each, for the "at least 90%" check of the models
# issue. A benchmark run, not a test: on an idle 2-core CPU about 40 + 20 minutes (ResNet-18 ~27
# samples/s, VGG-11-BN-small ~110 samples/s).
#
#   tools/bench/vision_accuracy.sh [BUILD_DIR] [OUT_DIR]
#
# MODELS="resnet18 vgg11-bn-small" (default: both), RESNET_EPOCHS (1), VGG_EPOCHS (2).
# Extra flags for `strata train` go in $STRATA_TRAIN_FLAGS (e.g. "--device cuda:0").
set -euo pipefail
build=${1:-build}
out=${2:-vision-accuracy}
models=${MODELS:-resnet18 vgg11-bn-small}
mkdir -p "$out"
strata="$build/strata"
[[ -x $strata ]] || { echo "error: $strata not found (build first: tools/dev.sh build)" >&2; exit 1; }

run() {  # name model size epochs
  local name=$1 model=$2 size=$3 epochs=$4
  local start end
  start=$(date +%s)
  # shellcheck disable=SC2086
  "$strata" train --model "$model" --size "$size" --dataset fashion-mnist --epochs "$epochs" \
    --batch-size 64 --optimizer adamw --lr 2e-3 --lr-schedule cosine --warmup-steps 50 \
    --log-every 100 --metrics "$out/$name.jsonl" ${STRATA_TRAIN_FLAGS:-} 2>&1 | tee "$out/$name.log"
  end=$(date +%s)
  echo "$((end - start))" > "$out/$name.seconds"
}

for name in $models; do
  case $name in
    resnet18) run resnet18 resnet 18 "${RESNET_EPOCHS:-1}" ;;
    vgg11-bn-small) run vgg11-bn-small vgg 11-bn-small "${VGG_EPOCHS:-2}" ;;
    *) echo "error: unknown model '$name' in MODELS (resnet18, vgg11-bn-small)" >&2; exit 1 ;;
  esac
done

printf '\n%-16s %10s %10s %12s\n' model epochs accuracy wall
for name in $models; do
  acc=$(grep -o 'test accuracy [0-9.]*%' "$out/$name.log" | tail -1 | awk '{print $3}')
  epochs=$(grep -o '^  epochs  *[0-9]*' "$out/$name.log" | awk '{print $2}')
  secs=$(cat "$out/$name.seconds")
  printf '%-16s %10s %10s %9dm%02ds\n' "$name" "${epochs:-?}" "${acc:-?}" $((secs / 60)) $((secs % 60))
done
