// The padded linear layer on CUDA (ops/linear_padded.h): the whole padded product through
// cuBLASLt (linear_forward's kernels), then -inf over the padding columns.
#include <cmath>

#include "engine/cuda_exec.h"
#include "ops/cuda_common.cuh"
#include "ops/linear_padded.h"
#include "ops/matmul.h"

namespace strata::ops::cuda {
namespace {

using ::strata::ops::cuda_detail::dispatch_float;
using ::strata::ops::cuda_detail::from_f32;

// y[r, c] = -inf for rows r < rows and columns n <= c < np.
template <typename T>
__global__ void fill_padding_kernel(T* __restrict__ y, int64_t rows, int64_t np, int64_t n) {
  const int64_t pad = np - n;
  const int64_t total = rows * pad;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / pad;
    y[r * np + n + (i - r * pad)] = from_f32<T>(-INFINITY);
  }
}

}  // namespace

Tensor linear_padded_forward(ExecContext& ctx, const Tensor& x, const Tensor& weight,
                             const Tensor& bias, int64_t n) {
  constexpr const char* kOp = "linear_padded_forward";
  detail::check_linear_padded(kOp, x, weight, bias, n);
  Tensor y = cuda::linear_forward(ctx, x, weight, bias);
  const int64_t np = weight.size(0);
  const int64_t rows = np > 0 ? y.numel() / np : 0;
  if (np == n || rows == 0) return y;
  ::strata::cuda::CudaExec& ex = ::strata::cuda::exec(ctx, kOp);
  dispatch_float(y.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kThreads = 256;
    fill_padding_kernel<T>
        <<<::strata::cuda::blocks_for(rows * (np - n), kThreads, ex), kThreads, 0, ex.stream()>>>(
            static_cast<T*>(y.raw_data()), rows, np, n);
    STRATA_CUDA_LAUNCH_CHECK("fill_padding_kernel");
  });
  return y;
}

Tensor linear_padded_backward(ExecContext& ctx, const Tensor& dy, const Tensor& x,
                              const Tensor& weight, const Tensor& dweight, const Tensor& dbias,
                              int64_t n, bool need_dx) {
  detail::check_linear_padded("linear_padded_backward", x, weight, dbias, n);
  return cuda::linear_backward(ctx, dy, x, weight, dweight, dbias, need_dx);
}

}  // namespace strata::ops::cuda
