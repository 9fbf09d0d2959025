// A co-located job on a GPU: kernels that keep the device's SMs and memory busy, for
// --inject kind=load on a rank that trains on a GPU (vPIPE's and DynPipe's interference on a
// shared device: parallel/runtime/injector.h). Each of `streams` host threads launches a kernel
// that streams over a buffer of its own with a chain of multiply-adds per element, waits for it,
// and launches the next, until stopped: the training kernels share the SMs and the memory
// bandwidth with it, as with another tenant's job. Declared without CUDA headers: the
// definitions come from gpu_stress.cu in a CUDA build and from gpu_stress_none.cpp otherwise,
// where constructing one is an error saying the build has no CUDA.
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata::cuda {

class GpuStress {
 public:
  struct Options {
    int device = 0;              // cuda:device
    int streams = 1;             // host threads, each with a stream and a buffer of its own
    size_t bytes = 64u << 20;    // buffer bytes per stream
    int flops_per_element = 64;  // multiply-adds per element and pass (compute against memory)
  };
  // Starts the streams (the buffers allocated and the first kernels launched before it returns).
  explicit GpuStress(const Options& options);
  ~GpuStress();  // stop()
  GpuStress(const GpuStress&) = delete;
  GpuStress& operator=(const GpuStress&) = delete;

  // Stops the launches and joins the threads (the kernels in flight finish first); idempotent.
  void stop();
  // Kernels finished so far, over every stream.
  int64_t kernels() const;
  // The first error a stream's thread met ("" if none): a failed launch stops that stream.
  const char* error() const;

 private:
  struct State;
  State* state_ = nullptr;
};

}  // namespace strata::cuda
