#!/usr/bin/env bash
# The GPU check: one command on a machine with an NVIDIA GPU, from the project's root.
#
#   tools/gpu/check.sh                         # the machine's own CUDA, cuDNN, NCCL and packages
#   tools/gpu/check.sh --kit-prefix /opt/deps  # build dependencies from the device kit
#                                              # (../shared/device/README.md; unpacked first from
#                                              # .devkit/debs, or --kit-debs DIR, when the prefix
#                                              # is empty; the kit script: .devkit/kit or --kit)
#
# In order, each step printed as it runs and logged under --out:
#   1. libraries: finds the CUDA driver, cudart, cuBLAS, cuBLASLt, cuDNN (and the sub-libraries it
#      loads at run time) and NCCL, in the CUDA toolkit, CUDNN_ROOT / NCCL_ROOT, the Python wheels
#      (nvidia-cudnn-cu13, nvidia-nccl-cu13: their directories join LD_LIBRARY_PATH and the CMake
#      hints, so the build's RPATH holds them) or the loader's cache, and checks with ldd that
#      every one of their dependencies resolves;
#   2. GPU: a probe built with nvcc asks the CUDA runtime for the devices (the check stops here,
#      exit status 3, where there is none: no driver, a broken one, or no device);
#   3. build: configures --build-dir for the local GPUs' architectures with CUDA, cuDNN and NCCL
#      required, builds, and checks with ldd that the binaries resolve every library;
#   4. tests: every test (ctest) with STRATA_REQUIRE_GPU=1, so a CUDA test that cannot reach the
#      GPU fails instead of skipping; each CUDA test's result is listed;
#   5. benchmarks: `strata bench --device cuda:0` (the op roofline table), GPT-2 124M and
#      ResNet-50 in bf16 and tf32 (`strata bench --model`), and tools/bench/compare_pytorch.py
#      (PyTorch eager and torch.compile beside Strata) where torch is importable, and interference
#      on the GPU: GPT-2 124M on 2 local ranks of cuda:0, rank 1 loaded by stress kernels
#      (--inject kind=load, engine/gpu_stress.h) from step 20, static against --repartition vpipe
#      (samples/s over steps 40-80 of each; on one GPU both local ranks share the loaded device,
#      so this measures the load's cost and that vpipe's moves do no harm: moving layers away
#      from a load needs a GPU per rank);
#   6. one short table of all of it.
# Exit status: 0 when everything passed, 1 when a step failed, 2 on a bad command line, 3 when
# there is no usable GPU.
set -uo pipefail

usage() { sed -n '2,32p' "$0"; }
kit_prefix="" kit="" kit_debs=".devkit/debs" build_dir="build-gpu" out="" jobs="" bench=1 pytorch=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --kit-prefix) kit_prefix=${2:?--kit-prefix needs a directory}; shift 2;;
    --kit) kit=${2:?--kit needs the kit script}; shift 2;;
    --kit-debs) kit_debs=${2:?--kit-debs needs a directory}; shift 2;;
    --build-dir) build_dir=${2:?--build-dir needs a directory}; shift 2;;
    --out) out=${2:?--out needs a directory}; shift 2;;
    --jobs) jobs=${2:?--jobs needs a number}; shift 2;;
    --skip-bench) bench=0; shift;;
    --skip-pytorch) pytorch=0; shift;;
    -h|--help) usage; exit 0;;
    *) echo "check.sh: unknown argument '$1'" >&2; usage >&2; exit 2;;
  esac
done
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root" || exit 2
out=${out:-$build_dir/gpu-check}
mkdir -p "$out" && out=$(cd "$out" && pwd)
jobs=${jobs:-$(nproc 2>/dev/null || echo 4)}
summary=()  # "step|status|detail"
failed=0
note() {
  summary+=("$1|$2|$3")
  if [[ $2 == FAIL ]]; then failed=1; fi
  return 0
}
step() { printf '\n== %s\n' "$*"; }
print_summary() {
  printf '\n== summary (logs in %s)\n' "$out"
  printf '%-34s %-6s %s\n' "step" "status" "detail"
  for row in "${summary[@]}"; do
    IFS='|' read -r a b c <<<"$row"
    printf '%-34s %-6s %s\n' "$a" "$b" "$c"
  done
}

# ---- 0. environment (the device kit first, when asked) --------------------------------------------
step "environment"
if [[ -n $kit_prefix ]]; then
  if [[ -z $kit ]]; then
    for k in .devkit/kit ../shared/device/kit; do [[ -x $k ]] && { kit=$k; break; }; done
  fi
  [[ -x $kit ]] || { echo "--kit-prefix: no kit script (.devkit/kit, ../shared/device/kit; or --kit PATH)"; exit 2; }
  if [[ ! -d $kit_prefix/usr && -d $kit_debs ]]; then
    "$kit" unpack "$kit_debs" "$kit_prefix" >/dev/null || { echo "kit unpack into $kit_prefix failed"; exit 1; }
    echo "device kit: unpacked $kit_debs into $kit_prefix"
  fi
  [[ -d $kit_prefix/usr ]] || { echo "--kit-prefix $kit_prefix holds no kit (and $kit_debs has no .deb files to unpack)"; exit 2; }
  eval "$("$kit" env "$kit_prefix")" || { echo "kit env $kit_prefix failed"; exit 1; }
  echo "device kit: $kit env $kit_prefix"
  note "device kit" ok "$kit_prefix"
fi
echo "host: $(uname -n), $(uname -sr), $(nproc) cores"
nvcc_bin=$(command -v nvcc || true)
[[ -z $nvcc_bin && -x /usr/local/cuda/bin/nvcc ]] && nvcc_bin=/usr/local/cuda/bin/nvcc
cuda_root=${CUDA_HOME:-${CUDA_PATH:-}}
[[ -z $cuda_root && -n $nvcc_bin ]] && cuda_root=$(cd "$(dirname "$(readlink -f "$nvcc_bin")")/.." && pwd)
echo "nvcc: ${nvcc_bin:-not found} $([[ -n $nvcc_bin ]] && "$nvcc_bin" --version | grep -o 'release [0-9.]*')"
echo "CUDA toolkit: ${cuda_root:-not found}"
echo "cmake: $(cmake --version 2>/dev/null | head -1 || echo 'not found'); ninja: $(ninja --version 2>/dev/null || echo 'not found')"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/nvidia-smi: /'
else
  echo "nvidia-smi: not found"
fi
python=$(command -v python3 || true)
echo "python3: ${python:-not found}"

# ---- 1. libraries ----------------------------------------------------------------------------------
step "libraries (found where, and whether ldd resolves every dependency)"
dirs=()
add_dir() { [[ -n $1 && -d $1 ]] && dirs+=("$(cd "$1" && pwd)"); }
for d in "$cuda_root/lib64" "$cuda_root/lib" "$cuda_root/targets/$(uname -m)-linux/lib"; do add_dir "$d"; done
# cuDNN and NCCL (and the CUDA libraries) inside Python wheels.
if [[ -n $python ]]; then
  for pkg in cudnn nccl cublas cuda_runtime; do
    d=$("$python" -c "import nvidia.$pkg, os; print(os.path.dirname(nvidia.$pkg.__file__) if nvidia.$pkg.__file__ else list(nvidia.$pkg.__path__)[0])" 2>/dev/null || true)
    if [[ -n $d && -d $d/lib ]]; then
      add_dir "$d/lib"
      echo "wheel nvidia.$pkg: $d"
      [[ $pkg == cudnn && -z ${CUDNN_ROOT:-} ]] && export CUDNN_ROOT=$d
      [[ $pkg == nccl && -z ${NCCL_ROOT:-} ]] && export NCCL_ROOT=$d
    fi
  done
fi
for d in "${CUDNN_ROOT:-}" "${NCCL_ROOT:-}"; do [[ -n $d ]] && { add_dir "$d/lib"; add_dir "$d/lib64"; }; done
IFS=: read -r -a ld_dirs <<<"${LD_LIBRARY_PATH:-}"
for d in "${ld_dirs[@]}"; do add_dir "$d"; done
for d in /usr/lib/$(uname -m)-linux-gnu /usr/lib64 /usr/lib/wsl/lib; do add_dir "$d"; done
search=$(printf '%s:' "${dirs[@]}")
export LD_LIBRARY_PATH="${search%:}"
echo "search path: ${LD_LIBRARY_PATH}"

# The first file matching a glob in the search directories, else in the loader's cache.
find_lib() {
  local d f
  for d in "${dirs[@]}"; do
    for f in "$d"/$1; do [[ -e $f ]] && { echo "$f"; return; }; done
  done
  ldconfig -p 2>/dev/null | awk -v pat="$1" '{ if ($1 ~ pat) { print $NF; exit } }'
}
# Checks one library with ldd; prints a line and records it.
check_lib() {
  local what=$1 glob=$2 required=$3 path missing deps
  path=$(find_lib "$glob")
  if [[ -z $path ]]; then
    printf '  %-22s not found (%s)\n' "$what" "$glob"
    [[ $required == yes ]] && note "lib $what" FAIL "not found" || note "lib $what" skip "not found"
    return 1
  fi
  deps=$(ldd "$path" 2>&1)
  missing=$(grep 'not found' <<<"$deps" | awk '{print $1}' | tr '\n' ' ')
  if [[ -n $missing ]]; then
    printf '  %-22s %s: UNRESOLVED %s\n' "$what" "$path" "$missing"
    note "lib $what" FAIL "$path: unresolved $missing"
    return 1
  fi
  printf '  %-22s %s (ldd: %d dependencies resolve)\n' "$what" "$path" "$(grep -c '=>' <<<"$deps")"
  note "lib $what" ok "$path"
  return 0
}
check_lib "driver libcuda" "libcuda.so.1" yes; have_driver=$?
check_lib "cudart" "libcudart.so.[0-9]*" yes
check_lib "cuBLAS" "libcublas.so.[0-9]*" yes
check_lib "cuBLASLt" "libcublasLt.so.[0-9]*" yes
if check_lib "cuDNN" "libcudnn.so.[0-9]*" yes; then
  cudnn_dir=$(dirname "$(find_lib 'libcudnn.so.[0-9]*')")
  for sub in "$cudnn_dir"/libcudnn_*.so.[0-9]*; do  # loaded by cuDNN at run time
    [[ -e $sub ]] || continue
    check_lib "  $(basename "$sub" | sed 's/\.so.*//')" "$(basename "$sub")" yes
  done
fi
check_lib "NCCL" "libnccl.so.[0-9]*" yes; have_nccl=$?

# ---- 2. GPU ----------------------------------------------------------------------------------------
step "GPU (what the CUDA runtime sees)"
if [[ -z $nvcc_bin ]]; then
  echo "no nvcc: the CUDA toolkit is needed to build"; note "GPU" FAIL "no nvcc"; print_summary; exit 1
fi
probe_log="$out/probe.txt"
if ! "$nvcc_bin" -o "$out/probe" tools/gpu/probe.cu -cudart shared >"$out/probe-build.txt" 2>&1; then
  cat "$out/probe-build.txt"; note "GPU" FAIL "the probe does not build"; print_summary; exit 1
fi
"$out/probe" >"$probe_log" 2>&1; probe_status=$?
sed 's/^/  /' "$probe_log"
if [[ $probe_status != 0 ]]; then
  reason=$(grep -m1 '^no GPU' "$probe_log" || echo "the probe failed (exit $probe_status)")
  [[ $have_driver != 0 ]] && reason="$reason (no libcuda.so.1: no NVIDIA driver here)"
  echo "$reason"
  note "GPU" FAIL "$reason"
  print_summary
  exit 3
fi
archs=$(grep -o 'sm_[0-9]*' "$probe_log" | sed 's/sm_//' | sort -u | paste -sd';')
gpu_name=$(grep -m1 '^cuda:0' "$probe_log" | sed 's/^cuda:0 //; s/,.*//')
note "GPU" ok "$(grep -c '^cuda:' "$probe_log") device(s): $gpu_name, sm_$archs"

# ---- 3. build ---------------------------------------------------------------------------------------
step "build ($build_dir, CUDA architectures $archs)"
cmake_args=(-S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DSTRATA_WITH_CUDA=ON
  "-DCMAKE_CUDA_ARCHITECTURES=$archs" "-DCMAKE_CUDA_COMPILER=$nvcc_bin")
command -v ninja >/dev/null && cmake_args+=(-G Ninja)
[[ $have_nccl == 0 ]] && cmake_args+=(-DSTRATA_WITH_NCCL=ON)
if command -v ccache >/dev/null; then
  cmake_args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache
    -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
if cmake "${cmake_args[@]}" >"$out/configure.txt" 2>&1 &&
   cmake --build "$build_dir" -j "$jobs" >"$out/build.txt" 2>&1; then
  config=$(grep -m1 'Strata .*CUDA=' "$out/configure.txt" | sed 's/^-- //')
  echo "$config"
  grep -q 'cuDNN=ON' <<<"$config" || note "build" FAIL "built without cuDNN: $config"
  note "build" ok "${config#Strata }"
else
  tail -30 "$out/configure.txt" "$out/build.txt" 2>/dev/null
  note "build" FAIL "see $out/configure.txt, $out/build.txt"; print_summary; exit 1
fi
unresolved=""
for f in "$build_dir/strata" "$build_dir"/tests/*/test_*; do
  [[ -x $f && -f $f ]] || continue
  m=$(ldd "$f" 2>&1 | grep 'not found' | awk '{print $1}' | tr '\n' ' ')
  [[ -n $m ]] && unresolved+="$(basename "$f"): $m; "
done
ldd "$build_dir/strata" | grep -E 'libcuda|libcudart|libcublas|libcudnn|libnccl' | sed 's/^\s*/  strata: /'
echo "  strata: cuBLAS and cuBLASLt are opened when the first CUDA context is made (engine/cublas_lazy.h), not listed by ldd"
if [[ -n $unresolved ]]; then
  echo "unresolved: $unresolved"; note "ldd binaries" FAIL "$unresolved"
else
  note "ldd binaries" ok "strata and every test resolve their libraries"
fi

# ---- 4. tests ---------------------------------------------------------------------------------------
step "tests (STRATA_REQUIRE_GPU=1: a CUDA test without the GPU fails)"
STRATA_REQUIRE_GPU=1 ctest --test-dir "$build_dir" -j "$jobs" --timeout 900 --output-on-failure \
  >"$out/ctest.txt" 2>&1
tail -4 "$out/ctest.txt"
grep -E 'Test +#[0-9]+: .*(Cuda|cuda|Nccl|nccl|require_gpu|Uploader)' "$out/ctest.txt" |
  sed -E 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: //' >"$out/cuda-tests.txt"
echo "CUDA tests ($(wc -l <"$out/cuda-tests.txt")):"
sed 's/^/  /' "$out/cuda-tests.txt"
tests_line=$(grep -E 'tests passed, [0-9]+ tests failed' "$out/ctest.txt" | tail -1)
cuda_passed=$(grep -c 'Passed' "$out/cuda-tests.txt")
cuda_total=$(wc -l <"$out/cuda-tests.txt")
if grep -q ' 0 tests failed' <<<"$tests_line"; then
  note "tests" ok "$tests_line; CUDA tests $cuda_passed/$cuda_total passed"
else
  note "tests" FAIL "${tests_line:-ctest did not finish}; CUDA tests $cuda_passed/$cuda_total passed"
fi

# ---- 5. benchmarks ----------------------------------------------------------------------------------
if [[ $bench == 1 ]]; then
  strata="$build_dir/strata"
  step "op benchmarks against the roofline (strata bench --device cuda:0)"
  if "$strata" bench --device cuda:0 --json "$out/ops.jsonl" 2>&1 | tee "$out/ops.txt"; then
    note "op roofline" ok "$(grep -c . "$out/ops.jsonl" 2>/dev/null || echo 0) cases, $out/ops.txt"
  else
    note "op roofline" FAIL "see $out/ops.txt"
  fi
  for prec in bf16 tf32; do
    for model in gpt2 resnet; do
      if [[ $model == gpt2 ]]; then
        args=(--model gpt2 --size 124M --batch-size 8 --seq-len 1024)
      else
        args=(--model resnet --size 50 --batch-size 64 --image-size 224)
      fi
      step "strata bench ${args[*]} --precision $prec"
      log="$out/$model-$prec"
      if "$strata" bench "${args[@]}" --precision "$prec" --device cuda:0 --json "$log.jsonl" \
          2>&1 | tee "$log.txt"; then
        rate=$(grep -E '^ +(tokens/s|samples/s) ' "$log.txt" | tail -1 | awk '{print $1, $2}')
        mfu=$(grep -E '^ +MFU ' "$log.txt" | awk '{print $2}')
        note "$model $prec" ok "$rate, MFU ${mfu:-?}"
      else
        note "$model $prec" FAIL "see $log.txt"
      fi
    done
  done
  if [[ $pytorch == 1 ]]; then
    step "PyTorch eager and torch.compile beside Strata (tools/bench/compare_pytorch.py)"
    if [[ -n $python ]] && "$python" -c 'import torch' 2>/dev/null; then
      if "$python" tools/bench/compare_pytorch.py --strata "$strata" --precision tf32,bf16 \
          --json "$out/pytorch.jsonl" 2>&1 | tee "$out/pytorch.txt"; then
        note "PyTorch comparison" ok "$out/pytorch.txt"
      else
        note "PyTorch comparison" FAIL "see $out/pytorch.txt"
      fi
    else
      echo "torch is not importable by ${python:-python3}: skipped"
      note "PyTorch comparison" skip "no torch"
    fi
  fi
  step "interference on the GPU: stress kernels beside rank 1, static vs --repartition vpipe"
  for mode in none static vpipe; do
    args=(--model gpt2 --size 124M --dataset synthetic-tokens --seq-len 256 --batch-size 16
          --micro-batches 4 --stages 2 --local --device cuda:0 --steps 80 --log-every 10
          --metrics "$out/interference-$mode.jsonl")
    [[ $mode != none ]] && args+=(--inject "rank=1,from=20,kind=load,streams=2")
    [[ $mode == vpipe ]] && args+=(--repartition vpipe --repartition-every 10)
    if "$strata" train "${args[@]}" >"$out/interference-$mode.txt" 2>&1; then
      rate=$(awk -F'"elapsed_s":' '/"type":"train"/ {split($2, a, ","); t[++n] = a[1]}
               END { if (n >= 8) printf "%.1f samples/s", 16 * 40 / (t[8] - t[4]) }' \
               "$out/interference-$mode.jsonl")
      note "interference $mode" ok "${rate:-?} (steps 40-80)"
    else
      note "interference $mode" FAIL "see $out/interference-$mode.txt"
    fi
  done
fi

print_summary
exit "$failed"
