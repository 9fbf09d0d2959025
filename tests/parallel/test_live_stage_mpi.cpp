// A live migration inside async-1f1b's executor on MPI ranks (ctest runs it with 2 and 4 ranks:
// the cases of that many stages), each rank against the Eq. 4 oracle of live_stage_checks.h.
#include <gtest/gtest.h>

#include "live_stage_checks.h"
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

}  // namespace
}  // namespace strata::parallel
