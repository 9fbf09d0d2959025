// cudaGetDeviceCount, alone in its source file (see probe_device_count in engine/cuda_runtime.h).
#include <cuda_runtime_api.h>

#include <string>

#include "engine/cuda_runtime.h"

namespace strata::cuda {

int probe_device_count(std::string* error) {
  int n = 0;
  const cudaError_t status = cudaGetDeviceCount(&n);
  if (status == cudaSuccess) return n;
  (void)cudaGetLastError();  // clear the error so later calls start clean
  *error = "CUDA error " + std::to_string(static_cast<int>(status)) + " (" +
           cudaGetErrorName(status) + "): " + cudaGetErrorString(status);
  return 0;
}

}  // namespace strata::cuda
