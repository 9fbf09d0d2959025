// The transfers of a live layer migration (vPIPE §3.3, ../shared/papers/vpipe.md): the moved
// layers' in-flight saved activations, their stashed weight versions and, at the hand-off, their
// parameters and optimizer state, copied from the source stage to its neighbour while both keep
// training.
//
// One LiveTransfer is one end of one migration between this rank and `peer`, over a communicator
// of its own (the transfer thread uses it while the stage's instructions use the others). The
// two ends agree on the items beforehand, in the same order (like relayout.h, no header travels
// with the data): the source post()s each item when its tensors are ready (a tape after its
// forward, the parameters after the last backward of the layer at the source), the target
// expect()s each item with the shapes it will hold and gates the instruction that needs it on
// wait(id).
//
// Protocol. The source's thread sends `prepare` (the number of items and their bytes); the
// target's thread answers `ready` (its count) once the target end exists, i.e. once the target
// has made the moved layers; each end checks the other's count (a mismatch fails both, naming the
// migration), and only then does data move.
// Each tensor goes in chunks of `chunk_bytes`; at most `window_bytes` are in flight at once per
// direction (flow control: a chunk is posted only when the oldest ones have completed), so a
// migration never floods the links the pipeline's activations and gradients use, and the
// training traffic goes first. The thread runs at the lowest scheduling priority (nice 19) so
// that on shared cores the stage's compute goes first too; the transfer still progresses (nice,
// not SCHED_IDLE, so a loaded machine cannot starve it). A `window_bytes` of 0 turns flow
// control off (every chunk posted at once); a `chunk_bytes` of 0 sends each tensor whole.
//
// A peer that dies or stops answering ends the transfer within the communicator's timeout: the
// thread records the error (naming the migration and the item), and the next wait(), finish()
// or post() throws it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/tensor.h"
#include "parallel/comm/communicator.h"

namespace strata::parallel {

struct LiveTransferConfig {
  size_t chunk_bytes = size_t{1} << 20;   // --migration-chunk-mb
  size_t window_bytes = size_t{4} << 20;  // the cap on bytes in flight (0: no flow control)
  bool low_priority = true;               // the transfer thread at nice 19
  int tag_base = 0;                       // tags [tag_base, tag_base + 8192) are the transfer's
};

struct LiveTransferStats {
  int64_t items = 0;   // posted (source) or arrived (target)
  int64_t chunks = 0;  // messages of data
  size_t bytes = 0;
  size_t peak_in_flight_bytes = 0;  // the most bytes posted and not yet completed at once
  double seconds = 0.0;             // from the first post or expect to the last completion
  bool low_priority = false;        // whether the thread's priority was lowered
};

class LiveTransfer {
 public:
  enum class Role { kSource, kTarget };
  // `what` names the migration in errors ("migration at step 7: fc1 0->1"). `items` is the number
  // of items both ends agree on (the source posts, the target expects, exactly that many).
  LiveTransfer(Communicator& comm, int peer, Role role, int64_t items, std::string what,
               LiveTransferConfig config = {});
  // Waits for the thread: the source still sends what was posted, the target stops receiving.
  ~LiveTransfer();
  LiveTransfer(const LiveTransfer&) = delete;
  LiveTransfer& operator=(const LiveTransfer&) = delete;

  // Source: item `id` (0, 1, ... in order) is these tensors; they are copied here (the source may
  // free or reuse them at once: the copies are what the source holds until they are sent).
  void post(int64_t id, const std::vector<Tensor>& tensors);
  // Target: item `id` (0, 1, ... in order) will be tensors of these shapes and dtypes; returns
  // nothing until wait(id).
  void expect(int64_t id, const std::vector<std::pair<Shape, DType>>& layout);
  // Target: whether item `id` has arrived (never blocks).
  bool arrived(int64_t id);
  // Target: blocks until item `id` has arrived (the gate of the instruction that needs it) and
  // returns its tensors; throws naming the migration and `waiter` after the communicator's
  // timeout, or when the transfer failed.
  std::vector<Tensor> wait(int64_t id, const std::string& waiter);
  // Both ends: waits until every item is through (source: sent; target: arrived).
  void finish();
  // Source: bytes the transfer still holds (posted copies not yet sent): zero once finished.
  size_t held_bytes();

  LiveTransferStats stats();

 private:
  struct Item {
    int64_t id = 0;
    std::vector<Tensor> tensors;
    bool done = false;
  };
  void run();
  void run_source();
  void run_target();
  // Posts the chunks of `items_[index]` (send or receive), windowed.
  void move_item(Item& item, bool send);
  void complete_oldest();
  void fail(const std::string& message);
  void check_failed();

  Communicator& comm_;
  int peer_;
  Role role_;
  int64_t count_;
  std::string what_;
  LiveTransferConfig config_;

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::unique_ptr<Item>> queue_;  // posted or expected, not yet taken by the thread
  std::map<int64_t, std::unique_ptr<Item>> done_;
  int64_t next_post_ = 0, next_expect_ = 0, completed_ = 0;
  size_t held_ = 0;
  std::string error_;
  bool stop_ = false;

  // The thread's own (no lock): chunks in flight.
  struct Pending {
    std::unique_ptr<Request> request;
    Tensor buffer;  // the chunk's storage stays alive while the request may touch it
    size_t bytes = 0;
  };
  std::deque<Pending> in_flight_;
  size_t in_flight_bytes_ = 0;
  int tag_ = 0;
  LiveTransferStats stats_;  // written by the thread under mutex_
  std::chrono::steady_clock::time_point start_;
  std::thread thread_;
};

}  // namespace strata::parallel
