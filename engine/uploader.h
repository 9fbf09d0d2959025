// Host tensors (data-loader batches) to the context's device without waiting for the device.
//
// On CUDA an upload copies the bytes into a pinned staging buffer (a host memcpy), enqueues the
// host-to-device copy on the context's stream, and records an event after it; a staging buffer
// goes back to the pinned cache only once its event has passed, so a later upload can never
// overwrite bytes the device has not read yet. The host does not wait for the device (unlike
// to_allocator, whose copy first lets the whole device finish): the next micro-batch's kernels
// are queued while this one's run. On the CPU an upload is the tensor itself.
#pragma once

#include <deque>
#include <memory>
#include <vector>

#include "engine/allocator.h"
#include "engine/cuda_runtime.h"
#include "engine/exec_context.h"
#include "engine/tensor.h"

namespace strata {

class Uploader {
 public:
  explicit Uploader(ExecContext& ctx);
  ~Uploader();  // waits for the copies still in flight (their staging memory must outlive them)
  Uploader(const Uploader&) = delete;
  Uploader& operator=(const Uploader&) = delete;

  // `t` on the context's device: itself when it is there already, else a contiguous copy
  // ordered on the context's stream.
  Tensor upload(const Tensor& t);
  // Staging buffers whose copies have not been seen complete yet (for tests).
  size_t in_flight() const { return staged_.size(); }

 private:
  struct Staged {
    Tensor pinned;
    std::unique_ptr<cuda::HostEvent> copied;
  };
  void reclaim(bool wait_for_oldest);

  ExecContext& ctx_;
  std::unique_ptr<Allocator> pinned_;  // PinnedHostAllocator on CUDA
  std::deque<Staged> staged_;
  std::vector<std::unique_ptr<cuda::HostEvent>> spare_events_;  // of reclaimed uploads
};

}  // namespace strata
