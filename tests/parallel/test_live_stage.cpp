// A live migration inside async-1f1b's executor on local ranks (threads), against the Eq. 4
// oracle of live_stage_checks.h.
#include <gtest/gtest.h>

#include "live_stage_checks.h"
#include "live_tied_checks.h"
#include "parallel/comm/local_comm.h"

namespace strata::parallel {
namespace {

using live_stage_checks::Case;
using live_stage_checks::RankResult;

// Rank r of the returned results: group r / S, stage r % S.
std::vector<RankResult> run_local(const Case& c, int groups = 1) {
  std::vector<RankResult> results(static_cast<size_t>(c.stages() * groups));
  LocalWorld world(c.stages() * groups);
  run_local_ranks(world, [&](LocalCommunicator& comm) {
    results[static_cast<size_t>(comm.rank())] = live_stage_checks::run_rank(comm, c, groups);
  });
  return results;
}

void check_case(const Case& c, int groups = 1) {
  SCOPED_TRACE(c.name + ", " + std::to_string(groups) + " group(s)");
  const int S = c.stages();
  const std::vector<RankResult> results = run_local(c, groups);
  const live_stage_checks::OracleResult expected = live_stage_checks::oracle(c, true, groups);
  for (size_t r = 0; r < results.size(); ++r) {
    live_stage_checks::check_rank(c, static_cast<int>(r) % S, results[r], expected,
                                  static_cast<int>(r) / S);
  }
  // Every micro-batch's backward of each moved piece of layers ran once per group, on one of the
  // stages that held it: as many updates of the blocks as micro-batches per piece and group.
  int64_t updates = 0;
  for (const RankResult& r : results) updates += r.stats.moved_updates;
  const std::unique_ptr<graph::Model> model = c.fixture.model();
  const size_t layers = model->size();
  EXPECT_EQ(updates, groups * c.micro_batches * live_stage_checks::moving_pieces(c, layers));
  // The oracle tells the versions apart: the run without the migration's Eq. 4 (every layer on
  // its first stage's versions throughout) ends elsewhere.
  const live_stage_checks::OracleResult unmoved = live_stage_checks::oracle(c, false, groups);
  live_stage_checks::Weights piped;
  for (const RankResult& r : results) piped.insert(r.weights.begin(), r.weights.end());
  EXPECT_NE(piped, unmoved.weights) << "the staleness of the moved layers did not change";
  if (!c.then.empty()) {
    // Nor is it the run of the first migration alone: the later ones changed the staleness too.
    Case first = c;
    first.then.clear();
    const live_stage_checks::OracleResult once = live_stage_checks::oracle(first, true, groups);
    EXPECT_NE(piped, once.weights) << "the later migrations changed nothing";
  }
  if (live_stage_checks::tied_stages(*model, c.initial)) {
    // A tied parameter split between stages: without the sum of its two copies' gradients at
    // each update (the tied all-reduce) the oracle ends elsewhere.
    const live_stage_checks::OracleResult unsummed =
        live_stage_checks::oracle(c, true, groups, false);
    EXPECT_NE(piped, unsummed.weights) << "the tied copies' gradient sum changed nothing";
  }
  if (groups > 1) {
    // The groups' data differ: one group's oracle alone (its own mean gradient) ends elsewhere.
    const live_stage_checks::OracleResult alone = live_stage_checks::oracle(c, true, 1);
    EXPECT_NE(piped, alone.weights) << "the moved layers' updates ignored the other group";
  }
}

TEST(LiveStage, TwoStagesMatchTheEq4Oracle) {
  for (const Case& c : live_stage_checks::cases(2)) check_case(c);
}

TEST(LiveStage, FourStagesMatchTheEq4Oracle) {
  for (const Case& c : live_stage_checks::cases(4)) check_case(c);
}

// G = 2 groups of S stages (GroPipe): both groups move the same layers at the same micro-batch,
// and each update of the moved layers, on the source before the hand-off and on the target from
// it, applies the groups' mean gradient.
TEST(LiveStage, TwoGroupsMatchTheEq4Oracle) {
  for (const Case& c : live_stage_checks::cases(2)) check_case(c, 2);
  check_case(live_stage_checks::cases(4).back(), 2);           // both boundaries of a stage at once
  check_case(live_stage_checks::two_move_cases(2).back(), 2);  // two migrations
}

// Two live migrations in one run: layers go down and come back up (S = 2, also taking a layer
// that had not moved), and up then down beside another move (S = 4); the second starts after the
// first has switched every boundary.
TEST(LiveStage, TwoMigrationsMatchTheEq4Oracle) {
  for (const Case& c : live_stage_checks::two_move_cases(2)) check_case(c);
  for (const Case& c : live_stage_checks::two_move_cases(4)) check_case(c);
}

// GPT-2 tiny: its token embedding (stage 0) and the head tied to it (the last stage) stay, blocks
// move between stages (S = 2 down and up; S = 3 both boundaries of the middle stage; S = 4). At
// every update both stages sum the tied copies' gradients of the same micro-batch, each computed
// on the version Eq. 4 gives its stage.
TEST(LiveStage, TiedGpt2MatchesTheEq4Oracle) {
  for (int S : {2, 3, 4}) {
    for (const Case& c : live_tied_checks::cases(S)) check_case(c);
  }
}

// The same with G = 2 groups: each side of the tied parameter first sums over the groups.
TEST(LiveStage, TiedGpt2TwoGroupsMatchTheEq4Oracle) {
  check_case(live_tied_checks::cases(2).front(), 2);
  check_case(live_tied_checks::cases(3).front(), 2);
}

TEST(LiveStage, RefusesAStageThatWouldKeepNoLayer) {
  // Stage 1 would give its only layer up and take layer 3 from stage 2: nothing stays.
  LiveMigrationConfig live;
  live.initial = {{0, 2}, {2, 3}, {3, 9}};
  live.next = {{0, 3}, {3, 4}, {4, 9}};
  live.first_backward = 3;
  live.what = "migration at step 2";
  ExecContext ctx(Device::cpu(), nullptr, 1);
  auto model = live_stage_checks::make_model();
  try {
    LiveStage stage(ctx, *model, 1, live, live_stage_checks::sgd());
    FAIL() << "accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("migration at step 2: stage 1 would keep none of its layers"),
              std::string::npos)
        << m;
  }
}

}  // namespace
}  // namespace strata::parallel
