// The training driver of one rank: builds its stage of the model, runs the schedule's
// instruction list every step through the Executor, evaluates on the test split, and reports to
// an observer (on rank 0: the CLI's progress bar and metrics file; a user's program may bring its
// own). A single process is the layout G = 1 group x S = 1 stage with one micro-batch, and runs
// the same code.
//
// Layout: G data-parallel groups x S pipeline stages, world rank = g * S + s (parallel/topology.h).
// The global batch B is split into G group shards of B / G rows and each shard into M
// micro-batches. Runs with S * G * M > 1 drop the last partial batch of an epoch (so that every
// micro-batch has rows); the single-process run keeps it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/exec_context.h"
#include "graph/model.h"
#include "graph/optimizer.h"
#include "graph/param_store.h"
#include "io/dataset.h"
#include "io/proto/strata.pb.h"
#include "ops/cross_entropy.h"
#include "parallel/comm/communicator.h"
#include "parallel/grouped_dp.h"
#include "parallel/schedule/schedule.h"

namespace strata::parallel {

struct TrainConfig {
  int64_t epochs = 1;
  int64_t steps = 0;        // > 0: stop after this many optimizer steps (across epochs)
  int64_t batch_size = 64;  // the global batch
  uint64_t seed = 0;
  int64_t log_every = 50;  // steps between log records
  int64_t eval_every = 0;  // steps between evaluations; 0: after each epoch only
  int64_t eval_batch_size = 500;
  int num_workers = 2;  // data-loader threads
  graph::OptimizerConfig optimizer;
  ops::CrossEntropyOptions loss;
};

struct PipelineConfig {
  int stages = 1;
  int groups = 1;
  int64_t micro_batches = 1;
  ScheduleKind schedule = ScheduleKind::k1F1B;
  // Stage boundaries: one [begin, end) layer range per stage, in order. Empty: one stage holding
  // every layer (S = 1 only); tools/ resolves --partition into ranges.
  std::vector<std::pair<size_t, size_t>> partition;
  std::string trace_path;  // Chrome trace of every instruction (written by rank 0)
  // Gradient all-reduce across the groups (parallel/grouped_dp.h): overlap, buckets, delay.
  GradSyncConfig grad_sync;
  GradSyncObserver grad_sync_observer;  // tests: called on every rank's threads
};

// Steps that will run with this config over a dataset of `train_size` samples.
int64_t total_steps(const TrainConfig& config, const PipelineConfig& pipeline, int64_t train_size);

struct StepRecord {
  int64_t step = 0;  // optimizer steps done (1 after the first)
  int64_t total_steps = 0;
  int64_t epoch = 0;
  double loss = 0.0;  // mean over the steps since the last record
  double lr = 0.0;
  double grad_norm = 0.0;
  double samples_per_s = 0.0;  // over the steps since the last record
  double elapsed_s = 0.0;      // training time so far (evaluation excluded)
  double eta_s = 0.0;          // training time left at the current rate
};

struct EvalRecord {
  std::string split;  // "test"
  int64_t step = 0;
  int64_t epoch = 0;
  double loss = 0.0;
  double accuracy = 0.0;  // top-1
  double top5 = 0.0;      // top-5 (0 with fewer than 5 classes)
  int64_t samples = 0;
  double seconds = 0.0;
};

// Per rank, gathered on rank 0 at the end of a run.
struct StageReport {
  int rank = 0, group = 0, stage = 0;
  size_t first_layer = 0, end_layer = 0;
  double busy_seconds = 0.0;  // compute instructions
  double wall_seconds = 0.0;  // inside the schedule's programs
  double idle_fraction() const { return wall_seconds > 0 ? 1.0 - busy_seconds / wall_seconds : 0; }
};

class TrainObserver {
 public:
  virtual ~TrainObserver() = default;
  virtual void on_step(const StepRecord& record) {}  // after every step (progress display)
  virtual void on_log(const StepRecord& record) {}   // every log_every steps and the last
  virtual void on_eval(const EvalRecord& record) {}
};

struct TrainSummary {
  int64_t steps = 0;
  int64_t samples = 0;         // training samples processed (all groups)
  double train_seconds = 0.0;  // evaluation excluded
  double wall_seconds = 0.0;
  std::optional<EvalRecord> last_eval;
  std::vector<StageReport> stages;  // rank 0: every rank's; others: their own
  double measured_bubble = 0.0;     // mean idle fraction over the ranks (rank 0)
  double theoretical_bubble = 0.0;  // the schedule's ideal idle fraction
};

class Trainer {
 public:
  // Builds this rank's stage of the model described by `spec` (layers in pipeline.partition for
  // stage world->rank() % S) with parameters initialized from config.seed. `world` has
  // groups * stages ranks; null for a single process. `test` may be null (no evaluation).
  // `observer` is called on world rank 0 only. The context's allocator holds the stage.
  Trainer(ExecContext& ctx, const proto::ModelSpec& spec, std::shared_ptr<const io::Dataset> train,
          std::shared_ptr<const io::Dataset> test, const TrainConfig& config,
          const PipelineConfig& pipeline, Communicator* world, TrainObserver* observer);
  ~Trainer();

  TrainSummary run();

  graph::Model& model() { return *model_; }
  graph::ParamStore& store() { return *store_; }
  int stage() const { return stage_; }
  int group() const { return group_; }

 private:
  EvalRecord evaluate(int64_t step, int64_t epoch);
  void make_communicators();

  ExecContext& ctx_;
  std::shared_ptr<const io::Dataset> train_, test_;
  TrainConfig config_;
  PipelineConfig pipeline_;
  Communicator* world_;
  TrainObserver* observer_;
  int rank_ = 0, stage_ = 0, group_ = 0;
  std::unique_ptr<graph::Model> model_;
  std::unique_ptr<graph::ParamStore> store_;
  std::unique_ptr<Communicator> pipe_, dp_, dp_last_, tied_, eval_pipe_;
};

}  // namespace strata::parallel
