// Where this process sits: its rank among the launched processes, and its place in the
// G data-parallel groups x S pipeline stages layout (rank = g * S + s).
//
// Three launchers are recognized, in this order: Open MPI's mpirun (OMPI_COMM_WORLD_*), Slurm's
// srun (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID), and torchrun-style variables (RANK,
// WORLD_SIZE, LOCAL_RANK). Without any of them the process is alone (rank 0 of 1).
#pragma once

#include <functional>
#include <string>

#include "engine/device.h"

namespace strata::parallel {

struct ProcessInfo {
  int rank = 0;
  int world_size = 1;
  // The rank among the processes on this node (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID,
  // LOCAL_RANK); 0 with has_local_rank false when the launcher does not say (then MPI can tell:
  // MpiCommunicator::node_ranks).
  int local_rank = 0;
  bool has_local_rank = false;
  std::string launcher = "single";  // "mpirun", "srun", "env" or "single"
};

using GetEnv = std::function<const char*(const char*)>;
// Reads the environment (through `getenv`, replaceable in tests). Inconsistent values (a rank
// outside the world, a non-number) are errors naming the variable.
ProcessInfo discover_process(const GetEnv& getenv = nullptr);

// The device of one rank of `processes` MPI processes (1: a process alone; its local ranks, if
// any, are threads that share its device), from --device and this process's place on its node:
//   cpu       the CPU;
//   cuda      cuda:(local_rank % devices): one GPU per process on a node while there are enough,
//             shared round-robin otherwise (an error without a device);
//   cuda:N    cuda:N for every process (an error when it does not exist);
//   auto      MPI processes as `cuda` when there is a device, else the CPU; a process alone:
//             cuda:0 when there is a device, else the CPU.
// `local_processes` is the number of processes on this node and `devices` the CUDA devices this
// process sees (0: none, or a build without CUDA kernels). `warning` is one line for rank 0 to
// print when several processes of this node share a GPU (empty otherwise). Errors name --device.
struct DeviceChoice {
  Device device;
  std::string warning;
};
DeviceChoice choose_device(const std::string& flag, int processes, int local_rank,
                           int local_processes, int devices);

// --comm: what carries tensors between ranks. `processes` MPI processes (1: this process alone,
// its ranks threads when `local_threads`), `cuda_ranks` whether the ranks run on CUDA devices,
// `have_nccl` whether the build has NCCL, `shared_gpus` whether two ranks would share a GPU.
//   auto  nccl for MPI processes on CUDA devices, one each, with NCCL built; mpi for other MPI
//         processes; "local" for threads; "none" for a rank alone;
//   mpi   MPI processes; CUDA tensors staged through pinned host memory (or CUDA-aware MPI);
//   nccl  MPI processes on CUDA devices: CUDA tensors over NCCL, host values over MPI.
// Returns "nccl", "mpi", "local" or "none"; throws naming --comm when the flag cannot be
// honoured (nccl with CPU ranks, without NCCL, or with ranks sharing a GPU; mpi or nccl for the
// threads of --local).
std::string choose_comm(const std::string& flag, int processes, bool local_threads, bool cuda_ranks,
                        bool have_nccl, bool shared_gpus);

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
