// Tests that need a GPU: they skip where there is none, and fail instead with STRATA_REQUIRE_GPU=1
// (tools/gpu/check.sh sets it), so that a broken driver, a missing library or a wrong RPATH on a
// GPU machine cannot turn every CUDA test into a green skip.
//
//   TEST(CudaThing, Works) {
//     STRATA_REQUIRE_CUDA();  // skip (or fail) unless cuda:0 exists
//     ...
//   }
//   if (!every_rank_has_a_gpu) STRATA_SKIP_WITHOUT_GPU("no CUDA device on every rank");
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "engine/cuda_runtime.h"
#include "engine/device.h"

namespace strata::testing {

// STRATA_REQUIRE_GPU is set to something other than "" or "0".
inline bool gpu_required() {
  const char* v = std::getenv("STRATA_REQUIRE_GPU");
  return v != nullptr && std::string(v) != "" && std::string(v) != "0";
}

// Why this process has no CUDA device ("" when it has one): no CUDA in the build, or the error of
// cudaGetDeviceCount, or none.
inline std::string why_no_cuda_device() {
  if (!cuda::built_with_cuda()) return "this build has no CUDA support";
  if (cuda_device_count() > 0) return "";
  const std::string error = cuda::device_count_error();
  return error.empty() ? "no CUDA device here"
                       : "no CUDA device: cudaGetDeviceCount failed: " + error;
}

}  // namespace strata::testing

// Skips the test for `reason` (a string), or fails it under STRATA_REQUIRE_GPU=1.
#define STRATA_SKIP_WITHOUT_GPU(reason)                                    \
  do {                                                                     \
    const std::string strata_skip_reason_ = (reason);                      \
    if (::strata::testing::gpu_required()) {                               \
      GTEST_FAIL() << "STRATA_REQUIRE_GPU=1, but " << strata_skip_reason_; \
    }                                                                      \
    GTEST_SKIP() << strata_skip_reason_;                                   \
  } while (0)

// Skips (or fails, see above) unless cuda:0 exists.
#define STRATA_REQUIRE_CUDA()                                                    \
  do {                                                                           \
    const std::string strata_no_cuda_ = ::strata::testing::why_no_cuda_device(); \
    if (!strata_no_cuda_.empty()) STRATA_SKIP_WITHOUT_GPU(strata_no_cuda_);      \
  } while (0)
