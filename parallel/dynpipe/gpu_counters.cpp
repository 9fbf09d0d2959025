// GpuCounters (parallel/dynpipe/gpu_counters.h): NVML loaded with dlopen.
#include "parallel/dynpipe/gpu_counters.h"

#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <mutex>

#include "engine/check.h"

namespace strata::parallel::dynpipe {
namespace {

// NVML's C API as documented (nvml.h is not in the toolkit): return codes are ints, 0 success.
using NvmlReturn = int;
using NvmlDevice = void*;
struct NvmlUtilization {
  unsigned int gpu;
  unsigned int memory;
};
struct NvmlMemory {
  unsigned long long total;  // NOLINT(runtime/int): NVML's type
  unsigned long long free;   // NOLINT(runtime/int)
  unsigned long long used;   // NOLINT(runtime/int)
};
constexpr int kNvmlClockSm = 1;  // NVML_CLOCK_SM
constexpr const char* kLibrary = "libnvidia-ml.so.1";

struct Nvml {
  void* handle = nullptr;
  std::string error;  // why it is not usable ("" when it is)
  NvmlReturn (*init)() = nullptr;
  const char* (*error_string)(NvmlReturn) = nullptr;
  NvmlReturn (*by_uuid)(const char*, NvmlDevice*) = nullptr;
  NvmlReturn (*utilization)(NvmlDevice, NvmlUtilization*) = nullptr;
  NvmlReturn (*memory)(NvmlDevice, NvmlMemory*) = nullptr;
  NvmlReturn (*clock)(NvmlDevice, int, unsigned int*) = nullptr;
  NvmlReturn (*max_clock)(NvmlDevice, int, unsigned int*) = nullptr;
  NvmlReturn (*power)(NvmlDevice, unsigned int*) = nullptr;
  NvmlReturn (*power_limit)(NvmlDevice, unsigned int*) = nullptr;

  std::string message(NvmlReturn r) const {
    const char* s = error_string != nullptr ? error_string(r) : nullptr;
    return "NVML error " + std::to_string(r) + (s != nullptr ? std::string(" (") + s + ")" : "");
  }
};

template <typename F>
bool bind(Nvml& n, F* fn, const char* name) {
  *fn = reinterpret_cast<F>(dlsym(n.handle, name));
  if (*fn == nullptr && n.error.empty()) n.error = std::string(kLibrary) + " has no " + name;
  return *fn != nullptr;
}

// Loaded and initialized once per process (nvmlShutdown is never called: other threads may read).
const Nvml& nvml() {
  static Nvml n;
  static std::once_flag once;
  std::call_once(once, [] {
    n.handle = dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
    if (n.handle == nullptr) {
      const char* why = dlerror();
      n.error = std::string("cannot load ") + kLibrary + " (the NVIDIA driver's NVML)" +
                (why != nullptr ? std::string(": ") + why : "");
      return;
    }
    bind(n, &n.init, "nvmlInit_v2");
    bind(n, &n.error_string, "nvmlErrorString");
    bind(n, &n.by_uuid, "nvmlDeviceGetHandleByUUID");
    bind(n, &n.utilization, "nvmlDeviceGetUtilizationRates");
    bind(n, &n.memory, "nvmlDeviceGetMemoryInfo");
    bind(n, &n.clock, "nvmlDeviceGetClockInfo");
    bind(n, &n.max_clock, "nvmlDeviceGetMaxClockInfo");
    bind(n, &n.power, "nvmlDeviceGetPowerUsage");
    bind(n, &n.power_limit, "nvmlDeviceGetEnforcedPowerLimit");
    if (!n.error.empty()) return;
    const NvmlReturn r = n.init();
    if (r != 0) n.error = std::string(kLibrary) + ": nvmlInit_v2: " + n.message(r);
  });
  return n;
}

double ratio(double a, double b) { return b > 0 ? std::clamp(a / b, 0.0, 1.0) : 0.0; }

}  // namespace

std::map<std::string, double> GpuCounterSample::named() const {
  return {{"gpu_util", utilization},
          {"gpu_mem_util", memory_utilization},
          {"gpu_mem_used", memory_used},
          {"gpu_sm_clock", sm_clock},
          {"gpu_power", power}};
}

std::vector<std::string> gpu_counter_names() {
  return {"gpu_util", "gpu_mem_util", "gpu_mem_used", "gpu_sm_clock", "gpu_power"};
}

std::string nvml_uuid(const std::string& uuid) {
  const bool hex = uuid.size() == 32 && std::all_of(uuid.begin(), uuid.end(), [](char c) {
                     return std::isxdigit(static_cast<unsigned char>(c)) != 0;
                   });
  STRATA_CHECK(hex) << "GPU UUID '" << uuid << "': expected 32 hex digits";
  return "GPU-" + uuid.substr(0, 8) + "-" + uuid.substr(8, 4) + "-" + uuid.substr(12, 4) + "-" +
         uuid.substr(16, 4) + "-" + uuid.substr(20, 12);
}

std::string GpuCounters::unavailable_reason() { return nvml().error; }

std::unique_ptr<GpuCounters> GpuCounters::open(const std::string& uuid) {
  const Nvml& n = nvml();
  STRATA_CHECK(n.error.empty()) << "GPU counters: " << n.error;
  const std::string name = nvml_uuid(uuid);
  std::unique_ptr<GpuCounters> c(new GpuCounters);
  NvmlDevice device = nullptr;
  const NvmlReturn r = n.by_uuid(name.c_str(), &device);
  STRATA_CHECK(r == 0) << "GPU counters: nvmlDeviceGetHandleByUUID(" << name
                       << "): " << n.message(r);
  c->device_ = device;
  c->uuid_ = uuid;
  return c;
}

GpuCounters::~GpuCounters() = default;

GpuCounterSample GpuCounters::sample() const {
  const Nvml& n = nvml();
  GpuCounterSample s;
  NvmlUtilization u{};
  NvmlReturn r = n.utilization(device_, &u);
  STRATA_CHECK(r == 0) << "GPU counters of " << uuid_
                       << ": nvmlDeviceGetUtilizationRates: " << n.message(r);
  s.utilization = u.gpu / 100.0;
  s.memory_utilization = u.memory / 100.0;
  NvmlMemory m{};
  r = n.memory(device_, &m);
  STRATA_CHECK(r == 0) << "GPU counters of " << uuid_
                       << ": nvmlDeviceGetMemoryInfo: " << n.message(r);
  s.memory_used = ratio(static_cast<double>(m.used), static_cast<double>(m.total));
  unsigned int clock = 0, max_clock = 0;
  if (n.clock(device_, kNvmlClockSm, &clock) == 0 &&
      n.max_clock(device_, kNvmlClockSm, &max_clock) == 0) {
    s.sm_clock = ratio(clock, max_clock);
  }
  unsigned int mw = 0, limit = 0;  // milliwatts
  if (n.power(device_, &mw) == 0 && n.power_limit(device_, &limit) == 0) s.power = ratio(mw, limit);
  return s;
}

}  // namespace strata::parallel::dynpipe
