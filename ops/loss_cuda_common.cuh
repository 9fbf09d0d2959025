// Helpers shared by the CUDA kernels of the loss group (embedding, cross-entropy, accuracy,
// optimizer): argument checks that name the op and tensor, dispatch over the CUDA float dtypes
// (f32, bf16, f16; 16-bit types are computed in f32), index loads, vectorized row walks and warp /
// block reductions. Only for .cu sources of ops/.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "engine/check.h"
#include "engine/cuda_exec.h"
#include "engine/exec_context.h"
#include "engine/tensor.h"

namespace strata::ops::cuda_detail {

// ---- host-side checks ---------------------------------------------------------------------------

// Defined, on the context's device and contiguous.
inline void check_on_device(const Tensor& t, const ExecContext& ctx, const char* op,
                            const char* name) {
  STRATA_CHECK(t.defined()) << op << ": " << name << " is undefined";
  STRATA_CHECK(t.device() == ctx.device())
      << op << ": " << name << " " << t.str() << " is on " << t.device().str()
      << ", the context is on " << ctx.device().str();
  STRATA_CHECK(t.is_contiguous()) << op << ": " << name << " " << t.str() << " must be contiguous";
}

// check_on_device plus dtype f32, bf16 or f16.
inline void check_float(const Tensor& t, const ExecContext& ctx, const char* op, const char* name) {
  check_on_device(t, ctx, op, name);
  STRATA_CHECK(t.dtype() == DType::kF32 || t.dtype() == DType::kBF16 || t.dtype() == DType::kF16)
      << op << ": " << name << " " << t.shape_str() << " must be f32, bf16 or f16 on CUDA, got "
      << dtype_name(t.dtype());
}

// check_on_device plus dtype f32 (optimizer state on CUDA).
inline void check_f32(const Tensor& t, const ExecContext& ctx, const char* op, const char* name) {
  check_on_device(t, ctx, op, name);
  STRATA_CHECK(t.dtype() == DType::kF32) << op << ": " << name << " " << t.shape_str()
                                         << " must be f32 on CUDA, got " << dtype_name(t.dtype());
}

// Index tensors (ids, targets): i32 or i64.
inline void check_index(const Tensor& t, const ExecContext& ctx, const char* op, const char* name) {
  check_on_device(t, ctx, op, name);
  STRATA_CHECK(t.dtype() == DType::kI32 || t.dtype() == DType::kI64)
      << op << ": " << name << " " << t.shape_str() << " must be i32 or i64, got "
      << dtype_name(t.dtype());
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

template <typename T>
struct Tag {
  using type = T;
};

// Calls f(Tag<T>{}) with T = float, __nv_bfloat16 or __half according to dtype.
template <typename F>
void dispatch_float(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::kF32:
      f(Tag<float>{});
      return;
    case DType::kBF16:
      f(Tag<__nv_bfloat16>{});
      return;
    case DType::kF16:
      f(Tag<__half>{});
      return;
    default:
      break;
  }
  STRATA_CHECK(false) << op << ": unsupported dtype " << dtype_name(dtype)
                      << " (the CUDA kernels take f32, bf16 or f16)";
}

// ---- device helpers -----------------------------------------------------------------------------

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}

// Element i of an i32 (is64 false) or i64 index array.
__device__ __forceinline__ int64_t load_index(const void* p, bool is64, int64_t i) {
  return is64 ? static_cast<const int64_t*>(p)[i]
              : static_cast<int64_t>(static_cast<const int32_t*>(p)[i]);
}

// Elements of T in one 16-byte vector.
template <typename T>
__host__ __device__ constexpr int vec_elems() {
  return static_cast<int>(16 / sizeof(T));
}

// Elements from x up to the next 16-byte boundary (x is aligned to sizeof(T)), at most v.
template <typename T>
__device__ __forceinline__ int64_t head_elems(const T* x, int64_t v) {
  constexpr int kN = vec_elems<T>();
  const int mis = static_cast<int>((reinterpret_cast<uintptr_t>(x) & 15u) / sizeof(T));
  const int64_t head = mis == 0 ? 0 : kN - mis;
  return head < v ? head : v;
}

// Visits the v elements of x that belong to thread `tid` of `nthreads` (a strided split, so that
// consecutive threads read consecutive memory), converted to float, as
//   f(std::integral_constant<int, CNT>, int64_t first_index, const float* values)
// with CNT = vec_elems<T>() for the 16-byte-aligned body (one 16-byte load) and CNT = 1 for the
// unaligned head and the tail.
template <typename T, typename F>
__device__ __forceinline__ void for_each_in_row(const T* x, int64_t v, int64_t tid,
                                                int64_t nthreads, F&& f) {
  constexpr int kN = vec_elems<T>();
  const int64_t head = head_elems(x, v);
  for (int64_t j = tid; j < head; j += nthreads) {
    const float val = to_float(x[j]);
    f(std::integral_constant<int, 1>{}, j, &val);
  }
  const int64_t nvec = (v - head) / kN;
  const uint4* body = reinterpret_cast<const uint4*>(x + head);
  for (int64_t q = tid; q < nvec; q += nthreads) {
    const uint4 raw = body[q];
    const T* e = reinterpret_cast<const T*>(&raw);
    float vals[kN];
#pragma unroll
    for (int u = 0; u < kN; ++u) vals[u] = to_float(e[u]);
    f(std::integral_constant<int, kN>{}, head + q * kN, vals);
  }
  for (int64_t j = head + nvec * kN + tid; j < v; j += nthreads) {
    const float val = to_float(x[j]);
    f(std::integral_constant<int, 1>{}, j, &val);
  }
}

// y[j] = f(j, x[j]) for the v elements of thread `tid` of `nthreads` (strided split), with
// 16-byte loads and stores where x and y are equally aligned (x == y is fine: each element is read
// before it is written, by the same thread).
template <typename T, typename F>
__device__ __forceinline__ void map_row(const T* x, T* y, int64_t v, int64_t tid, int64_t nthreads,
                                        F&& f) {
  constexpr int kN = vec_elems<T>();
  const bool same = ((reinterpret_cast<uintptr_t>(x) ^ reinterpret_cast<uintptr_t>(y)) & 15u) == 0;
  const int64_t head = same ? head_elems(x, v) : v;
  for (int64_t j = tid; j < head; j += nthreads) y[j] = from_float<T>(f(j, to_float(x[j])));
  if (!same) return;
  const int64_t nvec = (v - head) / kN;
  const uint4* xb = reinterpret_cast<const uint4*>(x + head);
  uint4* yb = reinterpret_cast<uint4*>(y + head);
  for (int64_t q = tid; q < nvec; q += nthreads) {
    const uint4 raw = xb[q];
    const T* e = reinterpret_cast<const T*>(&raw);
    uint4 out;
    T* o = reinterpret_cast<T*>(&out);
#pragma unroll
    for (int u = 0; u < kN; ++u) o[u] = from_float<T>(f(head + q * kN + u, to_float(e[u])));
    yb[q] = out;
  }
  for (int64_t j = head + nvec * kN + tid; j < v; j += nthreads) {
    y[j] = from_float<T>(f(j, to_float(x[j])));
  }
}

// y[j] = 0 for the v elements of thread `tid` of `nthreads`.
template <typename T>
__device__ __forceinline__ void zero_row(T* y, int64_t v, int64_t tid, int64_t nthreads) {
  constexpr int kN = vec_elems<T>();
  const int64_t head = head_elems(y, v);
  for (int64_t j = tid; j < head; j += nthreads) y[j] = from_float<T>(0.0f);
  const int64_t nvec = (v - head) / kN;
  uint4* yb = reinterpret_cast<uint4*>(y + head);
  for (int64_t q = tid; q < nvec; q += nthreads) yb[q] = make_uint4(0u, 0u, 0u, 0u);
  for (int64_t j = head + nvec * kN + tid; j < v; j += nthreads) y[j] = from_float<T>(0.0f);
}

constexpr unsigned kFullMask = 0xffffffffu;

template <typename T>
__device__ __forceinline__ T warp_sum(T x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(kFullMask, x, o);
  return x;
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, o));
  return x;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024; every thread calls it);
// the result is returned to every thread. `shared` holds 32 T. Deterministic: a fixed tree.
template <typename T>
__device__ __forceinline__ T block_sum(T x, T* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  x = warp_sum(x);
  __syncthreads();  // `shared` may still be read by a previous call
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  T total = lane < warps ? shared[lane] : T(0);
  return warp_sum(total);
}

}  // namespace strata::ops::cuda_detail
