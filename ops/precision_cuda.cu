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

// Checks dst and src and calls f(D{}, S{}) with their element types.
template <typename F>
void dispatch_pair(ExecContext& ctx, const Tensor& dst, const Tensor& src, const char* op, F&& f) {
  cd::check_float(dst, ctx, op, "dst");
  cd::check_float(src, ctx, op, "src");
  ::strata::ops::detail::check_conversion_pair(dst, src, op);
  if (dst.numel() == 0) return;
  cd::dispatch_float(dst.dtype(), op, [&](auto d) {
    cd::dispatch_float(src.dtype(), op, [&](auto s) { f(d, s); });
  });
}

}  // namespace

void cast_copy_(ExecContext& ctx, const Tensor& dst, const Tensor& src) {
  constexpr const char* kOp = "cast_copy_";
  CudaExec& ex = ::strata::cuda::exec(ctx, kOp);
  const int64_t n = dst.numel();
  dispatch_pair(ctx, dst, src, kOp, [&](auto dtag, auto stag) {
    using D = decltype(dtag);
    using S = decltype(stag);
    cast_kernel<D, S><<<::strata::cuda::blocks_for(n, kThreads, ex), kThreads, 0, ex.stream()>>>(
        n, static_cast<const S*>(src.raw_data()), static_cast<D*>(dst.raw_data()));
    STRATA_CUDA_LAUNCH_CHECK("cast_kernel");
  });
}

void move_add_(ExecContext& ctx, const Tensor& dst, const Tensor& src) {
  constexpr const char* kOp = "move_add_";
  CudaExec& ex = ::strata::cuda::exec(ctx, kOp);
  const int64_t n = dst.numel();
  dispatch_pair(ctx, dst, src, kOp, [&](auto dtag, auto stag) {
    using D = decltype(dtag);
    using S = decltype(stag);
    move_add_kernel<D, S>
        <<<::strata::cuda::blocks_for(n, kThreads, ex), kThreads, 0, ex.stream()>>>(
            n, static_cast<S*>(src.raw_data()), static_cast<D*>(dst.raw_data()));
    STRATA_CUDA_LAUNCH_CHECK("move_add_kernel");
  });
}

}  // namespace strata::ops::cuda
