// Helpers shared by the CUDA kernels of the point-wise ops (elementwise, activation, dropout,
// softmax, layer norm, shape ops): argument checks that name the op and tensor, dispatch over the
// floating dtypes the CUDA kernels take (f32, bf16, f16; computed in f32), f32 conversions,
// aligned vector packs and warp/row reductions. Only for .cu sources of ops/.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/check.h"
#include "engine/cuda_exec.h"
#include "engine/exec_context.h"
#include "engine/tensor.h"

namespace strata::ops::cuda_detail {

// ---- argument checks ----------------------------------------------------------------------------

// Defined and on the context's device.
inline void check_on_device(const Tensor& t, const ExecContext& ctx, const char* op,
                            const char* name) {
  STRATA_CHECK(t.defined()) << op << ": " << name << " is undefined";
  STRATA_CHECK(t.device() == ctx.device()) << op << ": " << name << " is on " << t.device().str()
                                           << ", the CUDA kernel runs on " << ctx.device().str();
}

// check_on_device plus contiguous.
inline void check_cuda(const Tensor& t, const ExecContext& ctx, const char* op, const char* name) {
  check_on_device(t, ctx, op, name);
  STRATA_CHECK(t.is_contiguous()) << op << ": " << name << " " << t.str() << " must be contiguous";
}

inline bool is_cuda_float(DType d) {
  return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16;
}

// check_cuda plus dtype f32, bf16 or f16.
inline void check_float(const Tensor& t, const ExecContext& ctx, const char* op, const char* name) {
  check_cuda(t, ctx, op, name);
  STRATA_CHECK(is_cuda_float(t.dtype()))
      << op << ": " << name << " must be f32, bf16 or f16 on CUDA, got " << dtype_name(t.dtype());
}

inline void check_same_dtype(const Tensor& a, const Tensor& b, const char* op, const char* name_a,
                             const char* name_b) {
  STRATA_CHECK(a.dtype() == b.dtype()) << op << ": " << name_a << " is " << dtype_name(a.dtype())
                                       << " but " << name_b << " is " << dtype_name(b.dtype());
}

inline void check_shape(const Tensor& t, const Shape& expected, const char* op, const char* name) {
  STRATA_CHECK(t.shape() == expected) << op << ": " << name << " has shape " << t.shape_str()
                                      << ", expected " << shape_str(expected);
}

// Calls f(T{}) with T = float, __nv_bfloat16 or __half according to dtype.
template <typename F>
void dispatch_float(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::kF32:
      f(float{});
      return;
    case DType::kBF16:
      f(__nv_bfloat16{});
      return;
    case DType::kF16:
      f(__half{});
      return;
    default:
      break;
  }
  STRATA_THROW() << op << ": unsupported dtype " << dtype_name(dtype)
                 << " (the CUDA kernels take f32, bf16 or f16)";
}

inline bool aligned_to(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// ---- device helpers -----------------------------------------------------------------------------

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }

template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) {
  return __float2half_rn(v);
}

// kN elements of T loaded and stored as one aligned access.
template <typename T, int kN>
struct alignas(sizeof(T) * kN) Pack {
  T v[kN];
};

// Elements per 16-byte access.
template <typename T>
__host__ __device__ constexpr int vec16() {
  return static_cast<int>(16 / sizeof(T));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

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
