// Helpers shared by the CUDA kernels of the loss group (embedding, cross-entropy, accuracy,
// optimizer): index loads, vectorized row walks and block reductions. The argument checks, dtype
// dispatch, f32 conversions and warp reductions they use are in ops/cuda_common.cuh. Only for .cu
// sources of ops/.
#pragma once

#include <cstdint>
#include <type_traits>

#include "ops/cuda_common.cuh"

namespace strata::ops::cuda_detail {

// ---- device helpers -----------------------------------------------------------------------------

// Element i of an i32 (is64 false) or i64 index array.
__device__ __forceinline__ int64_t load_index(const void* p, bool is64, int64_t i) {
  return is64 ? static_cast<const int64_t*>(p)[i]
              : static_cast<int64_t>(static_cast<const int32_t*>(p)[i]);
}

// Elements from x up to the next 16-byte boundary (x is aligned to sizeof(T)), at most v.
template <typename T>
__device__ __forceinline__ int64_t head_elems(const T* x, int64_t v) {
  constexpr int kN = vec16<T>();
  const int mis = static_cast<int>((reinterpret_cast<uintptr_t>(x) & 15u) / sizeof(T));
  const int64_t head = mis == 0 ? 0 : kN - mis;
  return head < v ? head : v;
}

// Visits the v elements of x that belong to thread `tid` of `nthreads` (a strided split, so that
// consecutive threads read consecutive memory), converted to float, as
//   f(std::integral_constant<int, CNT>, int64_t first_index, const float* values)
// with CNT = vec16<T>() for the 16-byte-aligned body (one 16-byte load) and CNT = 1 for the
// unaligned head and the tail.
template <typename T, typename F>
__device__ __forceinline__ void for_each_in_row(const T* x, int64_t v, int64_t tid,
                                                int64_t nthreads, F&& f) {
  constexpr int kN = vec16<T>();
  const int64_t head = head_elems(x, v);
  for (int64_t j = tid; j < head; j += nthreads) {
    const float val = to_f32(x[j]);
    f(std::integral_constant<int, 1>{}, j, &val);
  }
  const int64_t nvec = (v - head) / kN;
  const uint4* body = reinterpret_cast<const uint4*>(x + head);
  for (int64_t q = tid; q < nvec; q += nthreads) {
    const uint4 raw = body[q];
    const T* e = reinterpret_cast<const T*>(&raw);
    float vals[kN];
#pragma unroll
    for (int u = 0; u < kN; ++u) vals[u] = to_f32(e[u]);
    f(std::integral_constant<int, kN>{}, head + q * kN, vals);
  }
  for (int64_t j = head + nvec * kN + tid; j < v; j += nthreads) {
    const float val = to_f32(x[j]);
    f(std::integral_constant<int, 1>{}, j, &val);
  }
}

// y[j] = f(j, x[j]) for the v elements of thread `tid` of `nthreads` (strided split), with
// 16-byte loads and stores where x and y are equally aligned (x == y is fine: each element is read
// before it is written, by the same thread).
template <typename T, typename F>
__device__ __forceinline__ void map_row(const T* x, T* y, int64_t v, int64_t tid, int64_t nthreads,
                                        F&& f) {
  constexpr int kN = vec16<T>();
  const bool same = ((reinterpret_cast<uintptr_t>(x) ^ reinterpret_cast<uintptr_t>(y)) & 15u) == 0;
  const int64_t head = same ? head_elems(x, v) : v;
  for (int64_t j = tid; j < head; j += nthreads) y[j] = from_f32<T>(f(j, to_f32(x[j])));
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
    for (int u = 0; u < kN; ++u) o[u] = from_f32<T>(f(head + q * kN + u, to_f32(e[u])));
    yb[q] = out;
  }
  for (int64_t j = head + nvec * kN + tid; j < v; j += nthreads) {
    y[j] = from_f32<T>(f(j, to_f32(x[j])));
  }
}

// y[j] = 0 for the v elements of thread `tid` of `nthreads`.
template <typename T>
__device__ __forceinline__ void zero_row(T* y, int64_t v, int64_t tid, int64_t nthreads) {
  constexpr int kN = vec16<T>();
  const int64_t head = head_elems(y, v);
  for (int64_t j = tid; j < head; j += nthreads) y[j] = from_f32<T>(0.0f);
  const int64_t nvec = (v - head) / kN;
  uint4* yb = reinterpret_cast<uint4*>(y + head);
  for (int64_t q = tid; q < nvec; q += nthreads) yb[q] = make_uint4(0u, 0u, 0u, 0u);
  for (int64_t j = head + nvec * kN + tid; j < v; j += nthreads) y[j] = from_f32<T>(0.0f);
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
