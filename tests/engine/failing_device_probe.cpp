// A build whose device count errors: linked into a test executable, this definition of
// cuda::probe_device_count takes the place of the library's (engine/cuda_probe.cu, or
// cuda_probe_none.cpp without CUDA; the linker takes no archive member for a symbol the
// executable defines), so the process sees what a broken driver or library gives.
#include <string>

#include "engine/cuda_runtime.h"

namespace strata::cuda {

int probe_device_count(std::string* error) {
  // Not cudaErrorNoDevice, nor cudaErrorInsufficientDriver (which a machine without an NVIDIA
  // driver gives, and which is not logged there): an error that always means a broken set-up.
  *error = "CUDA error 999 (cudaErrorUnknown): unknown error (a test's failing probe)";
  return 0;
}

}  // namespace strata::cuda
