// Devices: "cpu" always; "cuda:N" when built with CUDA and a GPU is present.
#pragma once

#include <string>
#include <vector>

namespace strata {

enum class DeviceType : uint8_t { kCPU, kCUDA };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;

  static Device cpu() { return Device{DeviceType::kCPU, 0}; }
  static Device cuda(int index) { return Device{DeviceType::kCUDA, index}; }
  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool is_cuda() const { return type == DeviceType::kCUDA; }
  std::string str() const;  // "cpu", "cuda:1"
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

// Parses "cpu", "cuda" (= cuda:0) and "cuda:N". Syntax only: whether the device exists is
// checked by resolve_device.
Device parse_device(const std::string& text);

// Number of CUDA devices this process can use: 0 when built without CUDA, and 0 when the driver
// cannot be reached; such an error of cudaGetDeviceCount ("driver version is insufficient", a
// missing library) is logged once and kept by cuda::device_count_error() (engine/cuda_runtime.h).
int cuda_device_count();
// "NVIDIA H100 80GB HBM3" etc.; "" when the device does not exist.
std::string cuda_device_name(int index);

// The devices that exist here, as strings ("cpu", "cuda:0", ...).
std::vector<std::string> available_devices();

// Checks that `device` exists; throws strata::Error naming the devices that do otherwise.
void check_device_available(const Device& device);

}  // namespace strata

#include <ostream>
namespace strata {
inline std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }
}  // namespace strata
