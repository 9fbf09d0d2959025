// The transfers of a live migration (parallel/runtime/live_transfer.h) between MPI ranks: run by
// ctest through mpirun with 2 and 3 ranks (rank 0 the source, rank 1 the target, others idle).
#include <gtest/gtest.h>

#include "live_transfer_checks.h"
#include "mpi_test_main.h"

namespace strata::parallel {
namespace {

using testing::mpi_world;

TEST(LiveTransferMpi, MovesItemsInChunksUnderTheWindow) {
  auto world = mpi_world();
  live_checks::moves_items_in_chunks(*world, 5, 4096, 16384);
  live_checks::moves_items_in_chunks(*world, 3, 1024, 2048);
  live_checks::moves_items_in_chunks(*world, 4, 0, 0);
  world->barrier("live transfer test");
}

TEST(LiveTransferMpi, BothEndsRefuseACountMismatch) {
  auto world = mpi_world();
  live_checks::refuses_a_count_mismatch(*world);
  world->barrier("live transfer test");
}

}  // namespace
}  // namespace strata::parallel
