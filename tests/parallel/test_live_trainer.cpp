// --migrate-at with async-1f1b and --migration live through the Trainer (local ranks): the run's
// per-step losses and final weights (in the new layout) against the Eq. 4 oracle of
// live_stage_checks.h, fed with the very micro-batches the Trainer's loader gives.
#include <gtest/gtest.h>

#include <mutex>

#include "graph/model_spec.h"
#include "live_stage_checks.h"
#include "parallel/comm/local_comm.h"
#include "parallel/micro_batches.h"
#include "pipeline_testing.h"

namespace strata::parallel {
namespace {

using live_stage_checks::Weights;
using testing::LinearClasses;
using testing::LossRecorder;

struct MigrationRecorder final : TrainObserver {
  void on_step(const StepRecord& r) override { losses.push_back(r.loss); }
  void on_migration(const MigrationRecord& r) override { migrations.push_back(r); }
  std::vector<double> losses;
  std::vector<MigrationRecord> migrations;
};

constexpr int64_t kSteps = 6, kMicroBatches = 4;

TrainConfig config() {
  TrainConfig c = testing::train_config(kSteps);
  c.log_every = 1;
  return c;
}

// The MLP of pipeline_testing.h (8 layers) on S local stages, moving at `step` to `next`.
Weights train_live(int S, const std::vector<std::pair<size_t, size_t>>& initial,
                   const Migration& move, MigrationRecorder* recorder,
                   std::pair<size_t, size_t>* stage0_range = nullptr) {
  auto data = std::make_shared<LinearClasses>(512, 12, 5);
  PipelineConfig pipeline = testing::layout(S, 1, kMicroBatches, ScheduleKind::kAsync1F1B);
  pipeline.partition = initial;
  pipeline.migrations = {move};
  pipeline.migration_chunk_bytes = 256;
  pipeline.migration_window_bytes = 1024;
  Weights weights;
  std::mutex mutex;
  LocalWorld world(S);
  run_local_ranks(world, [&](LocalCommunicator& comm) {
    ExecContext ctx(Device::cpu(), nullptr, 1);
    Trainer trainer(ctx, testing::mlp_spec(), data, nullptr, config(), pipeline, &comm,
                    comm.rank() == 0 ? recorder : nullptr);
    trainer.run();
    std::lock_guard<std::mutex> lock(mutex);
    live_stage_checks::add_weights(trainer.store(), &weights);
    if (comm.rank() == 0 && stage0_range != nullptr) {
      *stage0_range = {trainer.store().begin(), trainer.store().end()};
    }
  });
  return weights;
}

// The oracle on the Trainer's own micro-batches (its loader, as Trainer::run sets it up).
live_stage_checks::OracleResult oracle(int S, const std::vector<std::pair<size_t, size_t>>& initial,
                                       const Migration* move) {
  auto data = std::make_shared<LinearClasses>(512, 12, 5);
  const TrainConfig c = config();
  io::DataLoaderOptions options;
  options.batch_size = c.batch_size;
  options.shuffle = true;
  options.seed = c.seed;
  options.num_workers = 0;
  options.drop_last = true;
  LoaderMicroBatches source(data, options, kMicroBatches, true, nullptr, c.loss.ignore_index, true);
  Partition p, next;
  for (const auto& [b, e] : initial) p.push_back({b, e});
  StageLayout layout(p);
  if (move != nullptr) {
    for (const auto& [b, e] : move->partition) next.push_back({b, e});
    layout.add_live_migration(next, move->step * kMicroBatches);
  }
  auto model = graph::build_model(testing::mlp_spec());
  return live_stage_checks::replay(*model, c.seed, layout, source, kSteps * kMicroBatches, c.seed,
                                   c.optimizer.schedule.base_lr, c.optimizer.momentum);
}

void expect_matches_oracle(int S, const std::vector<std::pair<size_t, size_t>>& initial,
                           const Migration& move, const std::string& moves) {
  MigrationRecorder recorder;
  std::pair<size_t, size_t> stage0;
  const Weights piped = train_live(S, initial, move, &recorder, &stage0);
  const live_stage_checks::OracleResult expected = oracle(S, initial, &move);
  // Each step's loss is the mean of its M micro-batches' (summed in order).
  ASSERT_EQ(recorder.losses.size(), static_cast<size_t>(kSteps));
  for (int64_t t = 0; t < kSteps; ++t) {
    double sum = 0.0;
    for (int64_t j = t * kMicroBatches; j < (t + 1) * kMicroBatches; ++j) sum += expected.losses[j];
    EXPECT_EQ(recorder.losses[t], sum / kMicroBatches) << "step " << t + 1;
  }
  EXPECT_EQ(piped, expected.weights) << "the final weights differ from the oracle";
  // The stores end in the new layout; the migration is reported.
  EXPECT_EQ(stage0, move.partition[0]);
  ASSERT_EQ(recorder.migrations.size(), 1u);
  EXPECT_EQ(recorder.migrations[0].moves, moves);
  EXPECT_EQ(recorder.migrations[0].mode, MigrationMode::kLive);
  EXPECT_GT(recorder.migrations[0].bytes, 0.0);
  // Not the run without the move's staleness change.
  EXPECT_NE(piped, oracle(S, initial, nullptr).weights);
}

TEST(LiveTrainer, TwoStagesMoveDownAndUp) {
  expect_matches_oracle(2, {{0, 4}, {4, 8}}, {2, {{0, 2}, {2, 8}}}, "fc2 0->1, relu2 0->1");
  expect_matches_oracle(2, {{0, 4}, {4, 8}}, {3, {{0, 6}, {6, 8}}}, "fc3 1->0, relu3 1->0");
}

TEST(LiveTrainer, FourStagesMoveAtBothEnds) {
  expect_matches_oracle(4, {{0, 2}, {2, 4}, {4, 6}, {6, 8}}, {2, {{0, 3}, {3, 4}, {4, 5}, {5, 8}}},
                        "fc2 1->0, relu3 2->3");
}

}  // namespace
}  // namespace strata::parallel
