// DataLoader: batches of a Dataset in a deterministic order, assembled ahead of time on
// background threads, optionally sharded across data-parallel groups.
//
//   DataLoaderOptions opt;
//   opt.batch_size = 256;  // the global batch B
//   opt.shuffle = true;
//   opt.seed = 42;
//   opt.num_workers = 2;
//   opt.shard_index = g;   // this rank's data-parallel group
//   opt.shard_count = G;
//   DataLoader loader(dataset, opt);
//   for (int64_t epoch = 0; epoch < epochs; ++epoch) {
//     loader.start_epoch(epoch);
//     Batch batch;
//     while (loader.next(&batch)) train_step(batch.input, batch.target);
//   }
//
// Order. Epoch e visits the samples in the identity order, or with shuffle in a Fisher-Yates
// permutation drawn from PhiloxStream(seed, stable_hash("shuffle"), e): a function of (seed,
// epoch) only, identical on every rank whatever its shard, worker count or prefetch depth. Samples
// are read with Dataset::get_in_epoch(e, index), so a dataset's augmentation can vary per epoch
// and stay a function of (seed, epoch, index).
//
// Batches. Step s covers positions [s*B, s*B + b) of the epoch order, where b = B except for the
// last batch, which has the N mod B leftover samples (or is dropped with drop_last).
//
// Sharding. With G groups, group g gets rows [floor(g*b/G), floor((g+1)*b/G)) of every global
// batch of b rows. B must be divisible by G, so full batches split into equal shards of B/G; the
// last, partial batch splits as evenly as possible (shards differ by at most one row) and a group
// may get an empty batch (rows == 0) when b < G. Every group sees the same
// number of steps, so the shards of one step always partition its global batch exactly.
//
// Threads. Workers run at a lower priority than the training threads (nice + 10, per thread on
// Linux), so on shared cores loading takes the time compute leaves. With num_workers > 0 the
// workers assemble up to `prefetch` batches ahead of the consumer (a worker beyond `prefetch`
// stays idle); next() hands them out in step order whichever worker finished first. A worker never
// lets an exception escape: the error of a sample reaches the consumer, whose next() throws it
// (naming the dataset, the sample and the step) and keeps throwing it until the next start_epoch.
// start_epoch cancels an epoch in flight, and the destructor stops and joins the workers promptly:
// a worker checks for cancellation between samples, so the wait is at most one Dataset::get().
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/allocator.h"
#include "engine/tensor.h"
#include "io/dataset.h"

namespace strata::io {

struct DataLoaderOptions {
  int64_t batch_size = 1;  // the global batch B (all groups together)
  bool shuffle = false;
  uint64_t seed = 0;
  bool drop_last = false;          // drop the last batch when it has fewer than B samples
  int num_workers = 0;             // background threads; 0 assembles batches inside next()
  int prefetch = 2;                // batches assembled ahead of the consumer (>= 1), with workers
  int shard_index = 0;             // this data-parallel group g, in [0, shard_count)
  int shard_count = 1;             // G; must divide batch_size
  Allocator* allocator = nullptr;  // for the batch tensors (host memory); null: the CPU default
};

struct Batch {
  Tensor input;   // (rows, input shape...), the dataset's input dtype
  Tensor target;  // (rows, target shape...), the dataset's target dtype
  int64_t epoch = 0;
  int64_t step = 0;           // within the epoch
  int64_t sample_offset = 0;  // position of row 0 in the epoch order: step*B + floor(g*b/G)
  int64_t rows = 0;           // this group's rows (may be 0 in the last batch, see above)
};

class DataLoader {
 public:
  // Throws strata::Error on invalid options (naming the option and its value).
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  const Dataset& dataset() const { return *dataset_; }
  const DataLoaderOptions& options() const { return options_; }
  // Steps per epoch: ceil(N / B), or floor(N / B) with drop_last.
  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  // Global rows of step `step` (b above), and this group's rows [begin, end) of them.
  int64_t global_rows(int64_t step) const;
  void shard_rows(int64_t step, int64_t* begin, int64_t* end) const;
  // The epoch's order of sample indices (N entries): what step s, row r reads is
  // epoch_order(e)[s*B + r] for the unsharded loader.
  std::vector<int64_t> epoch_order(int64_t epoch) const;

  // Starts epoch `epoch` at step `first_step` (0 <= first_step <= batches_per_epoch(); a resumed
  // run gives the step after its checkpoint). Cancels and discards the epoch in flight, if any.
  void start_epoch(int64_t epoch, int64_t first_step = 0);
  // The next batch of the epoch, or false after its last. Blocks until the batch is ready.
  // Rethrows a worker's error (see above). Must follow a start_epoch.
  bool next(Batch* batch);

 private:
  struct Epoch {
    int64_t epoch = 0;
    std::shared_ptr<const std::vector<int64_t>> order;
    uint64_t generation = 0;
  };
  struct Slot {
    Batch batch;
    std::exception_ptr error;
  };

  // Assembles step `step` of `epoch`; an error is returned in the slot, never thrown. Returns
  // false (and leaves the slot alone) when the epoch was cancelled part way.
  bool assemble(const Epoch& epoch, int64_t step, Slot* slot) const;
  bool cancelled(uint64_t generation) const;
  void worker_loop();
  void cancel_locked();

  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions options_;
  Allocator* allocator_;
  int64_t batches_per_epoch_ = 0;
  SampleSpec input_spec_;
  SampleSpec target_spec_;

  // Guarded by mutex_ (generation_ is also read without it by workers polling for cancellation).
  mutable std::mutex mutex_;
  std::condition_variable work_cv_;   // workers: claimable work or stop
  std::condition_variable ready_cv_;  // consumer: a slot arrived
  bool stop_ = false;
  bool started_ = false;
  bool active_ = false;  // workers may claim steps of current_
  Epoch current_;
  std::atomic<uint64_t> generation_{0};
  int64_t claim_step_ = 0;    // next step a worker will take
  int64_t consume_step_ = 0;  // next step next() returns
  std::map<int64_t, Slot> ready_;
  std::exception_ptr failed_;  // the epoch's error, rethrown by every next() until start_epoch
  std::vector<std::thread> workers_;
};

}  // namespace strata::io
