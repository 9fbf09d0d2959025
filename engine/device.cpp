#include "engine/device.h"

#include <cstdlib>
#include <filesystem>

#include "engine/check.h"
#include "engine/cuda_runtime.h"
#include "engine/log.h"

namespace strata {
namespace cuda {
namespace {

struct DeviceProbe {
  int count = 0;
  std::string error;
};

// Asked once: the count does not change while the process runs, and the error is logged once.
const DeviceProbe& device_probe() {
  static const DeviceProbe probe = [] {
    DeviceProbe p;
    p.count = probe_device_count(&p.error);
    if (p.count > 0) p.error.clear();
    // cudaErrorNoDevice is what a machine without a GPU says, and so is an insufficient driver
    // where no NVIDIA driver is loaded at all (a CPU machine with the toolkit); anything else is
    // a driver, library or installation problem that would otherwise look like a machine without
    // a GPU. The error is kept either way (device_count_error, STRATA_REQUIRE_GPU's message).
    const bool no_driver = !std::filesystem::exists("/proc/driver/nvidia/version") &&
                           !std::filesystem::exists("/dev/nvidia0");
    const bool expected =
        p.error.find("cudaErrorNoDevice") != std::string::npos ||
        (no_driver && p.error.find("cudaErrorInsufficientDriver") != std::string::npos);
    if (!p.error.empty() && !expected) {
      STRATA_LOG(WARN) << "CUDA: cudaGetDeviceCount failed: " << p.error
                       << "; running without CUDA devices";
    }
    return p;
  }();
  return probe;
}

}  // namespace

int device_count() { return device_probe().count; }
std::string device_count_error() { return device_probe().error; }

}  // namespace cuda

std::string Device::str() const {
  if (type == DeviceType::kCPU) return "cpu";
  return "cuda:" + std::to_string(index);
}

Device parse_device(const std::string& text) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  if (text.rfind("cuda:", 0) == 0) {
    const std::string digits = text.substr(5);
    char* end = nullptr;
    const long index = std::strtol(digits.c_str(), &end, 10);
    STRATA_CHECK(!digits.empty() && end != nullptr && *end == '\0' && index >= 0 && index < 1024)
        << "bad device '" << text << "': expected cpu, cuda or cuda:N";
    return Device::cuda(static_cast<int>(index));
  }
  STRATA_THROW() << "bad device '" << text << "': expected cpu, cuda or cuda:N";
}

int cuda_device_count() { return cuda::device_count(); }

std::string cuda_device_name(int index) { return cuda::device_name(index); }

std::vector<std::string> available_devices() {
  std::vector<std::string> devices{"cpu"};
  const int n = cuda_device_count();
  for (int i = 0; i < n; ++i) devices.push_back(Device::cuda(i).str());
  return devices;
}

void check_device_available(const Device& device) {
  if (device.is_cpu()) return;
  const int n = cuda_device_count();
  if (device.index < n) return;
  std::string list;
  for (const std::string& d : available_devices()) list += (list.empty() ? "" : ", ") + d;
  STRATA_THROW() << "device " << device.str() << " does not exist here; available: " << list
                 << (cuda::built_with_cuda() ? "" : " (this build has no CUDA support)");
}

}  // namespace strata
