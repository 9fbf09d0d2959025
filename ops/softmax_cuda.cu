// Softmax over the last dimension on CUDA: f32, bf16 and f16, computed and accumulated in f32.
//
// A row belongs to one warp (C <= 1024, four rows per block) or to a whole block (256 threads up
// to C = 8192, 1024 beyond). Forward reads the row once to get the maximum and the sum of
// exponentials together (online: the running sum is rescaled whenever the running maximum
// grows), combines the per-thread (max, sum) pairs with warp shuffles (and shared memory across
// warps), then reads the row again (from cache) to write exp(x - max) / sum. A row whose entries
// are all -inf gives zeros. Backward: dx = y (dy - sum(dy y)), the dot product reduced the same
// way. Rows move as 16-byte vectors when C and the pointers allow.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "ops/pointwise_cuda_util.cuh"
#include "ops/softmax.h"

namespace strata::ops::cuda {
namespace {

namespace cd = ::strata::ops::cuda_detail;
using ::strata::cuda::CudaExec;

constexpr const char* kForward = "softmax_forward";
constexpr const char* kBackward = "softmax_backward";

template <int kRowThreads>
__host__ __device__ constexpr int block_threads() {
  return kRowThreads == 32 ? 128 : kRowThreads;
}

template <typename T, int kRowThreads, int kVec>
__global__ void __launch_bounds__(block_threads<kRowThreads>())
    softmax_forward_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t c) {
  constexpr int kBlock = block_threads<kRowThreads>();
  constexpr int kRowsPerBlock = kBlock / kRowThreads;
  using P = cd::Pack<T, kVec>;
  __shared__ float smem[32];
  const int t = threadIdx.x % kRowThreads;
  const int64_t packs = c / kVec;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kRowThreads;
       row < rows; row += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const P* xr = reinterpret_cast<const P*>(x + row * c);
    float m = -INFINITY, s = 0.0f;
    for (int64_t j = t; j < packs; j += kRowThreads) {
      const P p = xr[j];
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float v = cd::to_f32(p.v[k]);
        if (v > m) {
          s = s * expf(m - v) + 1.0f;
          m = v;
        } else if (m != -INFINITY) {
          s += expf(v - m);
        }
      }
    }
    const float row_m = cd::row_max<kRowThreads>(m, smem);
    const float row_s = cd::row_sum<kRowThreads>(m == -INFINITY ? 0.0f : s * expf(m - row_m), smem);
    P* yr = reinterpret_cast<P*>(y + row * c);
    if (row_m == -INFINITY) {  // every entry -inf: zeros, not NaN
      P z;
#pragma unroll
      for (int k = 0; k < kVec; ++k) z.v[k] = cd::from_f32<T>(0.0f);
      for (int64_t j = t; j < packs; j += kRowThreads) yr[j] = z;
      continue;
    }
    const float inv = 1.0f / row_s;
    for (int64_t j = t; j < packs; j += kRowThreads) {
      const P p = xr[j];
      P o;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        o.v[k] = cd::from_f32<T>(expf(cd::to_f32(p.v[k]) - row_m) * inv);
      }
      yr[j] = o;
    }
  }
}

template <typename T, int kRowThreads, int kVec>
__global__ void __launch_bounds__(block_threads<kRowThreads>())
    softmax_backward_kernel(const T* __restrict__ dy, const T* __restrict__ y, T* __restrict__ dx,
                            int64_t rows, int64_t c) {
  constexpr int kBlock = block_threads<kRowThreads>();
  constexpr int kRowsPerBlock = kBlock / kRowThreads;
  using P = cd::Pack<T, kVec>;
  __shared__ float smem[32];
  const int t = threadIdx.x % kRowThreads;
  const int64_t packs = c / kVec;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kRowThreads;
       row < rows; row += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const P* dyr = reinterpret_cast<const P*>(dy + row * c);
    const P* yr = reinterpret_cast<const P*>(y + row * c);
    float dot = 0.0f;
    for (int64_t j = t; j < packs; j += kRowThreads) {
      const P g = dyr[j], p = yr[j];
#pragma unroll
      for (int k = 0; k < kVec; ++k) dot += cd::to_f32(g.v[k]) * cd::to_f32(p.v[k]);
    }
    dot = cd::row_sum<kRowThreads>(dot, smem);
    P* dxr = reinterpret_cast<P*>(dx + row * c);
    for (int64_t j = t; j < packs; j += kRowThreads) {
      const P g = dyr[j], p = yr[j];
      P o;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        o.v[k] = cd::from_f32<T>(cd::to_f32(p.v[k]) * (cd::to_f32(g.v[k]) - dot));
      }
      dxr[j] = o;
    }
  }
}

template <int kRowThreads>
unsigned row_blocks(int64_t rows, const CudaExec& ex) {
  constexpr int kRowsPerBlock = block_threads<kRowThreads>() / kRowThreads;
  const int64_t needed = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  const int64_t cap = static_cast<int64_t>(std::max(ex.sm_count(), 1)) *
                      std::max(1, 4096 / block_threads<kRowThreads>());
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(needed, cap)));
}

// Calls launch(row_threads_tag, vec_tag) with the row width and vector size for rows of c
// elements of T at the given pointers.
template <typename T, typename F>
void pick_row_config(int64_t c, bool aligned, F&& launch) {
  constexpr int kV = cd::vec16<T>();
  const bool vec = aligned && c % kV == 0;
  auto with_vec = [&](auto rt) {
    if (vec) {
      launch(rt, std::integral_constant<int, kV>{});
    } else {
      launch(rt, std::integral_constant<int, 1>{});
    }
  };
  if (c <= 1024) {
    with_vec(std::integral_constant<int, 32>{});
  } else if (c <= 8192) {
    with_vec(std::integral_constant<int, 256>{});
  } else {
    with_vec(std::integral_constant<int, 1024>{});
  }
}

int64_t row_size(const Tensor& x, const char* op, const char* name) {
  STRATA_CHECK(x.dim() >= 1 && x.size(-1) > 0)
      << op << ": " << name << " must be (..., C) with C > 0, got " << x.shape_str();
  return x.size(-1);
}

}  // namespace

Tensor softmax_forward(ExecContext& ctx, const Tensor& x) {
  CudaExec& ex = ::strata::cuda::exec(ctx, kForward);
  cd::check_float(x, ctx, kForward, "x");
  const int64_t c = row_size(x, kForward, "x");
  const int64_t rows = x.numel() / c;
  Tensor y = Tensor::empty(x.shape(), x.dtype(), &ctx.allocator());
  if (rows == 0) return y;
  cd::dispatch_float(x.dtype(), kForward, [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.raw_data());
    T* py = static_cast<T*>(y.raw_data());
    const bool aligned = cd::aligned_to(px, 16) && cd::aligned_to(py, 16);
    pick_row_config<T>(c, aligned, [&](auto rt, auto vt) {
      constexpr int kRowThreads = decltype(rt)::value;
      constexpr int kVec = decltype(vt)::value;
      softmax_forward_kernel<T, kRowThreads, kVec>
          <<<row_blocks<kRowThreads>(rows, ex), block_threads<kRowThreads>(), 0, ex.stream()>>>(
              px, py, rows, c);
      STRATA_CUDA_LAUNCH_CHECK("softmax_forward_kernel");
    });
  });
  return y;
}

Tensor softmax_backward(ExecContext& ctx, const Tensor& dy, const Tensor& y) {
  CudaExec& ex = ::strata::cuda::exec(ctx, kBackward);
  cd::check_float(dy, ctx, kBackward, "dy");
  cd::check_float(y, ctx, kBackward, "y");
  cd::check_same_dtype(dy, y, kBackward, "dy", "y");
  cd::check_shape(dy, y.shape(), kBackward, "dy");
  const int64_t c = row_size(y, kBackward, "y");
  const int64_t rows = y.numel() / c;
  Tensor dx = Tensor::empty(y.shape(), y.dtype(), &ctx.allocator());
  if (rows == 0) return dx;
  cd::dispatch_float(y.dtype(), kBackward, [&](auto tag) {
    using T = decltype(tag);
    const T* pdy = static_cast<const T*>(dy.raw_data());
    const T* py = static_cast<const T*>(y.raw_data());
    T* pdx = static_cast<T*>(dx.raw_data());
    const bool aligned =
        cd::aligned_to(pdy, 16) && cd::aligned_to(py, 16) && cd::aligned_to(pdx, 16);
    pick_row_config<T>(c, aligned, [&](auto rt, auto vt) {
      constexpr int kRowThreads = decltype(rt)::value;
      constexpr int kVec = decltype(vt)::value;
      softmax_backward_kernel<T, kRowThreads, kVec>
          <<<row_blocks<kRowThreads>(rows, ex), block_threads<kRowThreads>(), 0, ex.stream()>>>(
              pdy, py, pdx, rows, c);
      STRATA_CUDA_LAUNCH_CHECK("softmax_backward_kernel");
    });
  });
  return dx;
}

}  // namespace strata::ops::cuda
