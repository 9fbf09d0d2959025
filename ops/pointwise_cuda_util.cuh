// Helpers shared by the CUDA kernels of the point-wise ops (elementwise, activation, dropout,
// softmax, layer norm, shape ops): aligned vector packs, row reductions and the element-wise map
// kernels. The argument checks, dtype dispatch, f32 conversions and warp reductions they use are
// in ops/cuda_common.cuh. Only for .cu sources of ops/.
#pragma once

#include <cstdint>

#include "ops/cuda_common.cuh"

namespace strata::ops::cuda_detail {

// ---- device helpers -----------------------------------------------------------------------------

// kN elements of T loaded and stored as one aligned access.
template <typename T, int kN>
struct alignas(sizeof(T) * kN) Pack {
  T v[kN];
};

// Sum over the kRowThreads threads that share a row: one warp (kRowThreads == 32, any number of
// rows per block), or the whole block (kRowThreads == blockDim.x > 32, one row per block). Every
// thread of the row gets the total. `smem` holds 32 floats; the block-wide variant has barriers,
// so every thread of the block must call it.
template <int kRowThreads>
__device__ __forceinline__ float row_sum(float v, float* smem) {
  v = warp_sum(v);
  if constexpr (kRowThreads > 32) {
    constexpr int kWarps = kRowThreads / 32;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();  // smem may still be read from a previous call
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    v = warp_sum(lane < kWarps ? smem[lane] : 0.0f);
  }
  return v;
}

template <int kRowThreads>
__device__ __forceinline__ float row_max(float v, float* smem) {
  v = warp_max(v);
  if constexpr (kRowThreads > 32) {
    constexpr int kWarps = kRowThreads / 32;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    v = warp_max(lane < kWarps ? smem[lane] : -INFINITY);
  }
  return v;
}

}  // namespace strata::ops::cuda_detail

namespace strata::ops::cuda_detail {

// ---- element-wise maps --------------------------------------------------------------------------
// y[i] = op(a[i]) or op(a[i], b[i]) over n elements, computed in f32. kVec elements per access
// (kVec > 1 needs every pointer aligned to kVec elements). y may alias a (in-place updates: each
// element is read and written by the same thread).

template <typename T, typename Op, int kVec>
__global__ void unary_map_kernel(int64_t n, const T* a, T* y, Op op) {
  using P = Pack<T, kVec>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = n / kVec;
  for (int64_t i = tid; i < nv; i += stride) {
    const P pa = reinterpret_cast<const P*>(a)[i];
    P py;
#pragma unroll
    for (int k = 0; k < kVec; ++k) py.v[k] = from_f32<T>(op(to_f32(pa.v[k])));
    reinterpret_cast<P*>(y)[i] = py;
  }
  for (int64_t i = nv * kVec + tid; i < n; i += stride) y[i] = from_f32<T>(op(to_f32(a[i])));
}

template <typename T, typename Op, int kVec>
__global__ void binary_map_kernel(int64_t n, const T* a, const T* b, T* y, Op op) {
  using P = Pack<T, kVec>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = n / kVec;
  for (int64_t i = tid; i < nv; i += stride) {
    const P pa = reinterpret_cast<const P*>(a)[i];
    const P pb = reinterpret_cast<const P*>(b)[i];
    P py;
#pragma unroll
    for (int k = 0; k < kVec; ++k) py.v[k] = from_f32<T>(op(to_f32(pa.v[k]), to_f32(pb.v[k])));
    reinterpret_cast<P*>(y)[i] = py;
  }
  for (int64_t i = nv * kVec + tid; i < n; i += stride) {
    y[i] = from_f32<T>(op(to_f32(a[i]), to_f32(b[i])));
  }
}

constexpr int kMapThreads = 256;

template <typename T, typename Op>
void launch_unary_map(const ::strata::cuda::CudaExec& x, int64_t n, const T* a, T* y, Op op) {
  if (n <= 0) return;
  constexpr int kV = vec16<T>();
  if (aligned_to(a, 16) && aligned_to(y, 16)) {
    unary_map_kernel<T, Op, kV><<<::strata::cuda::blocks_for((n + kV - 1) / kV, kMapThreads, x),
                                  kMapThreads, 0, x.stream()>>>(n, a, y, op);
  } else {
    unary_map_kernel<T, Op, 1>
        <<<::strata::cuda::blocks_for(n, kMapThreads, x), kMapThreads, 0, x.stream()>>>(n, a, y,
                                                                                        op);
  }
  STRATA_CUDA_LAUNCH_CHECK("unary_map_kernel");
}

template <typename T, typename Op>
void launch_binary_map(const ::strata::cuda::CudaExec& x, int64_t n, const T* a, const T* b, T* y,
                       Op op) {
  if (n <= 0) return;
  constexpr int kV = vec16<T>();
  if (aligned_to(a, 16) && aligned_to(b, 16) && aligned_to(y, 16)) {
    binary_map_kernel<T, Op, kV><<<::strata::cuda::blocks_for((n + kV - 1) / kV, kMapThreads, x),
                                   kMapThreads, 0, x.stream()>>>(n, a, b, y, op);
  } else {
    binary_map_kernel<T, Op, 1>
        <<<::strata::cuda::blocks_for(n, kMapThreads, x), kMapThreads, 0, x.stream()>>>(n, a, b, y,
                                                                                        op);
  }
  STRATA_CUDA_LAUNCH_CHECK("binary_map_kernel");
}

}  // namespace strata::ops::cuda_detail
