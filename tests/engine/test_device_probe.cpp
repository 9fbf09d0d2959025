// A process whose cudaGetDeviceCount fails (failing_device_probe.cpp): the error counts as no
// device, is logged once and kept, and a test that needs a GPU skips, or fails with
// STRATA_REQUIRE_GPU=1. tests/engine/require_gpu.sh runs whole CUDA test files built this way.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>
#include <vector>

#include "engine/check.h"
#include "engine/cuda_runtime.h"
#include "engine/device.h"
#include "engine/exec_context.h"
#include "testing/require_gpu.h"

namespace strata {
namespace {

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// First in the file: the probe runs once per process, and this test must see it happen.
TEST(DeviceProbe, AnErrorCountsAsNoDeviceAndIsLoggedOnce) {
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(cuda_device_count(), 0);
  EXPECT_EQ(cuda_device_count(), 0);
  EXPECT_EQ(available_devices(), std::vector<std::string>{"cpu"});
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(count(log, "cudaGetDeviceCount failed"), 1u) << log;
  EXPECT_EQ(count(log, "cudaErrorUnknown"), 1u) << log;
  EXPECT_NE(cuda::device_count_error().find("cudaErrorUnknown"), std::string::npos);
}

TEST(DeviceProbe, AskingForTheDeviceNamesTheDevicesThatExist) {
  try {
    ExecContext ctx(Device::cuda(0));
    FAIL() << "cuda:0 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("available: cpu"), std::string::npos) << e.what();
  }
}

TEST(DeviceProbe, TheReasonNamesTheError) {
  const std::string why = testing::why_no_cuda_device();
  if (cuda::built_with_cuda()) {
    EXPECT_NE(why.find("cudaGetDeviceCount failed: CUDA error 999"), std::string::npos) << why;
  } else {
    EXPECT_EQ(why, "this build has no CUDA support");
  }
}

void needs_cuda() {
  STRATA_REQUIRE_CUDA();
  ADD_FAILURE() << "a test that needs CUDA ran without a device";
}

TEST(DeviceProbe, RequireGpuTurnsTheSkipIntoAFailure) {
  ::setenv("STRATA_REQUIRE_GPU", "1", 1);
  EXPECT_FATAL_FAILURE(needs_cuda(), "STRATA_REQUIRE_GPU=1, but");
  ::setenv("STRATA_REQUIRE_GPU", "0", 1);
  EXPECT_FALSE(testing::gpu_required());
  ::unsetenv("STRATA_REQUIRE_GPU");
  EXPECT_FALSE(testing::gpu_required());
}

}  // namespace
}  // namespace strata
