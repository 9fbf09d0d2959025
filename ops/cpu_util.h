// Helpers shared by the CPU reference kernels: argument checks that name the op and tensor,
// dtype dispatch over f32/f64, and an OpenMP parallel loop.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "engine/check.h"
#include "engine/tensor.h"
#include "ops/op_checks.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace strata::ops::detail {

// Defined, on the CPU and contiguous.
inline void check_cpu(const Tensor& t, const char* op, const char* name) {
  STRATA_CHECK(t.defined()) << op << ": " << name << " is undefined";
  STRATA_CHECK(t.device().is_cpu())
      << op << ": " << name << " is on " << t.device().str() << ", the CPU kernel needs it on cpu";
  STRATA_CHECK(t.is_contiguous()) << op << ": " << name << " " << t.str() << " must be contiguous";
}

// check_cpu plus dtype f32 or f64.
inline void check_float(const Tensor& t, const char* op, const char* name) {
  check_cpu(t, op, name);
  STRATA_CHECK(t.dtype() == DType::kF32 || t.dtype() == DType::kF64)
      << op << ": " << name << " must be f32 or f64, got " << dtype_name(t.dtype());
}

// Index tensors (ids, targets): i32 or i64, on the CPU, contiguous.
inline void check_index(const Tensor& t, const char* op, const char* name) {
  check_cpu(t, op, name);
  STRATA_CHECK(t.dtype() == DType::kI32 || t.dtype() == DType::kI64)
      << op << ": " << name << " must be i32 or i64, got " << dtype_name(t.dtype());
}

// Element i of an i32/i64 index tensor as int64.
inline int64_t index_at(const Tensor& t, int64_t i) {
  return t.dtype() == DType::kI32 ? static_cast<const int32_t*>(t.raw_data())[i]
                                  : static_cast<const int64_t*>(t.raw_data())[i];
}

// Calls f(T{}) with T = float or double according to dtype.
template <typename F>
decltype(auto) dispatch_float(DType dtype, const char* op, F&& f) {
  if (dtype == DType::kF32) return f(float{});
  STRATA_CHECK(dtype == DType::kF64)
      << op << ": unsupported dtype " << dtype_name(dtype) << " (the CPU kernels take f32 or f64)";
  return f(double{});
}

// Splits [0, n) into contiguous chunks of at least `grain` iterations over the OpenMP threads
// and calls body(begin, end) for each. Runs inline when n < 2 grain.
template <typename F>
void parallel_for(int64_t n, int64_t grain, F&& body) {
  if (n <= 0) return;
#ifdef _OPENMP
  if (n >= 2 * grain && omp_get_max_threads() > 1 && !omp_in_parallel()) {
#pragma omp parallel
    {
      const int64_t threads = omp_get_num_threads();
      const int64_t tid = omp_get_thread_num();
      const int64_t begin = n * tid / threads;
      const int64_t end = n * (tid + 1) / threads;
      if (begin < end) body(begin, end);
    }
    return;
  }
#endif
  body(int64_t{0}, n);
}

}  // namespace strata::ops::detail
