// GpuStress in a CUDA build (engine/gpu_stress.h).
#include <cuda_runtime.h>
#include <pthread.h>

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/check.h"
#include "engine/cuda_check.h"
#include "engine/gpu_stress.h"

namespace strata::cuda {
namespace {

// One pass: every element gets `flops` dependent multiply-adds, read once and written once.
__global__ void stress_kernel(float* data, int64_t n, int flops) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    float v = data[i];
    for (int k = 0; k < flops; ++k) v = fmaf(v, 0.9999999f, 1e-7f);
    data[i] = v;
  }
}

}  // namespace

struct GpuStress::State {
  Options options;
  std::atomic<bool> stop{false};
  std::atomic<int64_t> kernels{0};
  std::vector<std::thread> threads;
  std::mutex mutex;
  std::string error;  // the first error of a thread
  bool stopped = false;

  void fail(const std::string& what) {
    std::lock_guard<std::mutex> lock(mutex);
    if (error.empty()) error = what;
  }

  // One stream's loop; `ready` is set once its buffer is allocated (or it failed).
  void run(int index, std::atomic<int>* ready) {
    // A co-located load's thread: the monitor's process counters leave it out by this name
    // (parallel/dynpipe/colocation.h's kLoadThreadName).
    pthread_setname_np(pthread_self(), "strata-load");
    float* data = nullptr;
    cudaStream_t stream = nullptr;
    auto check = [&](cudaError_t status, const char* call) {
      if (status == cudaSuccess) return true;
      fail(std::string("GPU stress stream ") + std::to_string(index) + ": " + call + ": " +
           cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")");
      return false;
    };
    const int64_t n = static_cast<int64_t>(options.bytes / sizeof(float));
    bool ok = check(cudaSetDevice(options.device), "cudaSetDevice") &&
              check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                    "cudaStreamCreateWithFlags") &&
              check(cudaMalloc(&data, static_cast<size_t>(n) * sizeof(float)), "cudaMalloc") &&
              check(cudaMemsetAsync(data, 0, static_cast<size_t>(n) * sizeof(float), stream),
                    "cudaMemsetAsync");
    int sms = 1;
    if (ok)
      ok = check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, options.device),
                 "cudaDeviceGetAttribute");
    ready->fetch_add(1);
    while (ok && !stop.load(std::memory_order_relaxed)) {
      stress_kernel<<<sms * 4, 256, 0, stream>>>(data, n, options.flops_per_element);
      ok = check(cudaGetLastError(), "stress_kernel launch") &&
           check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      if (ok) kernels.fetch_add(1, std::memory_order_relaxed);
    }
    if (data != nullptr) cudaFree(data);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
};

GpuStress::GpuStress(const Options& options) : state_(new State) {
  STRATA_CHECK(options.streams >= 1 && options.bytes >= sizeof(float) &&
               options.flops_per_element >= 1)
      << "GPU stress: streams " << options.streams << ", bytes " << options.bytes
      << ", flops per element " << options.flops_per_element;
  int count = 0;
  STRATA_CUDA_CHECK(cudaGetDeviceCount(&count));
  STRATA_CHECK(options.device >= 0 && options.device < count)
      << "GPU stress: no device cuda:" << options.device << " (" << count << " devices)";
  state_->options = options;
  std::atomic<int> ready{0};
  for (int i = 0; i < options.streams; ++i) {
    state_->threads.emplace_back([this, i, &ready] { state_->run(i, &ready); });
  }
  while (ready.load() < options.streams) std::this_thread::yield();
  const std::string error = this->error();
  if (!error.empty()) {
    stop();
    delete state_;
    state_ = nullptr;
    STRATA_THROW() << error;
  }
}

GpuStress::~GpuStress() {
  if (state_ == nullptr) return;
  stop();
  delete state_;
}

void GpuStress::stop() {
  if (state_ == nullptr || state_->stopped) return;
  state_->stop = true;
  for (std::thread& t : state_->threads) t.join();
  state_->threads.clear();
  state_->stopped = true;
}

int64_t GpuStress::kernels() const { return state_ != nullptr ? state_->kernels.load() : 0; }

const char* GpuStress::error() const {
  if (state_ == nullptr) return "";
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->error.c_str();
}

}  // namespace strata::cuda
