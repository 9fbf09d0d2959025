// SDPipe and its baselines on local threads: group averaging over cached sub-communicators
// (Eq. 2's invariants, concurrent groups on disjoint ranks and on different stages), the rank-0
// service, and whole training runs through the Trainer: T = infinity equals the all-reduce, the
// asynchronous query equals the blocking one and overlaps the backward, stragglers with a trace
// that checks and replays, a scheduler that hangs, PS+SSP's staleness bound, the communicator
// cache (papers/sdpipe.md Sec. 5 items 2-4, 9, 10, 13, 15).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "io/proto/strata.pb.h"
#include "parallel/comm/local_comm.h"
#include "parallel/grouped_fixtures.h"
#include "parallel/runtime/group_average.h"
#include "parallel/runtime/service.h"
#include "parallel/sdpipe/adpsgd_sync.h"
#include "parallel/sdpipe/group_scheduler.h"
#include "parallel/sdpipe/ps_ssp.h"
#include "parallel/sdpipe/sdpipe_sync.h"
#include "parallel/sdpipe/sync_graph.h"
#include "testing/testing.h"

namespace strata::parallel::sdpipe {
namespace {

using grouped::RunResult;
using grouped::same_values;

// ---- group averaging ---------------------------------------------------------------------------

// Item 3 on real tensors: after each group sync the members are bitwise identical, the others
// bitwise unchanged, and the sum over the replicas unchanged (to rounding).
TEST(GroupAverage, MembersEqualOthersUntouchedMeanKept) {
  const int n = 4;
  LocalWorld world(n);
  std::vector<std::vector<float>> before(n), mid(n), after(n);
  std::vector<GroupAverager::Stats> stats(n);
  std::mutex mutex;
  run_local_ranks(world, [&](LocalCommunicator& comm) {
    ExecContext ctx(Device::cpu(), nullptr, 1);
    GroupAverager avg(comm.split(0, comm.rank()));
    const int r = comm.rank();
    const Tensor x = strata::testing::random_tensor({1000}, 10 + r, -1, 1, DType::kF32);
    const Tensor y = strata::testing::random_tensor({7}, 20 + r, -1, 1, DType::kF64);
    {
      std::lock_guard<std::mutex> lock(mutex);
      before[r] = x.to_vector<float>();
    }
    // Two groups at once on disjoint replicas, then a group of three.
    const std::vector<int> pair = r % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3};
    avg.average(ctx, pair, r % 2, {x, y}, "test pair");
    {
      std::lock_guard<std::mutex> lock(mutex);
      mid[r] = x.to_vector<float>();
    }
    if (r != 3) avg.average(ctx, {0, 1, 2}, 7, {x, y}, "test triple");
    if (r != 3) avg.average(ctx, {0, 1, 2}, 7, {x, y}, "test triple again");  // cached
    std::lock_guard<std::mutex> lock(mutex);
    after[r] = x.to_vector<float>();
    stats[r] = avg.stats();
  });
  auto sum = [](const std::vector<std::vector<float>>& v, size_t i) {
    double s = 0;
    for (const auto& x : v) s += x[i];
    return s;
  };
  for (size_t i = 0; i < before[0].size(); ++i) {
    EXPECT_EQ(mid[0][i], mid[2][i]);
    EXPECT_EQ(mid[1][i], mid[3][i]);
    EXPECT_EQ(after[0][i], after[1][i]);
    EXPECT_EQ(after[1][i], after[2][i]);
    EXPECT_EQ(after[3][i], mid[3][i]);  // not a member of the triple: bit for bit
    EXPECT_NEAR(sum(mid, i), sum(before, i), 1e-6);
    EXPECT_NEAR(sum(after, i), sum(before, i), 1e-5);
  }
  EXPECT_EQ(stats[0].created, 2);
  EXPECT_EQ(stats[0].reused, 1);
  EXPECT_EQ(stats[0].averages, 3);
  EXPECT_EQ(stats[3].created, 1);
  EXPECT_EQ(stats[0].live, 2);
}

// Item 9: many rounds of random groups on two stages at once (each rank in one group per round,
// in the same order on every member) never deadlock; repeated groups reuse their communicator,
// and no more communicators live than distinct groups met.
TEST(GroupAverage, ConcurrentGroupsOnStagesNeverDeadlock) {
  const int stages = 2, replicas = 4, rounds = 40;
  LocalWorld world(stages * replicas);
  std::vector<GroupAverager::Stats> stats(stages * replicas);
  std::vector<std::set<std::vector<int>>> met(stages * replicas);
  std::mutex mutex;
  run_local_ranks(world, [&](LocalCommunicator& comm) {
    comm.set_timeout(std::chrono::seconds(20));
    ExecContext ctx(Device::cpu(), nullptr, 1);
    const int stage = comm.rank() % stages, replica = comm.rank() / stages;
    std::unique_ptr<Communicator> dp = comm.split(stage, replica);
    GroupAverager avg(dp->split(0, replica));
    const Tensor x = strata::testing::random_tensor({300}, comm.rank(), -1, 1, DType::kF32);
    std::set<std::vector<int>> mine;
    for (int k = 0; k < rounds; ++k) {
      // The round's partition of the replicas into groups, the same on every rank of the stage.
      std::mt19937 rng(static_cast<uint32_t>(1000 * stage + k));
      std::vector<int> order(replicas);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      const int cut = static_cast<int>(rng() % replicas);
      std::vector<int> group;
      const bool first =
          std::find(order.begin(), order.begin() + cut, replica) != order.begin() + cut;
      group.assign(first ? order.begin() : order.begin() + cut,
                   first ? order.begin() + cut : order.end());
      std::sort(group.begin(), group.end());
      int64_t key = 0;
      for (int m : group) key |= int64_t{1} << m;
      if (group.size() > 1) mine.insert(group);
      avg.average(ctx, group, key, {x}, "round " + std::to_string(k));
    }
    std::lock_guard<std::mutex> lock(mutex);
    stats[comm.rank()] = avg.stats();
    met[comm.rank()] = mine;
  });
  for (int r = 0; r < stages * replicas; ++r) {
    EXPECT_GT(stats[r].reused, 0) << "rank " << r;
    EXPECT_EQ(stats[r].live, static_cast<int64_t>(met[r].size())) << "rank " << r;
    EXPECT_EQ(stats[r].created, static_cast<int64_t>(met[r].size())) << "rank " << r;
  }
}

TEST(GroupAverage, RefusesAGroupWithoutThisReplica) {
  LocalWorld world(1);
  run_local_ranks(world, [&](LocalCommunicator& comm) {
    ExecContext ctx(Device::cpu(), nullptr, 1);
    GroupAverager avg(comm.split(0, 0));
    const Tensor x = Tensor::zeros({3});
    EXPECT_THROW(avg.average(ctx, {1}, 0, {x}, "bad"), Error);
    avg.average(ctx, {0}, 0, {x}, "alone");  // nothing to do
    EXPECT_EQ(avg.stats().averages, 0);
  });
}

// ---- the service on rank 0 ---------------------------------------------------------------------

class Echo final : public ServiceHandler {
 public:
  void on_request(ServiceHost& host, int rank, ServiceMessage m, double) override {
    if (m.payload.defined()) {
      float* p = m.payload.data<float>();
      for (int64_t i = 0; i < m.payload.numel(); ++i) p[i] *= 2;
    }
    m.bytes += "@" + std::to_string(rank);
    host.reply(rank, std::move(m));
  }
};

TEST(Service, EveryRankIsAnsweredInOrderWithPayloads) {
  LocalWorld world(3);
  run_local_ranks(world, [&](LocalCommunicator& comm) {
    std::unique_ptr<Communicator> sc = comm.split(0, comm.rank());
    Echo echo;
    std::unique_ptr<ServiceHost> host;
    std::unique_ptr<ServiceClient> client;
    if (comm.rank() == 0) {
      host = std::make_unique<ServiceHost>(std::move(sc), "the echo");
      host->start(&echo);
      client = std::make_unique<ServiceClient>(nullptr, host.get(), "the echo",
                                               std::chrono::seconds(10));
    } else {
      client =
          std::make_unique<ServiceClient>(sc.get(), nullptr, "the echo", std::chrono::seconds(10));
    }
    for (int i = 0; i < 5; ++i) {
      ServiceMessage m;
      m.bytes = "m" + std::to_string(i);
      m.payload = Tensor::full({4}, i + comm.rank(), DType::kF32);
      client->send(m);
    }
    for (int i = 0; i < 5; ++i) {
      const Tensor into = Tensor::zeros({4});
      const ServiceMessage r = client->receive(into, "echo " + std::to_string(i));
      EXPECT_EQ(r.bytes, "m" + std::to_string(i) + "@" + std::to_string(comm.rank()));
      EXPECT_EQ(into.to_vector<float>(), std::vector<float>(4, 2.0f * (i + comm.rank())));
    }
    comm.barrier("echo done");
    if (host) host->stop();
  });
}

// ---- training runs -----------------------------------------------------------------------------

// A strategy that hands its inner one's findings to `on_finish` before its finish (what the run
// itself did, before the final average) or, with `after`, once its finish is done (rank 0's
// services have then heard from every rank).
class Spy final : public UpdateSync {
 public:
  Spy(std::unique_ptr<UpdateSync> inner, std::function<void(UpdateSync&)> on_finish,
      bool after = false)
      : inner_(std::move(inner)), on_finish_(std::move(on_finish)), after_(after) {}
  std::string name() const override { return inner_->name(); }
  void last_backward_begins(int64_t u) override { inner_->last_backward_begins(u); }
  void after_update(int64_t u) override { inner_->after_update(u); }
  void finish() override {
    if (done_) return;
    done_ = true;
    if (!after_) on_finish_(*inner_);
    inner_->finish();
    if (after_) on_finish_(*inner_);
  }
  SyncStats stats() const override { return inner_->stats(); }

 private:
  std::unique_ptr<UpdateSync> inner_;
  std::function<void(UpdateSync&)> on_finish_;
  bool after_;
  bool done_ = false;
};

UpdateSyncFactory spied(const SyncConfig& config, std::function<void(UpdateSync&)> on_finish,
                        bool after = false) {
  UpdateSyncFactory inner = make_update_sync_factory(config);
  return [inner, on_finish, after](const UpdateSyncContext& c) -> std::unique_ptr<UpdateSync> {
    return std::make_unique<Spy>(inner(c), on_finish, after);
  };
}

SyncConfig sync_of(SyncKind kind) {
  SyncConfig c;
  c.kind = kind;
  return c;
}

PipelineConfig with_sync(PipelineConfig p, const SyncConfig& sync) {
  p.update_sync = make_update_sync_factory(sync);
  return p;
}

// Items 2, 13: with T = infinity (every group is all N), no stragglers and SGD with momentum,
// SDPipe's local update then averaging gives the weights of the all-reduce of gradients, to fp32
// rounding; so do AD-PSGD with two pipelines (the pair is everyone) and PS+SSP with s = 0.
TEST(SdpipeTraining, InfiniteWindowMatchesTheAllReduce) {
  const proto::ModelSpec spec = grouped::mlp_spec();
  const TrainConfig config = grouped::train_config(8);
  const PipelineConfig base = grouped::layout(2, 2, 2);
  const RunResult reference = grouped::train_local(spec, base, config);
  SyncConfig sdpipe = sync_of(SyncKind::kSdpipe);
  sdpipe.window_kind = WindowKind::kInfinite;
  SyncConfig ps = sync_of(SyncKind::kPsSsp);
  ps.staleness = 0;
  for (const SyncConfig& sync : {sdpipe, sync_of(SyncKind::kAdpsgd), ps}) {
    const RunResult run = grouped::train_local(spec, with_sync(base, sync), config);
    for (int g = 0; g < 2; ++g) {
      // The bound: a few ulps of the weights (|w| < 2) per step, eight steps.
      const ::testing::AssertionResult same =
          same_values(run.groups.at(g), reference.weights(), 2e-6);
      EXPECT_TRUE(same) << sync_name(sync.kind) << ", group " << g;
      std::printf("%s, group %d against the all-reduce: %s\n", sync_name(sync.kind), g,
                  same.message());
    }
  }
}

// Item 10: the asynchronous query (sent when the step's last backward starts) decides what the
// blocking one (sent after the local update) decides: with T = infinity both give every replica,
// so the weights are bitwise equal. And the asynchronous query is sent before that backward ends.
TEST(SdpipeTraining, AsyncQueryEqualsBlockingAndOverlapsTheBackward) {
  const proto::ModelSpec spec = grouped::mlp_spec();
  const TrainConfig config = grouped::train_config(6);
  SyncConfig sync = sync_of(SyncKind::kSdpipe);
  sync.window_kind = WindowKind::kInfinite;
  std::mutex mutex;
  std::map<std::thread::id, int> rank_of_thread;
  std::map<int, std::vector<SdpipeSync::Query>> queries;
  std::map<std::pair<int, int64_t>, double> backward_end;  // (rank, update) -> last end
  PipelineConfig p = grouped::layout(2, 2, 2);
  UpdateSyncFactory inner = make_update_sync_factory(sync);
  p.update_sync = [&](const UpdateSyncContext& c) -> std::unique_ptr<UpdateSync> {
    const int rank = c.group * c.stages + c.stage;
    {
      std::lock_guard<std::mutex> lock(mutex);
      rank_of_thread[std::this_thread::get_id()] = rank;
    }
    return std::make_unique<Spy>(inner(c), [&, rank](UpdateSync& s) {
      std::lock_guard<std::mutex> lock(mutex);
      queries[rank] = dynamic_cast<SdpipeSync&>(s).queries();
    });
  };
  p.grad_sync_observer = [&](const GradSyncEvent& e) {
    if (e.kind != GradSyncEvent::kBackwardEnd) return;
    const double t = std::chrono::duration<double>(e.time.time_since_epoch()).count();
    std::lock_guard<std::mutex> lock(mutex);
    double& end = backward_end[{rank_of_thread.at(std::this_thread::get_id()), e.update}];
    end = std::max(end, t);
  };
  const RunResult async = grouped::train_local(spec, p, config);
  sync.async_query = false;
  const RunResult blocking =
      grouped::train_local(spec, with_sync(grouped::layout(2, 2, 2), sync), config);
  EXPECT_TRUE(same_values(async.groups.at(0), blocking.groups.at(0), 0.0));
  EXPECT_TRUE(same_values(async.groups.at(1), blocking.groups.at(1), 0.0));
  ASSERT_EQ(queries.size(), 4u);
  for (const auto& [rank, qs] : queries) {
    ASSERT_EQ(qs.size(), 6u);
    for (const SdpipeSync::Query& q : qs) {
      const double end = backward_end.at({rank, q.update});
      EXPECT_LT(q.sent, end) << "rank " << rank << ", update " << q.update;
      EXPECT_LE(q.sent, q.answered);
      EXPECT_LE(q.answered, q.averaged);
      EXPECT_EQ(q.members, std::vector<int>({0, 1}));
    }
  }
}

// Items 4, 6, 15 in a real run: 4 pipelines x 2 stages with stragglers and a short window; the
// trace the scheduler wrote passes the offline check (every READY answered once, every checked
// group connects with the P - 1 before it) and replays to the same decisions; the run ends with
// one model.
TEST(SdpipeTraining, StragglersTraceChecksAndReplays) {
  const std::string trace = ::testing::TempDir() + "sdpipe_trace.jsonl";
  SyncConfig sync = sync_of(SyncKind::kSdpipe);
  sync.window_kind = WindowKind::kFixed;
  sync.window = 0.003;
  sync.history = 3;
  sync.trace = trace;
  PipelineConfig p = with_sync(grouped::layout(4, 2, 2), sync);
  p.inject = parse_inject("kind=straggler,p=0.15,delay=0.01");
  const RunResult run = grouped::train_local(grouped::mlp_spec(), p, grouped::train_config(10));
  for (int g = 1; g < 4; ++g) EXPECT_TRUE(same_values(run.groups.at(g), run.groups.at(0), 0.0));
  const std::vector<TraceEvent> events = read_sync_trace(trace);
  const TraceCheck c = check_sync_trace(events, 4, 3);
  EXPECT_TRUE(c.violations.empty()) << c.violations.front();
  EXPECT_EQ(c.readies, 4 * 2 * 10);
  EXPECT_GE(c.mean_group, 1.0);
  SchedulerConfig sc;
  sc.stages = 2;
  sc.replicas = 4;
  sc.window_kind = WindowKind::kFixed;
  sc.window = 0.003;
  sc.history = 3;
  const std::vector<std::string> replay = replay_sync_trace(events, sc);
  EXPECT_TRUE(replay.empty()) << replay.front();
}

// The scheduler stops answering after a few requests: every rank fails within the timeout with
// an error that names the scheduler.
TEST(SdpipeTraining, ASchedulerThatHangsEndsEveryRank) {
  SyncConfig sync = sync_of(SyncKind::kSdpipe);
  sync.hang_after = 5;
  const PipelineConfig p = with_sync(grouped::layout(2, 2, 1), sync);
  auto data = std::make_shared<grouped::LinearClasses>(512, 12, 5);
  LocalWorld world(4);
  const auto start = std::chrono::steady_clock::now();
  try {
    run_local_ranks(world, [&](LocalCommunicator& comm) {
      comm.set_timeout(std::chrono::milliseconds(1500));
      ExecContext ctx(Device::cpu(), nullptr, 1);
      Trainer trainer(ctx, grouped::mlp_spec(), data, nullptr, grouped::train_config(10), p, &comm,
                      nullptr);
      trainer.run();
    });
    ADD_FAILURE() << "the run finished without its scheduler";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("SDPipe scheduler"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

// Item 13: PS+SSP never lets a replica pull the weights of clock c before the slowest replica
// of its stage has pushed clock c - s, even with stragglers; and some pulls had to wait.
TEST(SdpipeTraining, SspNeverExceedsTheStalenessBound) {
  for (int s : {0, 2}) {
    SyncConfig sync = sync_of(SyncKind::kPsSsp);
    sync.staleness = s;
    std::vector<ParameterServer::Pull> pulls;
    SyncStats stats;
    PipelineConfig p = grouped::layout(4, 2, 1);
    // After finish: rank 0's server has then answered every pull of every rank.
    p.update_sync = spied(
        sync,
        [&](UpdateSync& u) {
          auto& ps = dynamic_cast<PsSspSync&>(u);
          if (ps.server() != nullptr) {
            pulls = ps.server()->pulls();
            stats = ps.server()->stats();
          }
        },
        true);
    p.inject = parse_inject("kind=straggler,p=0.2,delay=0.01");
    grouped::train_local(grouped::mlp_spec(), p, grouped::train_config(12));
    ASSERT_EQ(pulls.size(), 4u * 2u * 12u);
    int64_t widest = 0;
    for (const auto& pull : pulls) {
      EXPECT_LE(pull.clock - pull.min_clock, s) << "stage " << pull.stage;
      widest = std::max(widest, pull.clock - pull.min_clock);
    }
    EXPECT_GT(stats.staleness_waits, 0) << "s = " << s;
    std::printf("ssp s=%d: widest gap %lld, %lld pulls waited\n", s, static_cast<long long>(widest),
                static_cast<long long>(stats.staleness_waits));
  }
}

// Item 9: with room for two communicators per stage, the scheduler releases the least recently
// used ones; every member drops and re-creates them at the same point, so the run goes on, and
// no rank ever holds more than two.
TEST(SdpipeTraining, GroupCommunicatorsAreCachedAndReleased) {
  SyncConfig sync = sync_of(SyncKind::kSdpipe);
  sync.window_kind = WindowKind::kFixed;
  sync.window = 0.004;
  sync.history = 0;
  sync.comm_cache = 2;
  std::mutex mutex;
  std::vector<GroupAverager::Stats> stats;
  PipelineConfig p = grouped::layout(4, 1, 1, 8);
  p.partition = {{0, 8}};
  p.update_sync = spied(sync, [&](UpdateSync& u) {
    std::lock_guard<std::mutex> lock(mutex);
    stats.push_back(dynamic_cast<SdpipeSync&>(u).averager().stats());
  });
  p.inject = parse_inject("kind=straggler,p=0.3,delay=0.01");
  grouped::train_local(grouped::mlp_spec(), p, grouped::train_config(30));
  ASSERT_EQ(stats.size(), 4u);
  int64_t created = 0, released = 0, reused = 0;
  for (const GroupAverager::Stats& s : stats) {
    EXPECT_LE(s.live, 2);
    created += s.created;
    released += s.released;
    reused += s.reused;
  }
  EXPECT_GT(reused, 0);
  EXPECT_GT(released, 0);
  std::printf("cache of 2: %lld created, %lld reused, %lld released over 4 ranks\n",
              static_cast<long long>(created), static_cast<long long>(reused),
              static_cast<long long>(released));
}

TEST(Adpsgd, PartnersAreASharedRandomMatching) {
  for (int n : {2, 3, 4, 7, 8}) {
    for (int64_t u = 0; u < 20; ++u) {
      int alone = 0;
      for (int r = 0; r < n; ++r) {
        const int p = adpsgd_partner(9, u, n, r);
        if (p < 0) {
          ++alone;
          continue;
        }
        EXPECT_NE(p, r);
        EXPECT_EQ(adpsgd_partner(9, u, n, p), r);
      }
      EXPECT_EQ(alone, n % 2);
    }
  }
  // Different updates give different matchings.
  std::set<int> partners_of_0;
  for (int64_t u = 0; u < 30; ++u) partners_of_0.insert(adpsgd_partner(1, u, 8, 0));
  EXPECT_GT(partners_of_0.size(), 3u);
}

}  // namespace
}  // namespace strata::parallel::sdpipe
