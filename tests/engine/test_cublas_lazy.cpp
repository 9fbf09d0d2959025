// cuBLAS and cuBLASLt loaded on first use (engine/cublas_lazy.h): the jumps reach the real
// functions once load_cublas has run, and a call before it stops the process naming the
// function. None of the calls here needs a GPU, so this runs wherever the toolkit is installed.
#include <gtest/gtest.h>

#include <string>

#include "engine/cublas_lazy.h"

#ifdef STRATA_WITH_CUDA
#include <cublasLt.h>
#include <cublas_v2.h>

namespace {

TEST(CublasLazy, LoadedFunctionsAnswer) {
  strata::cuda::load_cublas();
  strata::cuda::load_cublas();  // idempotent
  EXPECT_EQ(std::string(cublasGetStatusName(CUBLAS_STATUS_SUCCESS)), "CUBLAS_STATUS_SUCCESS");
  EXPECT_EQ(std::string(cublasGetStatusName(CUBLAS_STATUS_NOT_INITIALIZED)),
            "CUBLAS_STATUS_NOT_INITIALIZED");
  // A cuBLASLt descriptor, made and read back on the host.
  cublasLtMatrixLayout_t layout = nullptr;
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&layout, CUDA_R_32F, 3, 5, 3), CUBLAS_STATUS_SUCCESS);
  int32_t order = CUBLASLT_ORDER_ROW;
  EXPECT_EQ(
      cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_ORDER, &order, sizeof(order)),
      CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatrixLayoutDestroy(layout), CUBLAS_STATUS_SUCCESS);
}

#ifdef STRATA_CUBLAS_JUMPS
// In a fresh process (the threadsafe death test runs only this test again), nothing has loaded
// cuBLAS yet: the call stops with a message instead of jumping nowhere.
TEST(CublasLazyDeathTest, ACallBeforeLoadingStopsNamingTheFunction) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(cublasGetStatusName(CUBLAS_STATUS_SUCCESS),
               "cublasGetStatusName called before cuBLAS was loaded");
}
#endif

}  // namespace
#endif
