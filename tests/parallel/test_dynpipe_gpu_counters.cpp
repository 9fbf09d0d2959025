// DynPipe's GPU counters (parallel/dynpipe/gpu_counters.h): NVML loaded at run time. Without the
// driver's library the counters say so, naming it; on a GPU every reading is a fraction, and a
// GPU loaded by kind=load's stress kernels (engine/gpu_stress.h) reads as busy.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "engine/check.h"
#include "engine/cuda_runtime.h"
#include "engine/gpu_stress.h"
#include "parallel/dynpipe/gpu_counters.h"
#include "testing/require_gpu.h"

namespace strata::parallel::dynpipe {
namespace {

TEST(DynPipeGpuCounters, UuidsAreSpelledAsNvmlDoes) {
  EXPECT_EQ(nvml_uuid("0123456789abcdef0123456789ABCDEF"),
            "GPU-01234567-89ab-cdef-0123-456789ABCDEF");
  try {
    nvml_uuid("0123");
    ADD_FAILURE() << "a short UUID was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected 32 hex digits"), std::string::npos) << e.what();
  }
  EXPECT_EQ(gpu_counter_names().size(), GpuCounterSample{}.named().size());
}

TEST(DynPipeGpuCounters, WithoutTheDriverTheyNameTheLibrary) {
  const std::string why = GpuCounters::unavailable_reason();
  if (why.empty()) GTEST_SKIP() << "NVML loads on this machine";
  EXPECT_NE(why.find("libnvidia-ml.so.1"), std::string::npos) << why;
  try {
    GpuCounters::open("0123456789abcdef0123456789abcdef");
    ADD_FAILURE() << "GPU counters opened without NVML";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("GPU counters: "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("libnvidia-ml.so.1"), std::string::npos) << e.what();
  }
}

TEST(DynPipeGpuCounters, AStressedGpuReadsBusy) {
  STRATA_REQUIRE_CUDA();
  const std::string why = GpuCounters::unavailable_reason();
  if (!why.empty()) STRATA_SKIP_WITHOUT_GPU(why);
  const std::unique_ptr<GpuCounters> counters = GpuCounters::open(cuda::device_uuid(0));
  const GpuCounterSample idle = counters->sample();
  for (const auto& [name, value] : idle.named()) {
    EXPECT_GE(value, 0.0) << name;
    EXPECT_LE(value, 1.0) << name;
  }
  EXPECT_GT(idle.sm_clock, 0.0) << "NVML read no SM clock";
  cuda::GpuStress::Options o;
  o.streams = 2;
  cuda::GpuStress stress(o);
  // NVML's utilization covers its last sample period (1/6 s to 1 s): read after two of them.
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  const GpuCounterSample busy = counters->sample();
  stress.stop();
  EXPECT_GT(stress.kernels(), 0);
  EXPECT_GT(busy.utilization, 0.5) << "a GPU running stress kernels read as idle";
  EXPECT_GT(busy.memory_used, idle.memory_used) << "the stress buffers (128 MiB) are not seen";
}

}  // namespace
}  // namespace strata::parallel::dynpipe
