// The BLAS as the CPU kernels use it: row-major gemm on float and double (OpenBLAS).
#pragma once

#include <cstdint>

#include "engine/exec_context.h"

namespace strata::ops::blas {

// C = alpha op(A) op(B) + beta C, row-major; op(A) is M x K, op(B) is K x N, C is M x N.
// Uses ctx.threads() BLAS threads (all cores when 0).
void gemm(ExecContext& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
          float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
          float* c, int64_t ldc);
void gemm(ExecContext& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
          double alpha, const double* a, int64_t lda, const double* b, int64_t ldb, double beta,
          double* c, int64_t ldc);

// The BLAS library's name and version, for benchmarks ("OpenBLAS 0.3.21 ...").
const char* library_info();

}  // namespace strata::ops::blas
