// Top-k accuracy on CUDA (accuracy_cpu.cpp is the specification).
//
// No sort, as on the CPU: a warp per row counts the classes that a stable descending sort would
// place before the target (larger logit, or an equal logit at a smaller index; NaN above every
// number and equal to NaN), reading the row once with 16-byte loads, and the row is a hit when
// that rank is below k. Hits are summed per block and added to one device counter (integer
// atomics: exact). The count is returned to the host, so this op synchronizes the context's
// stream; that also lets an out-of-range target fail on the host with the CPU's message: the
// kernel records the smallest bad row, and its value is fetched after the synchronization.
#include <climits>
#include <cmath>

#include "ops/accuracy.h"
#include "ops/loss_cuda_common.cuh"

namespace strata::ops::cuda {
namespace {

using namespace ::strata::ops::cuda_detail;

constexpr int kRowsPerBlock = 8;  // (32, 8) blocks: one warp per row

// True when a stable descending sort puts (a, at index i) before (b, at index j).
__device__ __forceinline__ bool ranks_before(float a, int64_t i, float b, int64_t j) {
  const bool a_nan = isnan(a), b_nan = isnan(b);
  if (a_nan || b_nan) return a_nan && (!b_nan || i < j);
  return a > b || (a == b && i < j);
}

// state[0] += rows whose target ranks below k; state[1] = min(state[1], rows with a bad target).
template <typename T>
__global__ void __launch_bounds__(32 * kRowsPerBlock)
    topk_correct_kernel(const T* __restrict__ logits, const void* __restrict__ targets,
                        bool targets64, int64_t n, int64_t c, int64_t k, int64_t ignore_index,
                        unsigned long long* __restrict__ state) {
  __shared__ unsigned long long sh_hits[kRowsPerBlock];
  const int lane = threadIdx.x;
  unsigned long long hits = 0;  // lane 0's count for this warp
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.y; row < n;
       row += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const int64_t t = load_index(targets, targets64, row);
    if (t == ignore_index) continue;  // uniform over the warp
    if (t < 0 || t >= c) {
      if (lane == 0) atomicMin(state + 1, static_cast<unsigned long long>(row));
      continue;
    }
    const T* x = logits + row * c;
    const float xt = to_f32(x[t]);
    long long rank = 0;
    for_each_in_row(x, c, lane, 32, [&](auto cnt, int64_t j0, const float* vals) {
#pragma unroll
      for (int u = 0; u < decltype(cnt)::value; ++u) rank += ranks_before(vals[u], j0 + u, xt, t);
    });
    rank = warp_sum(rank);
    if (lane == 0 && rank < k) ++hits;
  }
  if (lane == 0) sh_hits[threadIdx.y] = hits;
  __syncthreads();
  if (threadIdx.y == 0 && lane == 0) {
    unsigned long long total = 0;
    for (int w = 0; w < kRowsPerBlock; ++w) total += sh_hits[w];
    if (total > 0) atomicAdd(state, total);
  }
}

}  // namespace

int64_t topk_correct(ExecContext& ctx, const Tensor& logits, const Tensor& targets, int64_t k,
                     int64_t ignore_index) {
  constexpr const char* kOp = "topk_correct";
  check_float(logits, ctx, kOp, "logits");
  STRATA_CHECK_EQ(logits.dim(), 2) << kOp << ": logits must be (N, C), got " << logits.shape_str();
  const int64_t n = logits.size(0), c = logits.size(1);
  check_index(targets, ctx, kOp, "targets");
  check_shape(targets, {n}, kOp, "targets");
  STRATA_CHECK(k >= 1 && k <= c) << kOp << ": k = " << k << " must be in [1, C = " << c
                                 << "] for logits " << logits.shape_str();
  if (n == 0) return 0;
  ::strata::cuda::CudaExec& x = ::strata::cuda::exec(ctx, kOp);
  const cudaStream_t stream = x.stream();
  const Tensor state = Tensor::empty({2}, DType::kI64, &ctx.allocator());
  auto* pstate = static_cast<unsigned long long*>(state.raw_data());
  STRATA_CUDA_CHECK(cudaMemsetAsync(pstate, 0, sizeof(unsigned long long), stream));
  STRATA_CUDA_CHECK(cudaMemsetAsync(pstate + 1, 0xff, sizeof(unsigned long long), stream));
  const bool t64 = targets.dtype() == DType::kI64;
  const int64_t needed = (n + kRowsPerBlock - 1) / kRowsPerBlock;
  const int64_t cap = static_cast<int64_t>(x.sm_count() > 0 ? x.sm_count() : 80) * 8;
  const unsigned blocks = static_cast<unsigned>(needed < cap ? needed : cap);
  dispatch_float(logits.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    topk_correct_kernel<T><<<blocks, dim3(32, kRowsPerBlock), 0, stream>>>(
        static_cast<const T*>(logits.raw_data()), targets.raw_data(), t64, n, c, k, ignore_index,
        pstate);
    STRATA_CUDA_LAUNCH_CHECK("topk_correct_kernel");
  });
  unsigned long long host[2] = {0, 0};
  STRATA_CUDA_CHECK(cudaMemcpyAsync(host, pstate, sizeof(host), cudaMemcpyDeviceToHost, stream));
  STRATA_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (host[1] != ULLONG_MAX) {
    const int64_t row = static_cast<int64_t>(host[1]);
    int64_t t = 0;
    if (t64) {
      STRATA_CUDA_CHECK(cudaMemcpyAsync(&t, static_cast<const int64_t*>(targets.raw_data()) + row,
                                        sizeof(int64_t), cudaMemcpyDeviceToHost, stream));
    } else {
      int32_t t32 = 0;
      STRATA_CUDA_CHECK(cudaMemcpyAsync(&t32, static_cast<const int32_t*>(targets.raw_data()) + row,
                                        sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
      STRATA_CUDA_CHECK(cudaStreamSynchronize(stream));
      t = t32;
    }
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream));
    STRATA_CHECK(false) << kOp << ": targets[" << row << "] = " << t
                        << " is out of range for C = " << c << " (must be in [0, " << c
                        << ") or ignore_index " << ignore_index << ")";
  }
  return static_cast<int64_t>(host[0]);
}

}  // namespace strata::ops::cuda
