// The micro-batches a rank's executor consumes, cut from the DataLoader's global batches.
//
// Step k of a run is batch (k mod P) of epoch (k div P), P = batches per epoch. Each data-parallel
// group g loads its shard of every global batch (io/data_loader.h), and the shard is split into
// M micro-batches of contiguous rows, micro-batch i holding rows [floor(i r / M),
// floor((i + 1) r / M)) of the r rows. Micro-batch ids are global: k * M + i.
//
// Only the first stage (inputs) and the last stage (targets) load data; the stages in between
// compute the same row counts from the loader's arithmetic without reading a sample. The last
// stage also computes each step's loss normalizer: the counted targets of the whole global
// batch, summed over the groups through their last stages' communicator.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "io/data_loader.h"
#include "io/dataset.h"
#include "parallel/comm/communicator.h"
#include "parallel/runtime/micro_batch_source.h"

namespace strata::parallel {

class LoaderMicroBatches final : public MicroBatchSource {
 public:
  // `loads_data`: this rank reads samples (first or last stage). `dp_last`: on last-stage ranks
  // of a run with several groups, the communicator joining the groups' last stages (null
  // otherwise). `ignore_index`: targets that do not count toward the normalizer.
  // `per_micro_batch`: normalize each micro-batch by its own counted targets (summed over the
  // groups) instead of the step's (asynchronous schedules update per micro-batch).
  LoaderMicroBatches(std::shared_ptr<const io::Dataset> data, const io::DataLoaderOptions& options,
                     int64_t micro_batches, bool loads_data, Communicator* dp_last,
                     int64_t ignore_index, bool per_micro_batch = false);

  Info info(int64_t micro_batch) override;
  TensorList input(int64_t micro_batch) override;
  Tensor target(int64_t micro_batch) override;

  int64_t steps_per_epoch() const { return loader_.batches_per_epoch(); }
  int64_t micro_batches() const { return micro_batches_; }
  // Rows of this group in step k's batch.
  int64_t group_rows(int64_t step) const;
  // Forgets the data of steps before `step` (their micro-batches are done).
  void release_before(int64_t step);
  // Starts at step `step` instead of 0 (a resumed run): the loader opens that step's epoch at
  // that batch, without reading the batches before it. Call before the first micro-batch.
  void start_at(int64_t step);

 private:
  struct StepData {
    io::Batch batch;  // this group's shard (empty on ranks that do not load data)
    // Counted targets of the global batch, or of each micro-batch over the groups.
    std::vector<double> normalizers;
  };
  StepData& load(int64_t step);
  void split(int64_t micro_batch, int64_t* step, int64_t* begin, int64_t* rows) const;

  std::shared_ptr<const io::Dataset> data_;
  io::DataLoader loader_;
  int64_t micro_batches_;
  bool loads_data_;
  Communicator* dp_last_;
  int64_t ignore_index_;
  bool per_micro_batch_;
  std::map<int64_t, StepData> steps_;
  int64_t loader_epoch_ = -1;  // epoch the loader is in, -1 before the first
  int64_t next_step_ = 0;      // the step the loader returns next
};

}  // namespace strata::parallel
