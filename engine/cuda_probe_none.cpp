// The device probe of a build without CUDA: no device, and no error (see probe_device_count in
// engine/cuda_runtime.h).
#include <string>

#include "engine/cuda_runtime.h"

namespace strata::cuda {

int probe_device_count(std::string*) { return 0; }

}  // namespace strata::cuda
