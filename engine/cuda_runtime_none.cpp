// The CUDA runtime of a build without CUDA: no device exists.
#include "engine/check.h"
#include "engine/cuda_runtime.h"

namespace strata::cuda {

bool built_with_cuda() { return false; }
int device_count() { return 0; }
std::string device_name(int) { return ""; }

void memcpy_blocking(void*, Device dst_device, const void*, Device src_device, size_t) {
  STRATA_THROW() << "copy " << src_device.str() << " -> " << dst_device.str()
                 << ": this build of Strata has no CUDA support (configure with "
                    "-DSTRATA_WITH_CUDA=ON on a machine with the CUDA toolkit)";
}

CudaAllocator::CudaAllocator(int device_index) : index_(device_index) {
  STRATA_THROW() << "cuda:" << device_index
                 << ": this build of Strata has no CUDA support (configure with "
                    "-DSTRATA_WITH_CUDA=ON on a machine with the CUDA toolkit)";
}
void* CudaAllocator::allocate(size_t, const char*) { return nullptr; }
void CudaAllocator::deallocate(void*, size_t) {}

}  // namespace strata::cuda
