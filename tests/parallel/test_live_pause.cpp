// DynPipe's paused-update migration (--migration dynpipe) inside async-1f1b's executor on local
// ranks (threads), against the one-process replay of live_pause_checks.h.
#include <gtest/gtest.h>

#include <cstdio>

#include "live_pause_checks.h"
#include "parallel/comm/local_comm.h"

namespace strata::parallel {
namespace {

using live_pause_checks::Case;
using live_pause_checks::RankResult;

void check_case(const Case& c, int sleep_ms = 0) {
  SCOPED_TRACE(c.name + (sleep_ms > 0 ? ", a slower pipeline" : ""));
  std::vector<RankResult> results(static_cast<size_t>(c.stages()));
  LocalWorld world(c.stages());
  run_local_ranks(world, [&](LocalCommunicator& comm) {
    results[static_cast<size_t>(comm.rank())] = live_pause_checks::run_rank(comm, c, sleep_ms);
  });
  std::vector<LiveStageStats> stats;
  for (const RankResult& r : results) stats.push_back(r.stats);
  live_pause_checks::check_counts(c, stats);
  const live_pause_checks::Points p = live_pause_checks::points(c, stats);
  std::printf("%s: P %lld, K %lld, R %lld\n", c.name.c_str(), static_cast<long long>(c.pause_at),
              static_cast<long long>(p.take_over), static_cast<long long>(p.resume));
  const live_pause_checks::Replay expected = live_pause_checks::replay(c, p);
  for (size_t s = 0; s < results.size(); ++s) {
    live_pause_checks::check_rank(c, static_cast<int>(s), results[s], expected);
  }
  // The replay tells the protocols apart: without the source's flush, or with the updates never
  // paused (vPIPE's Eq. 4 with K = P), the moved layers end elsewhere.
  live_stage_checks::Weights piped;
  for (const RankResult& r : results) piped.insert(r.weights.begin(), r.weights.end());
  EXPECT_NE(piped, live_pause_checks::replay(c, p, true).weights) << "the flush changed nothing";
  const live_stage_checks::Case vpipe{c.name, c.initial, c.next, c.pause_at, c.micro_batches};
  EXPECT_NE(piped, live_stage_checks::oracle(vpipe, true).weights) << "the pause changed nothing";
}

TEST(LivePause, TwoStagesMatchTheReplay) {
  for (const Case& c : live_pause_checks::cases(2)) check_case(c);
}

// The inputs 2 ms late: the state usually arrives while the pipeline trains, and the take-over
// comes before the run's end forces it (which of the two happened, the replay does not care).
TEST(LivePause, ASlowerPipelineMatchesTheReplay) {
  for (const Case& c : live_pause_checks::cases(2)) check_case(c, 2);
}

TEST(LivePause, FourStagesMatchTheReplay) {
  for (const Case& c : live_pause_checks::cases(4)) check_case(c);
}

// What the protocol does not do is refused, named.
TEST(LivePause, RefusesTwoBoundariesAndSeveralMigrations) {
  ExecContext ctx(Device::cpu(), nullptr, 1);
  auto model = live_stage_checks::make_model();
  LocalWorld world(1);
  auto expect_refusal = [&](const LiveMigrationConfig& base, const std::string& words) {
    run_local_ranks(world, [&](LocalCommunicator& comm) {
      LiveMigrationConfig live = base;
      live.comm = &comm;
      live.paused = true;
      live.what = "migration at step 2";
      live.make_store = [&](size_t b, size_t e) {
        return std::make_unique<graph::ParamStore>(*model, b, e, ctx.allocator());
      };
      try {
        PausedStage stage(ctx, *model, 1, live, live_stage_checks::sgd());
        ADD_FAILURE() << "accepted";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
      }
    });
  };
  LiveMigrationConfig two;  // fc1 1->0 and relu2 2->3
  two.initial = {{0, 2}, {2, 4}, {4, 6}, {6, 9}};
  two.next = {{0, 3}, {3, 4}, {4, 5}, {5, 9}};
  two.first_backward = 4;
  expect_refusal(two, "across 2 stage boundaries");
  LiveMigrationConfig again;
  again.initial = {{0, 5}, {5, 9}};
  again.next = {{0, 3}, {3, 9}};
  again.first_backward = 4;
  again.then.push_back({{{0, 5}, {5, 9}}, 20, "migration 2"});
  expect_refusal(again, "one migration per run");
}

}  // namespace
}  // namespace strata::parallel
