// OpenBLAS behind blas.h. OpenBLAS keeps one process-wide thread count; it is set from the
// calling context before each product when it differs from the last one set. A gemm called inside
// an OpenMP parallel region runs on the calling thread alone (OpenBLAS's OpenMP build checks
// omp_in_parallel), which is how kernels run many small products at once.
#include "ops/blas.h"

#include <cblas.h>

#include <atomic>
#include <thread>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "engine/check.h"

namespace strata::ops::blas {
namespace {

void apply_threads(const ExecContext& ctx) {
#ifdef _OPENMP
  // Inside a parallel region (a kernel that splits its gemms over threads), OpenBLAS's OpenMP
  // build runs each gemm on the calling thread; its thread count is left alone.
  if (omp_in_parallel()) return;
#endif
  static std::atomic<int> current{-1};
  int wanted = ctx.threads();
#ifdef _OPENMP
  if (wanted <= 0) wanted = omp_get_max_threads();  // honours OMP_NUM_THREADS
#endif
  if (wanted <= 0) wanted = static_cast<int>(std::thread::hardware_concurrency());
  if (wanted <= 0) wanted = 1;
  if (current.exchange(wanted) != wanted) openblas_set_num_threads(wanted);
}

void check_dims(int64_t m, int64_t n, int64_t k) {
  constexpr int64_t kMax = 2147483647;
  STRATA_CHECK(m >= 0 && n >= 0 && k >= 0 && m <= kMax && n <= kMax && k <= kMax)
      << "gemm dimensions " << m << " x " << n << " x " << k << " out of the BLAS's int range";
}

}  // namespace

void gemm(ExecContext& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
          float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
          float* c, int64_t ldc) {
  check_dims(m, n, k);
  if (m == 0 || n == 0) return;
  apply_threads(ctx);
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

void gemm(ExecContext& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
          double alpha, const double* a, int64_t lda, const double* b, int64_t ldb, double beta,
          double* c, int64_t ldc) {
  check_dims(m, n, k);
  if (m == 0 || n == 0) return;
  apply_threads(ctx);
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

const char* library_info() { return openblas_get_config(); }

}  // namespace strata::ops::blas
