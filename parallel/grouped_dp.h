// Grouped data parallelism (GroPipe, papers/gropipe.md Sec. 2.5): the gradients of a pipeline
// stage are all-reduced over the G data-parallel groups bucket by bucket, each bucket launched
// the moment the step's last backward has passed its layers, so that the all-reduce of the
// stage's later layers (and of later stages) overlaps the rest of the backward pass.
//
// Buckets. A stage's flat gradient buffer (graph::ParamStore) is cut at layer boundaries into
// contiguous buckets of at most `bucket_mb` MiB (a single layer larger than that is a bucket of
// its own), in backward order: bucket 0 holds the stage's last layers. bucket_mb = 0 gives one
// bucket per stage: the paper's per-partition hook. A bucket is ready when every layer that
// writes into its range has run its backward (a tied parameter's alias writes into its owner's
// range, so the owner's bucket waits for the alias's layer too).
//
// Progress. One communication thread per stage (the CPU analogue of a CUDA communication
// stream) owns a communicator of its own (the stage's data-parallel communicator split once
// more, so its collectives never interleave with the ones the executor's thread issues) and
// runs the launched all-reduces in launch order, polling Request::test (which drives MPI's
// progress engine, and does the local backend's reduction work on this thread). The executor
// thread only enqueues and, before the stage's optimizer step, waits for the stage's own
// all-reduces; it never waits for another stage's.
//
// Overlap off (--dp-overlap off). The same buckets, launched together after the whole backward
// of the pipeline (the executor's ReduceGrads meets the group's other stages in a barrier first)
// and waited at once: the paper's "naive solution" of one synchronisation phase between the
// backward pass and the update (Fig. 8). The reduced values do not depend
// on when a bucket is launched, only on its contents and size, so on and off give bitwise
// identical weights on every backend.
//
// Delay (--dp-delay D). Update u launches the all-reduce of the gradient it computed (copied
// into slot u mod (D + 1) of a ring of D + 1 gradient buffers) and applies the all-reduced
// gradient of update u - D, so an all-reduce may take D whole steps: w_{u+1} = w_u - lr *
// G_{u-D}. The first D updates apply nothing; the optimizer's own step counter (learning rate,
// AdamW bias correction) counts applied gradients, so gradient u is applied as optimizer step u.
// At the end of a run the last D gradients are applied (Executor::flush_gradients) so that every
// computed gradient is applied exactly once. The staleness is D steps for every parameter; D = 0
// is synchronous training (no copy, the all-reduce runs in place). Memory: D + 1 gradient
// buffers per stage, on the stage's device (from the store's allocator); the copies into and out
// of the ring are ordered on the stage's stream without the host waiting.
//
// Batch-norm running statistics (buffers) are averaged over the groups at every update (sum,
// then x 1/G), so that every replica holds the same state (batch statistics themselves are per
// micro-batch, see README "Grouped pipelines"). Buffers are never delayed, and they have a
// channel of their own: a second communication thread with a second communicator (split once more
// from the first), so that their all-reduce, which the update's optimizer step waits for, does not
// queue behind the update's gradient buckets. With --dp-delay D > 0 the step thus waits for its
// few statistics only, while its gradients' all-reduce goes on for D more steps.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/tensor.h"
#include "graph/param_store.h"
#include "parallel/comm/communicator.h"

namespace strata::parallel {

class Trace;

// Multiplies an f32/f64 tensor by `factor` in place, each element in double (a device tensor
// through a host copy: the few normalization statistics a step averages over the groups).
void scale_in_place(const Tensor& t, double factor);

struct GradSyncConfig {
  bool overlap = true;      // launch each bucket after its last backward (false: after all)
  double bucket_mb = 25.0;  // MiB per bucket; 0 = one bucket per stage
  int delay = 0;            // D: apply the all-reduced gradient D steps late
  // The batch-norm buffers' all-reduce on a channel of its own (false: queued behind the
  // gradient buckets on theirs, as before; for benchmarks that measure the difference).
  bool buffers_channel = true;
};

// Throws strata::Error naming the flag for a negative bucket size or delay.
void check_grad_sync(const GradSyncConfig& config);

// A contiguous range of a stage's flat gradient buffer covering layers [first_layer, end_layer).
struct GradBucket {
  size_t first_layer = 0;
  size_t end_layer = 0;
  int64_t offset = 0;  // elements into ParamStore::grads()
  int64_t numel = 0;
  size_t ready_layer = 0;  // launchable once backward has finished this layer (and all after it)
};

// The buckets of `store` in backward order (bucket 0: the stage's last layers). Buckets cover
// every gradient element once; a stage without parameters has none.
std::vector<GradBucket> make_grad_buckets(const graph::ParamStore& store, double bucket_mb);

// What the grouped all-reduce does, for tests and traces (times on steady_clock). kLaunch: the
// hook enqueued the bucket (executor thread); kStart/kEnd: the communication thread posted the
// all-reduce / saw it complete; kBackwardEnd: the executor finished Backward(micro_batch);
// kWaitBegin/kWaitEnd: the executor thread blocked for the all-reduces of `update` (bucket -1:
// the batch-norm buffers', 0: the gradient's) and went on.
struct GradSyncEvent {
  enum Kind { kLaunch, kStart, kEnd, kBackwardEnd, kWaitBegin, kWaitEnd };
  Kind kind = kLaunch;
  int stage = 0;
  int group = 0;
  int64_t update = 0;  // the update whose gradient it carries (kBackwardEnd: the next update)
  int bucket = 0;      // -1: the batch-norm buffers
  std::chrono::steady_clock::time_point time;
  int64_t micro_batch = -1;  // kBackwardEnd only
};
using GradSyncObserver = std::function<void(const GradSyncEvent&)>;

class GroupedDp {
 public:
  // `comm`: this stage in every group (rank = group), used only by the communication thread from
  // now on. `observer` (may be empty) is called from both threads.
  GroupedDp(std::unique_ptr<Communicator> comm, graph::ParamStore& store,
            const GradSyncConfig& config, int stage, Trace* trace, GradSyncObserver observer);
  // Cancels what is still running (after a failure elsewhere) and joins the thread.
  ~GroupedDp();

  const std::vector<GradBucket>& buckets() const { return buckets_; }
  const GradSyncConfig& config() const { return config_; }
  int groups() const { return groups_; }

  // The executor's hooks, for update u (0, 1, ...: every ReduceGrads starts a new one).
  // After the backward of `layer` in the update's last backward pass (overlap on): launches the
  // buckets that became ready.
  void layer_done(int64_t update, size_t layer);
  // ReduceGrads: launches the buckets not launched yet (all of them with overlap off) and the
  // buffers' all-reduce; with overlap off and D = 0 also waits for the gradients (the naive
  // synchronisation phase).
  void end_backward(int64_t update);
  // OptimizerStep of update u: waits for the buffers of u (and averages them) and for the
  // gradient of update u - D, and puts it into the store's gradient buffer. False when u < D
  // (nothing to apply yet).
  bool gradients_for(int64_t update);
  // Updates whose gradients were launched but not applied yet (at most D after an update).
  std::vector<int64_t> pending_updates() const;
  // Waits for the gradient of update u (launched, not applied) and puts it into the store.
  void take_gradients(int64_t update);
  // --dp-delay D > 0, for checkpoints: waits for the all-reduce of update u (launched, not
  // applied) and returns its all-reduced gradient (a view of the ring, laid out like grads();
  // valid until update u + 1 + D is launched). It stays pending.
  Tensor reduced_gradient(int64_t update);
  // --dp-delay D > 0, a resumed run: the all-reduced gradient of update u, read from a checkpoint,
  // becomes pending as if launched and already reduced. Only before update u is launched, with
  // fewer than D + 1 updates pending.
  void restore_gradient(int64_t update, const Tensor& reduced);
  // True when no all-reduce is queued or running.
  bool idle() const;

 private:
  struct Job {
    int64_t update = 0;
    int bucket = 0;  // -1: buffers
    Tensor tensor;
    std::string what;
    bool done = false;
  };
  void launch(int64_t update, int bucket);
  void enqueue(int64_t update, int bucket, const Tensor& tensor, const std::string& what);
  // Blocks until the jobs of `update` (its buffers' or its gradient's) are done, between a
  // kWaitBegin and a kWaitEnd event.
  void wait_jobs(int64_t update, bool buffers);
  void wait_jobs_quietly(int64_t update, bool buffers);
  // A communication thread with its communicator and its queue of launched jobs: one for the
  // gradient buckets, one for the batch-norm buffers (when the stage has any).
  struct Channel {
    std::unique_ptr<Communicator> comm;
    std::deque<std::shared_ptr<Job>> queue;  // launched, not started by the thread
    std::thread thread;
  };
  Channel& channel_of(int bucket) { return bucket < 0 && buffers_ ? *buffers_ : grads_; }
  void thread_main(Channel& channel);
  void emit(GradSyncEvent::Kind kind, int64_t update, int bucket,
            std::chrono::steady_clock::time_point t) const;
  Tensor slot(int64_t update) const;

  graph::ParamStore& store_;
  GradSyncConfig config_;
  int stage_, group_, groups_;
  Trace* trace_;
  GradSyncObserver observer_;
  std::vector<GradBucket> buckets_;
  std::vector<Tensor> slots_;  // D > 0: the ring of D + 1 gradient buffers
  int64_t launching_update_ = -1;
  std::vector<bool> launched_;  // per bucket, for launching_update_
  std::vector<int64_t> unapplied_;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  Channel grads_;
  std::unique_ptr<Channel> buffers_;          // null: the stage has no buffers
  std::vector<std::shared_ptr<Job>> active_;  // launched, not yet waited for by the executor
  std::exception_ptr error_;
  bool stop_ = false;    // finish the queues, then exit
  bool cancel_ = false;  // exit now
};

}  // namespace strata::parallel
