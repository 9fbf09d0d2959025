// ExecContext: where and how an op runs. Every op and layer takes one; nothing in the library
// reaches for a process-wide device, stream or allocator.
//
// On the CPU it carries the allocator that op outputs come from and the number of threads ops may
// use (OpenMP loops and the BLAS). The CUDA backend adds its stream, library handles and
// workspaces here.
#pragma once

#include <memory>

#include "engine/allocator.h"
#include "engine/device.h"

namespace strata {

class ExecContext {
 public:
  // `allocator` defaults to default_cpu_allocator() for the CPU and to a CudaAllocator owned by
  // this context for cuda:N (which must exist). `threads` <= 0 keeps the library default.
  explicit ExecContext(Device device = Device::cpu(), Allocator* allocator = nullptr,
                       int threads = 0);
  ExecContext(const ExecContext&) = delete;
  ExecContext& operator=(const ExecContext&) = delete;
  ~ExecContext();

  Device device() const { return device_; }
  Allocator& allocator() const { return *allocator_; }
  // Threads for CPU ops; 0 means the OpenMP default (all cores).
  int threads() const { return threads_; }
  void set_threads(int threads);

 private:
  Device device_;
  std::unique_ptr<Allocator> owned_allocator_;
  Allocator* allocator_;
  int threads_ = 0;
};

}  // namespace strata
