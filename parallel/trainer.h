// The training driver of one process: epochs of batches from a DataLoader, a forward/backward
// and an optimizer step per batch, evaluation on the test split, and reports to an observer
// (the CLI's progress bar and metrics file; a user's program may bring its own).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "engine/exec_context.h"
#include "graph/model.h"
#include "graph/optimizer.h"
#include "graph/param_store.h"
#include "io/dataset.h"
#include "ops/cross_entropy.h"

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

// Steps that will run with this config over a dataset of `train_size` samples.
int64_t total_steps(const TrainConfig& config, int64_t train_size);

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

class TrainObserver {
 public:
  virtual ~TrainObserver() = default;
  virtual void on_step(const StepRecord& record) {}  // after every step (progress display)
  virtual void on_log(const StepRecord& record) {}   // every log_every steps and the last
  virtual void on_eval(const EvalRecord& record) {}
};

struct TrainSummary {
  int64_t steps = 0;
  int64_t samples = 0;         // training samples processed
  double train_seconds = 0.0;  // evaluation excluded
  double wall_seconds = 0.0;
  std::optional<EvalRecord> last_eval;
};

class Trainer {
 public:
  // `test` may be null (no evaluation). The model's parameters must be bound to `store`.
  Trainer(ExecContext& ctx, graph::Model& model, graph::ParamStore& store,
          std::shared_ptr<const io::Dataset> train, std::shared_ptr<const io::Dataset> test,
          const TrainConfig& config, TrainObserver* observer);
  TrainSummary run();
  // Evaluates the model (evaluation mode) over a whole dataset.
  EvalRecord evaluate(const std::string& split, std::shared_ptr<const io::Dataset> data,
                      int64_t step, int64_t epoch);

 private:
  ExecContext& ctx_;
  graph::Model& model_;
  graph::ParamStore& store_;
  std::shared_ptr<const io::Dataset> train_, test_;
  TrainConfig config_;
  TrainObserver* observer_;
};

}  // namespace strata::parallel
