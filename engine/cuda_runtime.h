// The CUDA runtime as the rest of the engine sees it, with no CUDA header in sight, so that code
// compiled by the host compiler can ask about devices in every build. The definitions come from
// cuda_runtime.cu in a CUDA build and from cuda_runtime_none.cpp otherwise, where there is no
// device and every device operation is an error saying the build has no CUDA.
#pragma once

#include <cstddef>
#include <string>

#include "engine/allocator.h"
#include "engine/device.h"

namespace strata::cuda {

bool built_with_cuda();
// Any error from cudaGetDeviceCount (no driver, "driver version is insufficient", ...) counts
// as zero devices.
int device_count();
std::string device_name(int index);  // "" when the device does not exist
// Copies nbytes between any two of host and CUDA memory, then waits for the copy to finish.
void memcpy_blocking(void* dst, Device dst_device, const void* src, Device src_device,
                     size_t nbytes);

// Device memory through cudaMalloc/cudaFree with the Allocator accounting and limit. (The caching
// allocator with size classes and per-stream reuse replaces it in the CUDA backend.)
class CudaAllocator final : public Allocator {
 public:
  explicit CudaAllocator(int device_index);
  void* allocate(size_t nbytes, const char* what = nullptr) override;
  void deallocate(void* ptr, size_t nbytes) override;
  Device device() const override { return Device::cuda(index_); }

 private:
  int index_;
};

}  // namespace strata::cuda
