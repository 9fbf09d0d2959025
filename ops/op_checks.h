// Argument checks that do not depend on the device, shared by the CPU kernels (cpu_util.h) and
// the CUDA kernels (cuda_common.cuh): each names the op and the tensors.
#pragma once

#include "engine/check.h"
#include "engine/tensor.h"

namespace strata::ops::detail {

inline void check_same_dtype(const Tensor& a, const Tensor& b, const char* op, const char* name_a,
                             const char* name_b) {
  STRATA_CHECK(a.dtype() == b.dtype()) << op << ": " << name_a << " is " << dtype_name(a.dtype())
                                       << " but " << name_b << " is " << dtype_name(b.dtype());
}

inline void check_shape(const Tensor& t, const Shape& expected, const char* op, const char* name) {
  STRATA_CHECK(t.shape() == expected) << op << ": " << name << " has shape " << t.shape_str()
                                      << ", expected " << shape_str(expected);
}

// dst and src (of the conversions, ops/precision.h): as many elements, and no byte in common.
inline void check_conversion_pair(const Tensor& dst, const Tensor& src, const char* op) {
  STRATA_CHECK_EQ(dst.numel(), src.numel())
      << op << ": dst " << dst.str() << " and src " << src.str() << " differ in size";
  if (!dst.shares_storage(src)) return;
  const char* d = static_cast<const char*>(dst.raw_data());
  const char* s = static_cast<const char*>(src.raw_data());
  STRATA_CHECK(d + dst.nbytes() <= s || s + src.nbytes() <= d)
      << op << ": dst " << dst.str() << " and src " << src.str() << " overlap";
}

}  // namespace strata::ops::detail
