// What `strata train` reports beside the console (tools/progress.h), as TrainObservers:
//
//   --tensorboard DIR   TensorBoard scalars (io/tensorboard.h), rank 0 writes DIR/events.out...:
//                       train/loss, train/lr, train/grad_norm, train/samples_per_s,
//                       train/skipped_steps, train/loss_scale (the --metrics values, same steps),
//                       eval/loss, eval/accuracy, eval/top5, eval/perplexity (text), and per rank
//                       over each log interval rank{r}/busy_fraction, rank{r}/idle_fraction
//                       (compute time / step time, as the end-of-run table), rank{r}/memory_mib
//                       and rank{r}/peak_memory_mib (the rank's device allocator).
//   --sample-every N    every N steps (and after the last), group 0's pipeline generates a short
//                       text from <|endoftext|> with a key/value cache per stage
//                       (graph/decoding.h): each stage runs its layers on the new position and
//                       sends the hidden state on, the last stage samples the token and sends it
//                       back to the first. Rank 0 prints it ("sample | step N | text") and writes
//                       it to --metrics.
//
// Both gather from every rank, so every rank has a TrainReports (Trainer::on_rank_step), joined
// by communicators split from the world before the Trainer is made.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/exec_context.h"
#include "graph/decoding.h"
#include "io/bpe.h"
#include "io/metrics.h"
#include "io/tensorboard.h"
#include "parallel/comm/communicator.h"
#include "parallel/trainer.h"

namespace strata::tools {

struct TrainReportsConfig {
  std::string tensorboard;  // directory; empty: none
  int64_t sample_every = 0;
  int64_t sample_tokens = 64;
  std::string vocab_dir;  // GPT-2's BPE, for --sample-every
  int64_t log_every = 100;
  int64_t total_steps = 0;
  bool text = false;  // eval/perplexity
  uint64_t seed = 0;
  int64_t positions = 0;  // the model's (a sample is at most positions - 1 tokens)
};

class TrainReports final : public parallel::TrainObserver {
 public:
  // `console` (rank 0; null elsewhere) gets the console callbacks first. `world` may be null (one
  // rank); collective over it when not. `metrics` (rank 0, may be null) gets the samples.
  TrainReports(const TrainReportsConfig& config, parallel::TrainObserver* console,
               io::JsonlWriter* metrics, parallel::Communicator* world, int stages);
  // This rank's stage: the model, its layers [begin, end) and the context they run on (for
  // --sample-every). Call once the Trainer is made.
  void attach(ExecContext& ctx, graph::Model& model, graph::ParamStore& store, size_t begin,
              size_t end);

  void on_step(const parallel::StepRecord& r) override;
  void on_log(const parallel::StepRecord& r) override;
  void on_eval(const parallel::EvalRecord& r) override;
  void on_migration(const parallel::MigrationRecord& r) override;
  void on_repartition(const parallel::RepartitionRecord& r) override;
  void on_rank_step(const parallel::RankStepRecord& r) override;

 private:
  void report_ranks(const parallel::RankStepRecord& r);
  std::string sample(int64_t step, int stage);

  TrainReportsConfig config_;
  parallel::TrainObserver* console_;
  io::JsonlWriter* metrics_;
  std::unique_ptr<parallel::Communicator> all_;       // every rank (a split of the world)
  std::unique_ptr<parallel::Communicator> pipeline_;  // group 0's stages in order; null elsewhere
  int stages_;
  int rank_ = 0;
  std::unique_ptr<io::TensorBoardWriter> tensorboard_;  // rank 0
  std::unique_ptr<io::BpeTokenizer> tokenizer_;         // rank 0 (--sample-every)
  ExecContext* ctx_ = nullptr;
  graph::Model* model_ = nullptr;
  graph::ParamStore* store_ = nullptr;
  size_t begin_ = 0, end_ = 0;
  double busy_ = 0.0, wall_ = 0.0;  // this rank, since the last log step
};

// The end-of-run table of rank 0: per rank utilization and memory (peak device bytes, swapped
// bytes, recompute time, the most micro-batches whose saved tensors it held), also written as
// {"type":"stage",...} metrics records; printed for pipelines and memory plans only.
void print_stages(const parallel::TrainSummary& summary,
                  const std::vector<std::string>& layer_names,
                  const parallel::PipelineConfig& pipeline, io::JsonlWriter* metrics);

}  // namespace strata::tools
