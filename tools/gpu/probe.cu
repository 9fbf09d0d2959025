// What the CUDA runtime sees, for tools/gpu/check.sh: one line per device, or the error of
// cudaGetDeviceCount. Exit status 0 with at least one device, 3 without (none, or an error).
//   nvcc -o probe probe.cu && ./probe          # cuda:0 NVIDIA H100 80GB HBM3, sm_90, 79.1 GiB, 132
//   SMs
#include <cuda_runtime_api.h>

#include <cstdio>

int main() {
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);  // 0 when no driver is installed
  std::printf("runtime %d.%d, driver %d.%d\n", runtime / 1000, runtime % 1000 / 10, driver / 1000,
              driver % 1000 / 10);
  int n = 0;
  const cudaError_t status = cudaGetDeviceCount(&n);
  if (status != cudaSuccess) {
    std::printf("no GPU: cudaGetDeviceCount failed: CUDA error %d (%s): %s\n",
                static_cast<int>(status), cudaGetErrorName(status), cudaGetErrorString(status));
    return 3;
  }
  if (n == 0) {
    std::printf("no GPU: cudaGetDeviceCount found no device\n");
    return 3;
  }
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) {
      std::printf("cuda:%d: cudaGetDeviceProperties failed\n", i);
      return 3;
    }
    std::printf("cuda:%d %s, sm_%d%d, %.1f GiB, %d SMs\n", i, p.name, p.major, p.minor,
                static_cast<double>(p.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0),
                p.multiProcessorCount);
  }
  return 0;
}
