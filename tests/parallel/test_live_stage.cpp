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
std::vector<RankResult> run_local(const Case& c, int groups = 1, bool open = false) {
  std::vector<RankResult> results(static_cast<size_t>(c.stages() * groups));
  LocalWorld world(c.stages() * groups);
  run_local_ranks(world, [&](LocalCommunicator& comm) {
    results[static_cast<size_t>(comm.rank())] = live_stage_checks::run_rank(comm, c, groups, open);
  });
  return results;
}

// `open`: the migrations are added while the program runs (LiveStage::add_migration).
void check_case(const Case& c, int groups = 1, bool open = false) {
  SCOPED_TRACE(c.name + ", " + std::to_string(groups) + " group(s)" + (open ? ", open" : ""));
  const int S = c.stages();
  const std::vector<RankResult> results = run_local(c, groups, open);
  const live_stage_checks::OracleResult expected = live_stage_checks::oracle(c, true, groups);
  for (size_t r = 0; r < results.size(); ++r) {
    live_stage_checks::check_rank(c, static_cast<int>(r) % S, results[r], expected,
                                  static_cast<int>(r) / S, open);
  }
  // Every micro-batch's backward of each moved piece of layers ran once per group, on one of the
  // stages that held it: as many updates of the blocks as micro-batches per piece and group (an
  // open run: every layer is a block).
  int64_t updates = 0;
  for (const RankResult& r : results) updates += r.stats.moved_updates;
  const std::unique_ptr<graph::Model> model = c.fixture.model();
  const size_t layers = model->size();
  const int64_t blocks =
      open ? static_cast<int64_t>(layers) : live_stage_checks::moving_pieces(c, layers);
  EXPECT_EQ(updates, groups * c.micro_batches * blocks);
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

// A stage may give up all of its layers: stage 1 gives its only layer (fc1) up and takes relu1
// from stage 2 (both moves up); moving down, stage 1's forward of one micro-batch runs no layer at
// all (it has given fc1 to stage 2 and not yet taken relu0 from stage 0).
TEST(LiveStage, AStageMayKeepNoneOfItsLayers) {
  check_case(
      {"S=3 up: fc1 1->0, relu1 2->1", {{0, 2}, {2, 3}, {3, 9}}, {{0, 3}, {3, 4}, {4, 9}}, 3, 12});
  check_case({"S=3 down: relu0 0->1, fc1 1->2",
              {{0, 2}, {2, 3}, {3, 9}},
              {{0, 1}, {1, 2}, {2, 9}},
              3,
              12});
}

// Migrations added while the run goes (an open run, as the trainer's --repartition decides them):
// every layer a block from the start, the core empty. The same cases, each migration added between
// two pieces of the program, the latest at which no stage has forwarded its K: bit for bit the
// oracle of the run laid out in advance.
TEST(LiveStage, MigrationsAddedWhileTheRunGoesMatchTheEq4Oracle) {
  auto later = [](Case c, int64_t by) {  // K later, so that a piece runs before it
    c.first_backward += by;
    for (LiveMigrationStep& m : c.then) m.first_backward += by;
    c.micro_batches += by;
    return c;
  };
  for (int S : {2, 4}) {
    for (const Case& c : live_stage_checks::cases(S)) {
      const Case l = later(c, 2 * S);
      EXPECT_GT(live_stage_checks::open_cuts(l).front(), 0) << l.name;
      check_case(l, 1, true);
    }
    for (const Case& c : live_stage_checks::two_move_cases(S)) check_case(later(c, 2 * S), 1, true);
  }
  check_case(later(live_stage_checks::cases(2).front(), 4), 2, true);  // two groups
}

}  // namespace
}  // namespace strata::parallel
