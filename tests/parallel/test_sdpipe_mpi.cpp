// SDPipe on MPI processes (ctest: mpirun -np 4): group averaging over MPI_Comm_create_group
// communicators (concurrent groups, Eq. 2's invariants), the scheduler service over MPI with
// protobuf messages, and training runs: T = infinity equals the all-reduce; stragglers with a
// trace that passes the offline check; the four --sync strategies run to the end.
#include <gtest/gtest.h>

#include <cstring>
#include <mutex>

#include "mpi_test_main.h"
#include "parallel/comm/mpi_comm.h"
#include "parallel/grouped_fixtures.h"
#include "parallel/runtime/group_average.h"
#include "parallel/sdpipe/sync_config.h"
#include "parallel/sdpipe/sync_graph.h"
#include "testing/testing.h"

namespace strata::parallel::sdpipe {
namespace {

using grouped::RunResult;
using grouped::same_values;
using grouped::Values;
using parallel::testing::mpi_world;

Values train_mpi(const PipelineConfig& pipeline, const TrainConfig& config, Communicator* world) {
  auto data = std::make_shared<grouped::LinearClasses>(512, 12, 5);
  RunResult run;
  std::mutex mutex;
  grouped::train_rank(grouped::mlp_spec(), data, config, pipeline, world, &run, &mutex);
  return run.groups.begin()->second;
}

// Every rank's values gathered: fingerprints of the bits, to compare replicas.
std::vector<double> gather(Communicator& world, double mine) {
  Tensor all = Tensor::zeros({world.size()}, DType::kF64);
  all.data<double>()[world.rank()] = mine;
  world.all_reduce(all)->wait(world.timeout(), "gather");
  return all.to_vector<double>();
}

double checksum(const Tensor& t) {
  double s = 0;
  for (float f : t.to_vector<float>()) s = s * 1.000001 + f;
  return s;
}

TEST(SdpipeMpi, ConcurrentGroupAveragesOverMpiSubcommunicators) {
  auto world = mpi_world();
  const int n = world->size();
  if (n < 4) GTEST_SKIP() << "needs 4 ranks";
  ExecContext ctx(Device::cpu(), nullptr, 1);
  GroupAverager avg(world->split(0, world->rank()));
  const int r = world->rank();
  const Tensor x = strata::testing::random_tensor({2000}, 50 + r, -1, 1, DType::kF32);
  Tensor total_before = x.clone();
  world->all_reduce(total_before)->wait(world->timeout(), "sum");
  // Round 1: pairs {0,1} and {2,3} at once; round 2: {1,2,3}; round 3: {0,1} again (cached).
  const std::vector<int> pair = r < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3};
  if (r < 4) avg.average(ctx, pair, r < 2 ? 1 : 2, {x}, "pairs");
  const std::vector<double> after_pairs = gather(*world, checksum(x));
  EXPECT_EQ(after_pairs[0], after_pairs[1]);
  EXPECT_EQ(after_pairs[2], after_pairs[3]);
  const Tensor before_triple = x.clone();
  if (r >= 1 && r <= 3) avg.average(ctx, {1, 2, 3}, 3, {x}, "triple");
  const std::vector<double> after_triple = gather(*world, checksum(x));
  EXPECT_EQ(after_triple[1], after_triple[2]);
  EXPECT_EQ(after_triple[2], after_triple[3]);
  if (r == 0 || r >= 4) EXPECT_EQ(x.to_vector<float>(), before_triple.to_vector<float>());
  if (r < 2) avg.average(ctx, {0, 1}, 1, {x}, "pair again");
  if (r < 2) {
    EXPECT_EQ(avg.stats().reused, 1);
  }
  Tensor total_after = x.clone();
  world->all_reduce(total_after)->wait(world->timeout(), "sum");
  const std::vector<float> a = total_before.to_vector<float>(), b = total_after.to_vector<float>();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-4) << i;
}

// T = infinity and SGD: SDPipe over MPI gives the all-reduce's weights (fp32 rounding).
TEST(SdpipeMpi, InfiniteWindowMatchesTheAllReduce) {
  auto world = mpi_world(std::chrono::seconds(60));
  if (world->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const TrainConfig config = grouped::train_config(6);
  const Values reference = train_mpi(grouped::layout(2, 2, 2), config, world.get());
  SyncConfig sync;
  sync.kind = SyncKind::kSdpipe;
  sync.window_kind = WindowKind::kInfinite;
  PipelineConfig p = grouped::layout(2, 2, 2);
  p.update_sync = make_update_sync_factory(sync);
  const Values mine = train_mpi(p, config, world.get());
  EXPECT_TRUE(same_values(mine, reference, 2e-6));
}

// Stragglers on 4 pipelines x 1 stage over MPI: the trace written on rank 0 passes the offline
// check, and every strategy ends with identical replicas.
TEST(SdpipeMpi, StragglersTraceChecksAndEveryStrategyEnds) {
  auto world = mpi_world(std::chrono::seconds(60));
  if (world->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const std::string trace = ::testing::TempDir() + "sdpipe_mpi_trace.jsonl";
  for (SyncKind kind : {SyncKind::kSdpipe, SyncKind::kAdpsgd, SyncKind::kPsSsp}) {
    SyncConfig sync;
    sync.kind = kind;
    sync.window_kind = WindowKind::kFixed;
    sync.window = 0.003;
    sync.history = 3;
    sync.staleness = 1;
    if (kind == SyncKind::kSdpipe) sync.trace = trace;
    PipelineConfig p = grouped::layout(4, 1, 1);
    p.update_sync = make_update_sync_factory(sync);
    p.inject = parse_inject("kind=straggler,p=0.2,delay=0.01");
    const Values mine = train_mpi(p, grouped::train_config(10), world.get());
    double h = 0;
    for (const auto& [name, v] : mine) {
      for (float f : v) h = h * 1.000001 + f;
    }
    const std::vector<double> all = gather(*world, h);
    for (double x : all) EXPECT_EQ(x, all[0]) << sync_name(kind);
    if (kind == SyncKind::kSdpipe && world->rank() == 0) {
      const TraceCheck c = check_sync_trace(read_sync_trace(trace), 4, 3);
      EXPECT_TRUE(c.violations.empty()) << c.violations.front();
      EXPECT_EQ(c.readies, 4 * 10);
    }
  }
}

}  // namespace
}  // namespace strata::parallel::sdpipe
