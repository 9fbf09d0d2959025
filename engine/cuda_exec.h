// What an ExecContext on cuda:N carries, for the CUDA sources of the engine and the ops: the
// stream every op of the context is enqueued on, the cuBLAS, cuBLASLt and cuDNN handles bound to
// it, and their workspaces. Only for sources compiled with the CUDA toolkit (the rest of the engine
// sees ExecContext::cuda() as an opaque pointer).
//
//   cuda::CudaExec& x = cuda::exec(ctx);   // throws unless ctx is on a CUDA device
//   my_kernel<<<grid, block, 0, x.stream()>>>(...);
//   STRATA_CUDA_LAUNCH_CHECK("my_kernel");
//
// Nothing here uses the legacy default stream: streams are created non-blocking, and every
// library handle is bound to the context's stream.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "engine/cuda_check.h"
#include "engine/exec_context.h"
#include "engine/tensor.h"

#ifdef STRATA_WITH_CUDNN
#include <cudnn.h>
#endif

// STRATA_CUBLAS_CHECK(expr), STRATA_CUDNN_CHECK(expr): a strata::Error naming the call,
// file:line and the library's message.
#define STRATA_CUBLAS_CHECK(expr)                                                                 \
  do {                                                                                            \
    const cublasStatus_t strata_cublas_status_ = (expr);                                          \
    if (strata_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                                         \
      ::strata::detail::Thrower() & ::strata::detail::CheckMessage(__FILE__, __LINE__, #expr)     \
                                        << "cuBLAS error "                                        \
                                        << static_cast<int>(strata_cublas_status_) << " ("        \
                                        << cublasGetStatusName(strata_cublas_status_)             \
                                        << "): " << cublasGetStatusString(strata_cublas_status_); \
    }                                                                                             \
  } while (0)

#ifdef STRATA_WITH_CUDNN
#define STRATA_CUDNN_CHECK(expr)                                                              \
  do {                                                                                        \
    const cudnnStatus_t strata_cudnn_status_ = (expr);                                        \
    if (strata_cudnn_status_ != CUDNN_STATUS_SUCCESS) {                                       \
      ::strata::detail::Thrower() & ::strata::detail::CheckMessage(__FILE__, __LINE__, #expr) \
                                        << "cuDNN error "                                     \
                                        << static_cast<int>(strata_cudnn_status_) << ": "     \
                                        << cudnnGetErrorString(strata_cudnn_status_)          \
                                        << ::strata::cuda::cudnn_last_error_suffix();         \
    }                                                                                         \
  } while (0)
#endif

// After a kernel launch: a launch error (bad configuration, no kernel image for this GPU) names
// the kernel, file:line and the CUDA message.
#define STRATA_CUDA_LAUNCH_CHECK(kernel_name)                                          \
  do {                                                                                 \
    const cudaError_t strata_launch_status_ = cudaGetLastError();                      \
    if (strata_launch_status_ != cudaSuccess) {                                        \
      ::strata::detail::Thrower() &                                                    \
          ::strata::detail::CheckMessage(__FILE__, __LINE__, "launch of " kernel_name) \
              << "CUDA error " << static_cast<int>(strata_launch_status_) << " ("      \
              << cudaGetErrorName(strata_launch_status_)                               \
              << "): " << cudaGetErrorString(strata_launch_status_);                   \
    }                                                                                  \
  } while (0)

namespace strata::cuda {

#ifdef STRATA_WITH_CUDNN
// " (cudnnGetLastErrorString: ...)" when cuDNN has more to say, else "".
std::string cudnn_last_error_suffix();
#endif

// A non-blocking stream on one device, destroyed with the object.
class Stream {
 public:
  explicit Stream(int device, int priority = 0);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  cudaStream_t get() const { return stream_; }
  int device() const { return device_; }
  void synchronize() const;

 private:
  int device_;
  cudaStream_t stream_ = nullptr;
};

// A CUDA event (without timing unless asked), destroyed with the object.
class Event {
 public:
  explicit Event(bool timing = false);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  cudaEvent_t get() const { return event_; }
  void record(cudaStream_t stream);
  // Makes `stream` wait (on the device) for the work recorded before this event.
  void block(cudaStream_t stream) const;
  bool query() const;  // true when the recorded work is done
  void synchronize() const;
  // Milliseconds from `start` to this event (both recorded, both created with timing).
  float elapsed_ms_since(const Event& start) const;

 private:
  cudaEvent_t event_ = nullptr;
};

// Matrix-product precision for fp32 tensors: kFp32 keeps full fp32 products, kTf32 lets
// cuBLASLt use TF32 tensor cores (10-bit mantissa inputs, fp32 accumulation).
enum class MathMode { kFp32, kTf32 };

class CudaExec {
 public:
  explicit CudaExec(int device);
  ~CudaExec();
  CudaExec(const CudaExec&) = delete;
  CudaExec& operator=(const CudaExec&) = delete;

  int device() const { return stream_.device(); }
  cudaStream_t stream() const { return stream_.get(); }
  cublasHandle_t blas() const { return blas_; }
  cublasLtHandle_t blas_lt() const { return blas_lt_; }
#ifdef STRATA_WITH_CUDNN
  cudnnHandle_t cudnn() const { return cudnn_; }
#endif
  // cuBLASLt's workspace: kBlasLtWorkspaceBytes of device memory owned by this context.
  void* blas_lt_workspace() const { return blas_lt_workspace_; }
  static constexpr size_t kBlasLtWorkspaceBytes = size_t{32} << 20;

  MathMode math_mode() const { return math_mode_; }
  void set_math_mode(MathMode mode) { math_mode_ = mode; }
  // Streaming-multiprocessor count and the device's compute capability (major * 10 + minor).
  int sm_count() const { return sm_count_; }
  int compute_capability() const { return compute_capability_; }

 private:
  Stream stream_;
  cublasHandle_t blas_ = nullptr;
  cublasLtHandle_t blas_lt_ = nullptr;
#ifdef STRATA_WITH_CUDNN
  cudnnHandle_t cudnn_ = nullptr;
#endif
  void* blas_lt_workspace_ = nullptr;
  MathMode math_mode_ = MathMode::kFp32;
  int sm_count_ = 0;
  int compute_capability_ = 0;
};

// The CUDA state of `ctx`; throws naming the op when ctx is not on a CUDA device.
CudaExec& exec(const ExecContext& ctx, const char* op = nullptr);

// Scratch memory for cuDNN and own kernels: `bytes` (at least 1) from the context's allocator, its
// caching allocator, so no cudaMalloc/cudaFree once warm and the bytes count against --mem-limit
// (`what` names them in an out-of-memory error). Keep the tensor until the kernels using it are
// enqueued; it may go right after: a later user of the block is ordered after them on the stream.
Tensor scratch(const ExecContext& ctx, size_t bytes, const char* what);

// Blocks for a 1-D launch over n elements with `threads` per block, capped at a few waves of the
// device (kernels use grid-stride loops).
inline unsigned blocks_for(int64_t n, int threads, const CudaExec& x) {
  const int64_t needed = (n + threads - 1) / threads;
  const int64_t cap = static_cast<int64_t>(x.sm_count() > 0 ? x.sm_count() : 80) * 32;
  const int64_t b = needed < cap ? needed : cap;
  return static_cast<unsigned>(b > 0 ? b : 1);
}

}  // namespace strata::cuda
