#include "engine/exec_context.h"

#include "engine/check.h"
#include "engine/cuda_runtime.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace strata {

ExecContext::ExecContext(Device device, Allocator* allocator, int threads) : device_(device) {
  if (allocator != nullptr) {
    STRATA_CHECK(allocator->device() == device)
        << "ExecContext for " << device.str() << " given an allocator for "
        << allocator->device().str();
    allocator_ = allocator;
  } else if (device.is_cpu()) {
    allocator_ = &default_cpu_allocator();
  }
  if (device.is_cuda()) {
    check_device_available(device);
    cuda_.reset(cuda::create_exec(device.index));
    if (allocator == nullptr) {
      owned_allocator_ =
          std::make_unique<cuda::CachingAllocator>(device.index, cuda::exec_stream(cuda_.get()));
      allocator_ = owned_allocator_.get();
    }
    pinned_ = std::make_unique<cuda::PinnedHostAllocator>();
  }
  set_threads(threads);
}

Allocator& ExecContext::host_allocator() const {
  return pinned_ != nullptr ? *pinned_ : default_cpu_allocator();
}

void ExecContext::synchronize() const {
  if (cuda_) cuda::synchronize_exec(cuda_.get());
}

ExecContext::~ExecContext() = default;

void ExecContext::set_threads(int threads) {
  threads_ = threads > 0 ? threads : 0;
#ifdef _OPENMP
  // The OpenMP thread count is a per-thread setting: it applies to parallel regions started from
  // the thread that owns this context (a stage thread in the local backend).
  if (threads_ > 0) omp_set_num_threads(threads_);
#endif
}

}  // namespace strata
