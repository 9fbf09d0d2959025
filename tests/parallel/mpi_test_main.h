// The GoogleTest main of the tests that run under mpirun (mpi_test_main.cpp): every rank runs
// every test in the same order; rank 0 prints the usual output, the other ranks print only their
// failures (prefixed with their rank); the exit status is nonzero when a test failed on any rank.
#pragma once

#include <chrono>
#include <memory>

#include "parallel/comm/mpi_comm.h"

namespace strata::parallel::testing {

// The session main() opened.
MpiSession& mpi_session();

// A fresh duplicate of MPI_COMM_WORLD (so that a failed test leaves no message behind for the
// next one) with a timeout that turns a bug into a failure instead of a hang.
inline std::unique_ptr<MpiCommunicator> mpi_world(
    std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  std::unique_ptr<MpiCommunicator> world = mpi_session().world();
  world->set_timeout(timeout);
  return world;
}

}  // namespace strata::parallel::testing
