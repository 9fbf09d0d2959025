// ArrayPipe's memory manager (papers/arraypipe.md §2.1, §5; issue 17 item 3): K device slots per
// stage for the jobs' block states (parameters, batch-norm statistics, optimizer state; the
// gradients, zero between a job's blocks, are let go with the state and made again as zeros when it
// comes back), the other jobs' states in the host pool, moved by the swap engine
// (parallel/runtime/copy_engine.h: on a GPU its pinned pool and copy streams; on the CPU its
// emulated device, two copy threads).
//
// Before each block the stage's order says which jobs come next: the resident set follows the
// next K distinct jobs (the block's own first). A job among them that is on the host is brought in
// (prefetched while the blocks before it compute), and when the slots are full a resident job that
// is not among them goes out to the host first, the one used furthest ahead (Belady). The block's
// own job then waits for its copy if it has not arrived: a stall, counted, and a load "not
// prefetched" when it only started at the block. A job's state is whole when it moves (copies are
// bit for bit), so the numbers do not depend on K.
//
// Device memory for block states: K slots (resident or on their way in) and, while a state is on
// its way out, that one too; a new eviction waits for the previous one, so at most K + 1 states at
// once (K when every job is resident and nothing moves). With `keep_grads` (a tied parameter split
// between stages, whose summed gradient waits for the end of the iteration) the gradients stay on
// the device for every job and only the values move.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "parallel/arraypipe/binder.h"
#include "parallel/runtime/copy_engine.h"

namespace strata::parallel::arraypipe {

struct SlotStats {
  int slots = 0;
  int64_t loads = 0;           // states copied to the device
  int64_t offloads = 0;        // states copied to the host
  int64_t prefetched = 0;      // loads issued before their block started
  int64_t stalls = 0;          // blocks (and other uses) that waited for their state's copy
  int64_t not_prefetched = 0;  // of those, loads issued only when the block started
  double stall_seconds = 0.0;
  double offload_wait_seconds = 0.0;  // waits for the previous eviction before the next
  size_t state_bytes = 0;             // the largest job's state on the device (gradients included)
  size_t bytes_to_host = 0, bytes_to_device = 0;
};

class StateSlots {
 public:
  // `slots` >= 1. `engine` moves the states (not owned; may be null when `slots` covers every
  // job the binder will hold: nothing moves).
  StateSlots(Binder& binder, int slots, CopyEngine* engine, bool keep_grads);
  ~StateSlots();
  StateSlots(const StateSlots&) = delete;
  StateSlots& operator=(const StateSlots&) = delete;

  // After binder.add_job (and the job's initial weights): the new job holds a slot; beyond the
  // slots it goes to the host at once (waited for, so that construction stays within K + 1).
  void admit(int job);
  // Before a block of `upcoming[0]`; `upcoming` lists the jobs of the stage's next blocks in
  // order (this iteration's rest, then the next iteration's). Offloads and prefetches as above,
  // waits for the job's state and binds it.
  void before_block(const std::vector<int>& upcoming);
  // The same for a use outside the block order (an evaluation, a deferred update, the weights).
  void use(int job) { before_block({job}); }
  // Resident or on its way in.
  bool on_device(int job) const;
  SlotStats stats() const;

 private:
  enum class Where { kDevice, kLoading, kHost };
  struct State {
    Where where = Where::kDevice;
    std::vector<std::shared_ptr<CopyEngine::Copy>> loads;  // in flight to the device
    std::vector<std::shared_ptr<CopyEngine::Copy>> outs;   // its last offload's copies
  };
  int occupied() const;
  void offload(int job);
  void load(int job, bool prefetch);
  // `late`: a stall even if the copy is done by now.
  void wait_loaded(int job, bool counted, bool late);

  Binder& binder_;
  Allocator& device_;  // the stores' (the gradients come back from it)
  int slots_;
  CopyEngine* engine_;
  bool keep_grads_;
  std::vector<State> states_;
  std::vector<std::shared_ptr<CopyEngine::Copy>> outgoing_;  // the latest eviction's copies
  SlotStats stats_;
};

// The flat buffers whose values last from one of a job's blocks to the next, in a fixed order:
// parameters, buffers (batch-norm statistics), optimizer state slots, and the working parameters
// under mixed precision (pointers to the store's own tensors).
std::vector<Tensor*> state_values(graph::ParamStore& store);
// The bytes of one job's block state on the device: what StateSlots moves, and its gradients.
size_t block_state_bytes(graph::ParamStore& store);

}  // namespace strata::parallel::arraypipe
