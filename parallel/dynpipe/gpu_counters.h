// The counters a GPU exposes to DynPipe's slowdown model (../shared/papers/dynpipe.md §2.7: the
// interference features of a device; issue 15 item 6), read from NVML. NVML is the driver's
// library (libnvidia-ml.so.1), not the toolkit's: it is loaded at run time with dlopen, so that
// every build links without it and a machine without a driver says so when the counters are
// asked for, naming the library. The structures and entry points used are NVML's documented C
// API (nvmlInit_v2, nvmlDeviceGetHandleByUUID, nvmlDeviceGetUtilizationRates,
// nvmlDeviceGetMemoryInfo, nvmlDeviceGetClockInfo / GetMaxClockInfo, nvmlDeviceGetPowerUsage /
// GetEnforcedPowerLimit), declared here by hand because the toolkit has no nvml.h.
//
// Not read: SM occupancy (CUPTI's metrics need a profiling session around the kernels; left out).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace strata::parallel::dynpipe {

// One reading of a GPU, each in [0, 1].
struct GpuCounterSample {
  double utilization = 0.0;         // time a kernel ran, over NVML's last sample period
  double memory_utilization = 0.0;  // time device memory was read or written (bandwidth busy)
  double memory_used = 0.0;         // of the device's memory
  double sm_clock = 0.0;            // SM clock over its maximum (throttling, power capping)
  double power = 0.0;               // draw over the enforced limit (0 where not supported)

  // By name: gpu_util, gpu_mem_util, gpu_mem_used, gpu_sm_clock, gpu_power.
  std::map<std::string, double> named() const;
};

// The names of GpuCounterSample::named(), in order.
std::vector<std::string> gpu_counter_names();

class GpuCounters {
 public:
  // NVML for the GPU whose UUID is `uuid` (32 hex digits, as cuda::device_uuid gives it; the
  // same GPU whatever CUDA_VISIBLE_DEVICES says). Throws strata::Error naming the library or the
  // call and NVML's message when it cannot.
  static std::unique_ptr<GpuCounters> open(const std::string& uuid);
  // "" when libnvidia-ml.so.1 loads and initializes, else why not (for skips and messages).
  static std::string unavailable_reason();
  ~GpuCounters();
  GpuCounters(const GpuCounters&) = delete;
  GpuCounters& operator=(const GpuCounters&) = delete;

  GpuCounterSample sample() const;
  const std::string& uuid() const { return uuid_; }

 private:
  GpuCounters() = default;
  void* device_ = nullptr;  // nvmlDevice_t
  std::string uuid_;
};

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", NVML's spelling of a UUID given as 32 hex digits;
// throws naming `uuid` when it is not 32 hex digits.
std::string nvml_uuid(const std::string& uuid);

}  // namespace strata::parallel::dynpipe
