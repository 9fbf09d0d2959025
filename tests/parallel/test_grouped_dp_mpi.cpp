// Grouped data parallelism on MPI processes (run by ctest through mpirun -np 4): every layout of
// the world trains the single process's weights (fp32 rounding), overlap on and off agree bit for
// bit, every group holds the same replica, and the hooks launch from the last stage backward.
#include <gtest/gtest.h>

#include <cstring>
#include <mutex>

#include "mpi_test_main.h"
#include "parallel/comm/mpi_comm.h"
#include "parallel/grouped_fixtures.h"

namespace strata::parallel {
namespace {

using grouped::layout;
using grouped::mlp_spec;
using grouped::RunResult;
using grouped::same_values;
using grouped::train_config;
using grouped::Values;
using testing::mpi_world;

// This rank's stage of the weights after training in `pipeline` on the MPI world.
Values train_mpi(const PipelineConfig& pipeline, const TrainConfig& config, Communicator* world) {
  auto data = std::make_shared<grouped::LinearClasses>(512, 12, 5);
  RunResult run;
  std::mutex mutex;
  grouped::train_rank(mlp_spec(), data, config, pipeline, world, &run, &mutex);
  return run.groups.begin()->second;
}

// The reference entries of this rank's stage.
Values restrict_to(const Values& all, const Values& mine) {
  Values out;
  for (const auto& [name, v] : mine) out[name] = all.at(name);
  return out;
}

// Sum of the bit patterns of every value: equal on ranks holding the same stage replica.
int64_t fingerprint(const Values& v) {
  uint64_t h = 0;  // wraps (unsigned: defined)
  for (const auto& [name, x] : v) {
    for (float f : x) {
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      h = h * 1000003 + bits;
    }
  }
  return static_cast<int64_t>(h);
}

TEST(GroupedDpMpi, LayoutsMatchTheSingleProcessAndOverlapIsBitwiseNeutral) {
  auto world = mpi_world(std::chrono::seconds(60));
  const int n = world->size();
  const TrainConfig config = train_config(4);
  const Values reference = grouped::train_local(mlp_spec(), layout(1, 1, 1), config).weights();
  for (int stages : {1, 2, 4}) {
    if (n % stages != 0 || stages > 8) continue;
    const int groups = n / stages;
    SCOPED_TRACE(std::to_string(groups) + " x " + std::to_string(stages));
    PipelineConfig on = layout(groups, stages, 2);
    on.grad_sync.bucket_mb = 1e-9;
    PipelineConfig off = on;
    off.grad_sync.overlap = false;
    const Values a = train_mpi(on, config, world.get());
    const Values b = train_mpi(off, config, world.get());
    EXPECT_TRUE(same_values(a, b, 0.0)) << "overlap on vs off";
    EXPECT_TRUE(same_values(a, restrict_to(reference, a), 1e-6));
    // Every group's replica of a stage is the same (rank g * S + s holds stage s of group g).
    Tensor mine = Tensor::from_vector<int64_t>({fingerprint(a)}, {1});
    Tensor all = Tensor::empty({n}, DType::kI64);
    world->all_gather(mine, all)->wait(world->timeout(), "fingerprints");
    const std::vector<int64_t> f = all.to_vector<int64_t>();
    for (int r = 0; r < n; ++r) EXPECT_EQ(f[r], f[r % stages]) << "rank " << r;
  }
}

TEST(GroupedDpMpi, HooksLaunchBeforeThePreviousStageEndsItsBackward) {
  auto world = mpi_world(std::chrono::seconds(60));
  const int n = world->size();
  if (n % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  const int stages = n / 2;
  if (stages < 2) GTEST_SKIP() << "needs at least 2 stages";
  // Per rank: [first launch, last backward end] of update 0, in steady_clock nanoseconds
  // (CLOCK_MONOTONIC: one clock for every process of the machine).
  std::vector<int64_t> mine(2, -1);
  std::mutex mutex;
  PipelineConfig p = layout(2, stages, 2, 8, ScheduleKind::kGPipe);
  p.grad_sync_observer = [&](const GradSyncEvent& e) {
    if (e.update != 0) return;
    const int64_t t = e.time.time_since_epoch().count();
    std::lock_guard<std::mutex> lock(mutex);
    if (e.kind == GradSyncEvent::kLaunch && mine[0] < 0) mine[0] = t;
    if (e.kind == GradSyncEvent::kBackwardEnd) mine[1] = t;
  };
  train_mpi(p, train_config(2), world.get());
  Tensor t = Tensor::from_vector<int64_t>(mine, {2});
  Tensor all = Tensor::empty({2 * n}, DType::kI64);
  world->all_gather(t, all)->wait(world->timeout(), "hook times");
  const std::vector<int64_t> v = all.to_vector<int64_t>();
  for (int g = 0; g < 2; ++g) {
    for (int s = 1; s < stages; ++s) {
      const int r = g * stages + s;
      EXPECT_LT(v[2 * r], v[2 * (r - 1) + 1])
          << "group " << g << ": stage " << s << " launched its all-reduce after stage " << s - 1
          << " ended its backward";
      EXPECT_LT(v[2 * r], v[2 * (r - 1)]) << "launch order, stage " << s;
    }
  }
}

}  // namespace
}  // namespace strata::parallel
