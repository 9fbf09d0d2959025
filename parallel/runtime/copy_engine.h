// The swap engine's transport: asynchronous copies of whole storages between a rank's device
// memory (its ExecContext's allocator, which --mem-limit caps) and a host pool.
//
// Two queues, one per direction, each served in order, like a GPU's copy engines. A copy's
// destination is allocated when the copy is issued, on the caller's thread, so running out of
// device memory or of host pool is reported to the caller, naming the pool; the source is held
// until the copy is done, then let go (for a swap-out, that is when the device memory goes).
//
//   CUDA: device-to-host and host-to-device copies on two streams of their own at the device's
//   default (lowest) priority, below the pipeline's transfers (vPIPE §4.2), into a pinned host
//   pool. A copy first waits, on the device, for the compute stream's work enqueued so far (the
//   source's producer; for a copy in, the last user of the block the destination reuses), and
//   compute is ordered after a copy in by an event (order_before_compute), never by a host wait.
//   A source is let go when the host sees its copy's event done (poll(), or wait()).
//
//   CPU: the device is emulated. The accounted allocator is device memory; the host pool is a
//   second allocator whose peak is reported apart; each queue is a thread that copies the bytes,
//   so the ordering logic is the one a GPU uses: compute waits on the host for a copy in that has
//   not arrived (order_before_compute), and a swap-out's device memory goes when its thread is
//   done with it. set_copy_delay makes every copy last at least that long (tests: compute must
//   wait, and nothing may change).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/exec_context.h"
#include "engine/tensor.h"

namespace strata::cuda {
class StreamHandle;
class HostEvent;
}  // namespace strata::cuda

namespace strata::parallel {

class CopyEngine {
 public:
  // One storage copy in flight.
  class Copy {
   public:
    ~Copy();
    bool done() const;
    // The copy's destination: a host storage (to_host) or a device storage (to_device).
    const std::shared_ptr<Storage>& destination() const { return destination_; }
    size_t bytes() const { return bytes_; }
    std::chrono::steady_clock::time_point issued() const { return issued_; }
    // When the engine saw it done (issued() until then).
    std::chrono::steady_clock::time_point completed() const { return completed_; }

   private:
    friend class CopyEngine;
    std::shared_ptr<Storage> source_;  // held until done
    std::shared_ptr<Copy> after_;      // must be done before this one starts
    std::shared_ptr<Storage> destination_;
    size_t bytes_ = 0;
    bool to_host_ = true;
    std::chrono::steady_clock::time_point issued_, completed_;
    std::atomic<bool> done_{false};           // set under the engine's mutex
    std::unique_ptr<cuda::HostEvent> event_;  // CUDA: recorded after the copy
  };

  struct Stats {
    size_t bytes_to_host = 0;
    size_t bytes_to_device = 0;
    size_t copies = 0;
    double compute_wait_seconds = 0.0;  // compute waiting on the host for a copy in (CPU)
  };

  // `host_pool` serves the host copies (a pinned allocator for a CUDA device); `pool_flag` names
  // the setting of its size in errors ("--swap-pool").
  CopyEngine(ExecContext& ctx, Allocator& host_pool, std::string pool_flag);
  ~CopyEngine();  // waits for every copy in flight
  CopyEngine(const CopyEngine&) = delete;
  CopyEngine& operator=(const CopyEngine&) = delete;

  // Copies a device storage into a new host storage from the pool.
  std::shared_ptr<Copy> to_host(std::shared_ptr<Storage> device_storage);
  // Copies a host storage into a new storage from the device allocator, once `after` (the copy
  // that filled the host storage, if still in flight) is done.
  std::shared_ptr<Copy> to_device(std::shared_ptr<Storage> host_storage,
                                  std::shared_ptr<Copy> after = nullptr);
  // Compute may read the destination of `copy` from now on (see the header comment).
  void order_before_compute(Copy& copy);
  // Waits on the host until `copy` is done and its source let go.
  void wait(Copy& copy);
  // Waits for every copy to the host issued so far and lets their sources go. Returns whether
  // any was still in flight. Safe from any thread (the allocator's pressure handler).
  bool drain_to_host();
  // Lets go of the sources of the copies seen done (CUDA: polls their events).
  void poll();
  // Tests: every copy takes at least `delay` (CPU only).
  void set_copy_delay(std::chrono::microseconds delay);

  Stats stats() const;
  Allocator& host_pool() { return host_pool_; }

 private:
  struct Queue;
  std::shared_ptr<Copy> issue(std::shared_ptr<Storage> source, bool to_host,
                              std::shared_ptr<Copy> after);
  void serve(Queue& queue);  // CPU: a queue's thread
  void finish(Copy& copy);   // marks done, lets the source go (mutex held)

  ExecContext& ctx_;
  Allocator& host_pool_;
  std::string pool_flag_;
  bool cuda_ = false;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  Stats stats_;
  std::chrono::microseconds delay_{0};
  // CPU: the two queues and their threads. CUDA: the two copy streams, and the copies in flight.
  std::unique_ptr<Queue> out_, in_;
  std::unique_ptr<cuda::StreamHandle> out_stream_, in_stream_;
  std::vector<std::shared_ptr<Copy>> in_flight_;
};

// The engine's bandwidth between the context's device and `host_pool`, in bytes per second per
// direction: `bytes` copied out and back in, `rounds` times (the first round is not timed).
double measure_copy_bandwidth(ExecContext& ctx, Allocator& host_pool,
                              size_t bytes = size_t{32} << 20, int rounds = 3);

}  // namespace strata::parallel
