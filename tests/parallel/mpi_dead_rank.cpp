// A dead or stuck rank must not hang the others. Run with 2 ranks and a mode:
//   exit  rank 1 exits at once (_exit(3)) without finalizing MPI;
//   hang  rank 1 stays alive but never sends (a stuck peer; mpirun cannot notice it).
// Rank 0 waits for a message from rank 1 with a 2 s timeout and, on CommTimeout, ends the job
// with abort_world(4) (what the CLI does after a fatal error). run_dead_rank.sh checks that
// mpirun exits nonzero well within the time a hang would take, whoever ends the job first
// (rank 0's timeout or mpirun noticing the dead rank).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "parallel/comm/mpi_comm.h"

int main(int argc, char** argv) {
  using namespace strata;
  parallel::MpiSession mpi(&argc, &argv);
  std::unique_ptr<parallel::MpiCommunicator> world = mpi.world();
  const std::string mode = argc > 1 ? argv[1] : "exit";
  if (mpi.rank() == 1) {
    if (mode == "exit") _exit(3);
    std::this_thread::sleep_for(std::chrono::seconds(120));  // ended by rank 0's MPI_Abort
    return 0;
  }
  if (mpi.rank() != 0) return 0;
  Tensor t = Tensor::empty({4});
  const auto start = std::chrono::steady_clock::now();
  try {
    world->irecv(t, 1, 0)->wait(std::chrono::seconds(2), "a message from rank 1");
    std::fprintf(stderr, "rank 0: received a message from a dead rank\n");
    return 1;
  } catch (const parallel::CommTimeout& e) {
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "rank 0: CommTimeout after %.2f s: %s; calling abort_world(4)\n", s,
                 e.what());
    parallel::abort_world(4);
  }
}
