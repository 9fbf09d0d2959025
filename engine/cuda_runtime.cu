// The CUDA runtime seen by the engine: device discovery and plain device memory.
#include <cuda_runtime_api.h>

#include "engine/cuda_check.h"
#include "engine/cuda_runtime.h"
#include "engine/log.h"

namespace strata::cuda {

bool built_with_cuda() { return true; }

int device_count() {
  int n = 0;
  const cudaError_t status = cudaGetDeviceCount(&n);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky error so later calls start clean
    return 0;
  }
  return n;
}

std::string device_name(int index) {
  if (index < 0 || index >= device_count()) return "";
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, index) != cudaSuccess) return "";
  return prop.name;
}

void memcpy_blocking(void* dst, Device dst_device, const void* src, Device src_device,
                     size_t nbytes) {
  if (nbytes == 0) return;
  const int device = dst_device.is_cuda() ? dst_device.index : src_device.index;
  STRATA_CUDA_CHECK(cudaSetDevice(device));
  cudaStream_t stream = nullptr;
  STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const cudaError_t copy = cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, stream);
  const cudaError_t sync = cudaStreamSynchronize(stream);
  STRATA_CUDA_CHECK(cudaStreamDestroy(stream));
  STRATA_CUDA_CHECK(copy);
  STRATA_CUDA_CHECK(sync);
}

CudaAllocator::CudaAllocator(int device_index) : index_(device_index) {
  check_device_available(Device::cuda(device_index));
}

void* CudaAllocator::allocate(size_t nbytes, const char* what) {
  reserve(nbytes, what);
  STRATA_CUDA_CHECK(cudaSetDevice(index_));
  void* ptr = nullptr;
  const cudaError_t status = cudaMalloc(&ptr, nbytes == 0 ? 1 : nbytes);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    release(nbytes);
    throw_out_of_memory(nbytes, what, cudaGetErrorString(status));
  }
  return ptr;
}

void CudaAllocator::deallocate(void* ptr, size_t nbytes) {
  if (ptr != nullptr) {
    cudaSetDevice(index_);
    cudaFree(ptr);
  }
  release(nbytes);
}

}  // namespace strata::cuda
