// The one definition of what every CUDA op of ops/ shares: host-side argument checks that name
// the op, the tensor, its dtype, shape and device (all taking (tensor, ctx, op, name); the
// device-independent ones come from ops/op_checks.h, shared with the CPU kernels), the
// dispatch over the floating dtypes the CUDA kernels take (f32, bf16, f16; computed in f32),
// the device conversions to and from f32, and warp reductions. Group headers
// (pointwise_cuda_util.cuh, loss_cuda_common.cuh) build on it; .cu files that need nothing more
// include it directly. Everything here lives in strata::ops::cuda_detail and is defined only
// here: a second, different inline definition of one of these names in another header or .cu
// file would be an ODR violation. Only for .cu sources of ops/.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "engine/check.h"
#include "engine/cuda_exec.h"
#include "engine/exec_context.h"
#include "engine/tensor.h"
#include "ops/op_checks.h"

namespace strata::ops::cuda_detail {

// ---- host-side argument checks ------------------------------------------------------------------

// Defined and on the context's device (any layout: for callers that handle strides themselves).
inline void check_on_device(const Tensor& t, const ExecContext& ctx, const char* op,
                            const char* name) {
  STRATA_CHECK(t.defined()) << op << ": " << name << " is undefined";
  STRATA_CHECK(t.device() == ctx.device())
      << op << ": " << name << " " << t.str() << " is on " << t.device().str()
      << ", the CUDA kernel runs on " << ctx.device().str();
}

// check_on_device plus contiguous.
inline void check_cuda(const Tensor& t, const ExecContext& ctx, const char* op, const char* name) {
  check_on_device(t, ctx, op, name);
  STRATA_CHECK(t.is_contiguous()) << op << ": " << name << " " << t.str() << " must be contiguous";
}

// The dtypes of the CUDA float kernels: f32, bf16 and f16.
inline bool is_cuda_float(DType d) {
  return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16;
}

// check_cuda plus dtype f32, bf16 or f16.
inline void check_float(const Tensor& t, const ExecContext& ctx, const char* op, const char* name) {
  check_cuda(t, ctx, op, name);
  STRATA_CHECK(is_cuda_float(t.dtype()))
      << op << ": " << name << " " << t.shape_str() << " must be f32, bf16 or f16 on CUDA, got "
      << dtype_name(t.dtype());
}

// check_cuda plus dtype f32 (e.g. optimizer state on CUDA).
inline void check_f32(const Tensor& t, const ExecContext& ctx, const char* op, const char* name) {
  check_cuda(t, ctx, op, name);
  STRATA_CHECK(t.dtype() == DType::kF32) << op << ": " << name << " " << t.shape_str()
                                         << " must be f32 on CUDA, got " << dtype_name(t.dtype());
}

// check_cuda plus an index dtype (ids, targets): i32 or i64.
inline void check_index(const Tensor& t, const ExecContext& ctx, const char* op, const char* name) {
  check_cuda(t, ctx, op, name);
  STRATA_CHECK(t.dtype() == DType::kI32 || t.dtype() == DType::kI64)
      << op << ": " << name << " " << t.shape_str() << " must be i32 or i64, got "
      << dtype_name(t.dtype());
}

// Device-independent checks: ops/op_checks.h.
using ::strata::ops::detail::check_same_dtype;
using ::strata::ops::detail::check_shape;

inline bool aligned_to(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// ---- dtype dispatch -----------------------------------------------------------------------------

// Calls f(T{}) with T = float, __nv_bfloat16 or __half according to dtype; call sites write
// `using T = decltype(tag);`. Any other dtype throws, naming op and dtype.
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

// ---- device helpers -----------------------------------------------------------------------------

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }

// Round to nearest even.
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

// Elements of T per 16-byte access.
template <typename T>
__host__ __device__ constexpr int vec16() {
  return static_cast<int>(16 / sizeof(T));
}

constexpr unsigned kFullMask = 0xffffffffu;

// Sum over the 32 lanes of a warp (float or double); every lane gets the total.
template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

// Maximum over the 32 lanes of a warp; every lane gets it.
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

}  // namespace strata::ops::cuda_detail
