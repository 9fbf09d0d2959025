// Host tensors (data-loader batches) to the context's device without waiting for the device.
//
// On CUDA an upload enqueues the host-to-device copy on the context's stream and records a fence
// after it. A batch the data loader wrote into page-locked memory (Allocator::page_locked(): the
// context's host_allocator(), DataLoaderOptions::allocator) is sent as it is, with no host copy
// on the thread that launches the kernels; any other host tensor (pageable memory, or a strided
// view) is first copied into a page-locked staging buffer. Either way the uploader keeps the host
// memory the copy reads until the copy's fence has passed, so it is never freed, reused by the
// data loader or overwritten by a later upload before the device has read it; the fences are
// reclaimed in upload order, and past kMaxInFlight uploads in flight the oldest is waited for.
// The host does not wait for the device otherwise (unlike to_allocator): the next micro-batch's
// kernels are queued while this one's run. On the CPU an upload is the tensor itself.
//
// The device side is an UploadQueue: the context's stream by default, a fake one in the tests of
// the ordering (tests/engine/test_uploader.cpp).
#pragma once

#include <cstddef>
#include <deque>
#include <memory>
#include <vector>

#include "engine/allocator.h"
#include "engine/exec_context.h"
#include "engine/tensor.h"

namespace strata {

// Where uploads go: device buffers, asynchronous copies in order, and fences after them.
class UploadQueue {
 public:
  class Fence {
   public:
    virtual ~Fence() = default;
    virtual bool done() const = 0;  // the copies enqueued before it have finished (never blocks)
    virtual void wait() const = 0;  // waits on the host for them
  };
  virtual ~UploadQueue() = default;
  // An uninitialized tensor on the device.
  virtual Tensor device_tensor(const Shape& shape, DType dtype) = 0;
  // Page-locked host memory for staging copies.
  virtual Allocator& staging_allocator() = 0;
  // Enqueues dst (device, contiguous) = src (page-locked host, contiguous, same bytes); returns at
  // once.
  virtual void copy(const Tensor& dst, const Tensor& src) = 0;
  // A fence after the copies enqueued so far (`reuse`: a fence that has passed, or null).
  virtual std::unique_ptr<Fence> fence(std::unique_ptr<Fence> reuse) = 0;
};

class Uploader {
 public:
  static constexpr size_t kMaxInFlight = 16;  // uploads whose fences have not been seen pass

  explicit Uploader(ExecContext& ctx);
  // Uploads through `queue` (tests), for tensors not already on `device`.
  Uploader(Device device, std::unique_ptr<UploadQueue> queue);
  ~Uploader();  // waits for the copies still in flight (their host memory must outlive them)
  Uploader(const Uploader&) = delete;
  Uploader& operator=(const Uploader&) = delete;

  // `t` on the device: itself when it is there already, else a contiguous copy ordered on the
  // queue (a page-locked contiguous `t` is read in place; see the top).
  Tensor upload(const Tensor& t);
  // Uploads whose fences have not been seen pass yet (for tests).
  size_t in_flight() const { return staged_.size(); }
  // Of all uploads so far, those sent without a host copy and those staged (for tests).
  size_t sent_in_place() const { return sent_in_place_; }
  size_t staged() const { return staged_copies_; }

 private:
  struct Staged {
    Tensor host;  // the page-locked memory the copy reads, kept until the fence passes
    std::unique_ptr<UploadQueue::Fence> copied;
  };
  void reclaim(bool wait_for_oldest);

  ExecContext* ctx_ = nullptr;  // null with a given queue
  Device device_;
  std::unique_ptr<UploadQueue> queue_;  // null on the CPU
  std::deque<Staged> staged_;
  std::vector<std::unique_ptr<UploadQueue::Fence>> spare_fences_;  // of reclaimed uploads
  size_t sent_in_place_ = 0;
  size_t staged_copies_ = 0;
};

}  // namespace strata
