// CUDA kernels of the dtype conversions (ops/precision.h): grid-stride maps over the flat
// elements, computed in f32, on the context's stream.
#include "ops/cuda_common.cuh"
#include "ops/precision.h"

namespace strata::ops::cuda {
namespace {

namespace cd = ::strata::ops::cuda_detail;
using ::strata::cuda::CudaExec;

constexpr int kThreads = 256;

template <typename D, typename S>
__global__ void cast_kernel(int64_t n, const S* __restrict__ src, D* __restrict__ dst) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    dst[i] = cd::from_f32<D>(cd::to_f32(src[i]));
  }
}

template <typename D, typename S>
__global__ void move_add_kernel(int64_t n, S* __restrict__ src, D* __restrict__ dst) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    dst[i] = cd::from_f32<D>(__fadd_rn(cd::to_f32(dst[i]), cd::to_f32(src[i])));
    src[i] = cd::from_f32<S>(0.0f);
  }
}

void check_pair(const Tensor& dst, const Tensor& src, ExecContext& ctx, const char* op) {
  cd::check_float(dst, ctx, op, "dst");
  cd::check_float(src, ctx, op, "src");
  STRATA_CHECK_EQ(dst.numel(), src.numel())
      << op << ": dst " << dst.str() << " and src " << src.str() << " differ in size";
}

}  // namespace

void cast_copy_(ExecContext& ctx, const Tensor& dst, const Tensor& src) {
  constexpr const char* kOp = "cast_copy_";
  CudaExec& ex = ::strata::cuda::exec(ctx, kOp);
  check_pair(dst, src, ctx, kOp);
  const int64_t n = dst.numel();
  if (n == 0) return;
  cd::dispatch_float(dst.dtype(), kOp, [&](auto dtag) {
    using D = decltype(dtag);
    cd::dispatch_float(src.dtype(), kOp, [&](auto stag) {
      using S = decltype(stag);
      cast_kernel<D, S><<<::strata::cuda::blocks_for(n, kThreads, ex), kThreads, 0, ex.stream()>>>(
          n, static_cast<const S*>(src.raw_data()), static_cast<D*>(dst.raw_data()));
      STRATA_CUDA_LAUNCH_CHECK("cast_kernel");
    });
  });
}

void move_add_(ExecContext& ctx, const Tensor& dst, const Tensor& src) {
  constexpr const char* kOp = "move_add_";
  CudaExec& ex = ::strata::cuda::exec(ctx, kOp);
  check_pair(dst, src, ctx, kOp);
  if (dst.shares_storage(src)) {
    const char* d = static_cast<const char*>(dst.raw_data());
    const char* s = static_cast<const char*>(src.raw_data());
    STRATA_CHECK(d + dst.nbytes() <= s || s + src.nbytes() <= d)
        << kOp << ": dst " << dst.str() << " and src " << src.str() << " overlap";
  }
  const int64_t n = dst.numel();
  if (n == 0) return;
  cd::dispatch_float(dst.dtype(), kOp, [&](auto dtag) {
    using D = decltype(dtag);
    cd::dispatch_float(src.dtype(), kOp, [&](auto stag) {
      using S = decltype(stag);
      move_add_kernel<D, S>
          <<<::strata::cuda::blocks_for(n, kThreads, ex), kThreads, 0, ex.stream()>>>(
              n, static_cast<S*>(src.raw_data()), static_cast<D*>(dst.raw_data()));
      STRATA_CUDA_LAUNCH_CHECK("move_add_kernel");
    });
  });
}

}  // namespace strata::ops::cuda
