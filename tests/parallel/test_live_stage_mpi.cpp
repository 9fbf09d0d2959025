// A live migration inside async-1f1b's executor on MPI ranks (ctest runs it with 2 and 4 ranks:
// the cases of that many stages, one and two migrations per run; with 4 also 2 groups of 2
// stages), each rank against the Eq. 4 oracle of live_stage_checks.h.
#include <gtest/gtest.h>

#include "live_stage_checks.h"
#include "live_tied_checks.h"
#include "mpi_test_main.h"

namespace strata::parallel {
namespace {

using testing::mpi_world;

TEST(LiveStageMpi, MovesDownAndUpAsTheEq4OracleSays) {
  auto world = mpi_world();
  for (const live_stage_checks::Case& c : live_stage_checks::cases(world->size())) {
    SCOPED_TRACE(c.name);
    const live_stage_checks::RankResult r = live_stage_checks::run_rank(*world, c);
    live_stage_checks::check_rank(c, world->rank(), r, live_stage_checks::oracle(c, true));
    world->barrier("live stage test");
  }
}

// Two migrations in one run (down then up on 2 ranks; up then down beside another move on 4).
TEST(LiveStageMpi, TwoMigrationsMatchTheEq4Oracle) {
  auto world = mpi_world();
  for (const live_stage_checks::Case& c : live_stage_checks::two_move_cases(world->size())) {
    SCOPED_TRACE(c.name);
    const live_stage_checks::RankResult r = live_stage_checks::run_rank(*world, c);
    live_stage_checks::check_rank(c, world->rank(), r, live_stage_checks::oracle(c, true));
    world->barrier("live stage test (two migrations)");
  }
}

// Migrations added while the run goes (an open run): each between two pieces of the program, all
// ranks at the same point, bit for bit the oracle of the run laid out in advance.
TEST(LiveStageMpi, MigrationsAddedWhileTheRunGoesMatchTheEq4Oracle) {
  auto world = mpi_world();
  std::vector<live_stage_checks::Case> cases = live_stage_checks::cases(world->size());
  for (const live_stage_checks::Case& c : live_stage_checks::two_move_cases(world->size())) {
    cases.push_back(c);
  }
  for (live_stage_checks::Case c : cases) {
    SCOPED_TRACE(c.name + ", open");
    const int64_t later = 2 * world->size();  // a piece runs before the first migration
    c.first_backward += later;
    for (LiveMigrationStep& m : c.then) m.first_backward += later;
    c.micro_batches += later;
    const live_stage_checks::RankResult r = live_stage_checks::run_rank(*world, c, 1, true);
    live_stage_checks::check_rank(c, world->rank(), r, live_stage_checks::oracle(c, true), 0, true);
    world->barrier("live stage test (open)");
  }
}

// 2 groups x 2 stages: the moved layers' gradients are all-reduced over the groups on whichever
// stage holds them at each update.
TEST(LiveStageMpi, TwoGroupsOfTwoStages) {
  auto world = mpi_world();
  if (world->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  for (const live_stage_checks::Case& c : live_stage_checks::cases(2)) {
    SCOPED_TRACE(c.name);
    const live_stage_checks::RankResult r = live_stage_checks::run_rank(*world, c, 2);
    live_stage_checks::check_rank(c, world->rank() % 2, r, live_stage_checks::oracle(c, true, 2),
                                  world->rank() / 2);
    world->barrier("live stage test (2 groups)");
  }
}

// GPT-2 tiny with its tied embedding and head on the first and last ranks, blocks moving between
// ranks: on 2 ranks S = 2 (down and up), on 4 ranks 2 groups of 2 stages.
TEST(LiveStageMpi, TiedGpt2MatchesTheEq4Oracle) {
  auto world = mpi_world();
  const int groups = world->size() == 4 ? 2 : 1;
  const int S = world->size() / groups;
  for (const live_stage_checks::Case& c : live_tied_checks::cases(S)) {
    SCOPED_TRACE(c.name);
    const live_stage_checks::RankResult r = live_stage_checks::run_rank(*world, c, groups);
    live_stage_checks::check_rank(c, world->rank() % S, r,
                                  live_stage_checks::oracle(c, true, groups), world->rank() / S);
    world->barrier("live stage test (tied GPT-2)");
  }
}

}  // namespace
}  // namespace strata::parallel
