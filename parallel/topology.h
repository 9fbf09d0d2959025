// Where this process sits: its rank among the launched processes, and its place in the
// G data-parallel groups x S pipeline stages layout (rank = g * S + s).
//
// Three launchers are recognized, in this order: Open MPI's mpirun (OMPI_COMM_WORLD_*), Slurm's
// srun (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID), and torchrun-style variables (RANK,
// WORLD_SIZE, LOCAL_RANK). Without any of them the process is alone (rank 0 of 1).
#pragma once

#include <functional>
#include <string>

namespace strata::parallel {

struct ProcessInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string launcher = "single";  // "mpirun", "srun", "env" or "single"
};

using GetEnv = std::function<const char*(const char*)>;
// Reads the environment (through `getenv`, replaceable in tests). Inconsistent values (a rank
// outside the world, a non-number) are errors naming the variable.
ProcessInfo discover_process(const GetEnv& getenv = nullptr);

class Topology {
 public:
  // Checks groups * stages == world_size and rank < world_size, naming the flags on error.
  Topology(int world_size, int groups, int stages, int rank);

  int world_size() const { return groups_ * stages_; }
  int groups() const { return groups_; }
  int stages() const { return stages_; }
  int rank() const { return rank_; }
  int group() const { return rank_ / stages_; }
  int stage() const { return rank_ % stages_; }
  int rank_of(int group, int stage) const;
  // "G=2 groups x S=2 stages; rank 3 = group 1, stage 1"
  std::string describe() const;

 private:
  int groups_, stages_, rank_;
};

}  // namespace strata::parallel
