// ExecContext: where and how an op runs. Every op and layer takes one; nothing in the library
// reaches for a process-wide device, stream or allocator.
//
// On the CPU it carries the allocator that op outputs come from and the number of threads ops may
// use (OpenMP loops and the BLAS). On cuda:N it owns a non-blocking stream that every op of the
// context is enqueued on, the cuBLAS/cuBLASLt/cuDNN handles bound to that stream, their
// workspaces (cuda::CudaExec, engine/cuda_exec.h), and a caching allocator whose blocks are
// reused in the order of that stream.
#pragma once

#include <memory>

#include "engine/allocator.h"
#include "engine/device.h"

namespace strata {

namespace cuda {
class CudaExec;  // engine/cuda_exec.h: stream, library handles, workspaces
// Deletes a CudaExec (defined where CudaExec is complete; a build without CUDA never makes one).
void destroy_exec(CudaExec* exec);
}  // namespace cuda

class ExecContext {
 public:
  // `allocator` defaults to default_cpu_allocator() for the CPU and to a caching allocator on the
  // context's stream, owned by this context, for cuda:N (which must exist). `threads` <= 0 keeps
  // the library default.
  explicit ExecContext(Device device = Device::cpu(), Allocator* allocator = nullptr,
                       int threads = 0);
  ExecContext(const ExecContext&) = delete;
  ExecContext& operator=(const ExecContext&) = delete;
  ~ExecContext();

  Device device() const { return device_; }
  Allocator& allocator() const { return *allocator_; }
  // Host memory for data bound for this context's device (data-loader batches,
  // DataLoaderOptions::allocator, and the Uploader's staging buffers): page-locked memory owned
  // by the context on cuda:N (cuda::PinnedHostAllocator, cached by size), which the device reads
  // in place; the default CPU allocator on the CPU. Tensors from it must go before the context.
  Allocator& host_allocator() const;
  // Threads for CPU ops; 0 means the OpenMP default (all cores).
  int threads() const { return threads_; }
  void set_threads(int threads);

  // The CUDA state (stream, handles) of a cuda:N context; nullptr on the CPU.
  cuda::CudaExec* cuda() const { return cuda_.get(); }
  // Waits until every op enqueued on this context has finished (a no-op on the CPU).
  void synchronize() const;

 private:
  struct CudaExecDeleter {
    void operator()(cuda::CudaExec* p) const { cuda::destroy_exec(p); }
  };
  Device device_;
  // Declared before the allocator: the allocator's cached blocks are freed (in stream order)
  // before the stream goes.
  std::unique_ptr<cuda::CudaExec, CudaExecDeleter> cuda_;
  std::unique_ptr<Allocator> owned_allocator_;
  Allocator* allocator_;
  std::unique_ptr<Allocator> pinned_;  // cuda:N: host_allocator()
  int threads_ = 0;
};

}  // namespace strata
