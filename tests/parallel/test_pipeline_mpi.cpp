// Pipelines over MPI ranks (run under mpirun with 2, 3 and 4 ranks) against the single process.
// Every rank trains the single-process reference itself (no communicator, same seed and data),
// then its stage of the pipeline over the MPI world, and compares: the per-step losses (rank 0,
// which the trainer reports to), the weights of its own stage, and GPipe against 1F1B.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "graph/model_spec.h"
#include "graph/param_store.h"
#include "mpi_test_main.h"
#include "parallel/trainer.h"
#include "pipeline_testing.h"

namespace strata::parallel {
namespace {

using testing::layout;
using testing::same_weights;
using testing::Weights;

constexpr int64_t kSteps = 4;
// fp32 rounding: micro-batches change the order in which gradients (and a step's loss) are
// summed, so a pipeline matches the single process to about 1e-7 after a few steps, not bitwise.
constexpr double kWeightTolerance = 1e-6;
constexpr double kLossTolerance = 1e-6;  // relative

struct RunResult {
  Weights weights;             // this rank's stage
  std::vector<double> losses;  // per step; world rank 0 only (the trainer reports there)
  int stage = 0, group = 0;
};

// Trains the MLP for kSteps steps in `pipeline`'s layout over `world` (null: one process).
RunResult train(const PipelineConfig& pipeline, Communicator* world) {
  auto data = std::make_shared<testing::LinearClasses>(512, 12, 5);
  TrainConfig config = testing::train_config(kSteps);
  config.log_every = 1;
  testing::LossRecorder recorder;
  ExecContext ctx(Device::cpu(), nullptr, 1);
  Trainer trainer(ctx, testing::mlp_spec(), data, nullptr, config, pipeline, world, &recorder);
  trainer.run();
  return {testing::store_weights(trainer.store()), recorder.losses, trainer.stage(),
          trainer.group()};
}

RunResult reference() {
  PipelineConfig single;
  return train(single, nullptr);
}

Weights initial_weights() {
  auto model = graph::build_model(testing::mlp_spec());
  graph::ParamStore store(*model, 0, model->size(), default_cpu_allocator());
  store.initialize(testing::train_config(kSteps).seed);
  return testing::store_weights(store);
}

::testing::AssertionResult same_losses(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) {
    return ::testing::AssertionFailure() << a.size() << " losses against " << b.size();
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (!(std::fabs(a[i] - b[i]) <= kLossTolerance * std::max(1.0, std::fabs(b[i])))) {
      return ::testing::AssertionFailure()
             << "step " << i + 1 << ": loss " << a[i] << " against " << b[i];
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(PipelineMpi, OneGroupMatchesTheSingleProcessAndGPipeEquals1F1B) {
  auto probe = parallel::testing::mpi_world();
  const int S = probe->size(), rank = probe->rank();
  const RunResult ref = reference();
  ASSERT_EQ(ref.losses.size(), static_cast<size_t>(kSteps));
  // The reference trained: its weights left their initial values.
  EXPECT_FALSE(same_weights(ref.weights, initial_weights(), 1e-4));

  auto world = parallel::testing::mpi_world();
  const RunResult gpipe = train(layout(S, 1, 4, ScheduleKind::kGPipe), world.get());
  world = parallel::testing::mpi_world();
  const RunResult one_f_one_b = train(layout(S, 1, 4, ScheduleKind::k1F1B), world.get());

  EXPECT_EQ(gpipe.stage, rank);
  ASSERT_FALSE(gpipe.weights.empty()) << "stage " << rank << " holds no parameters";
  EXPECT_TRUE(same_weights(gpipe.weights, testing::restrict_to(ref.weights, gpipe.weights),
                           kWeightTolerance))
      << "gpipe, stage " << rank << " of " << S;
  EXPECT_TRUE(same_weights(one_f_one_b.weights,
                           testing::restrict_to(ref.weights, one_f_one_b.weights),
                           kWeightTolerance))
      << "1f1b, stage " << rank << " of " << S;
  // Both schedules run the same micro-batches and accumulate in the same order.
  EXPECT_TRUE(same_weights(gpipe.weights, one_f_one_b.weights, 0.0))
      << "gpipe against 1f1b, stage " << rank;
  if (rank == 0) {
    EXPECT_TRUE(same_losses(gpipe.losses, ref.losses)) << "gpipe";
    EXPECT_TRUE(same_losses(one_f_one_b.losses, ref.losses)) << "1f1b";
    EXPECT_EQ(gpipe.losses, one_f_one_b.losses) << "gpipe against 1f1b, bit for bit";
  } else {
    EXPECT_TRUE(gpipe.losses.empty()) << "only world rank 0 reports";
  }
}

TEST(PipelineMpi, TwoGroupsOfTwoStagesMatchTheSingleProcess) {
  auto world = parallel::testing::mpi_world();
  if (world->size() != 4) GTEST_SKIP() << "needs 4 ranks (G=2 x S=2)";
  const int rank = world->rank();
  const RunResult ref = reference();
  const RunResult piped = train(layout(2, 2, 2, ScheduleKind::k1F1B), world.get());
  EXPECT_EQ(piped.stage, rank % 2);
  EXPECT_EQ(piped.group, rank / 2);
  ASSERT_FALSE(piped.weights.empty());
  EXPECT_TRUE(same_weights(piped.weights, testing::restrict_to(ref.weights, piped.weights),
                           kWeightTolerance))
      << "group " << piped.group << ", stage " << piped.stage;
  if (rank == 0) {
    EXPECT_TRUE(same_losses(piped.losses, ref.losses));
  }
}

}  // namespace
}  // namespace strata::parallel
