#include "parallel/topology.h"

#include <cstdlib>
#include <sstream>

#include "engine/check.h"

namespace strata::parallel {
namespace {

int parse_int(const char* name, const char* value) {
  char* end = nullptr;
  const long v = std::strtol(value, &end, 10);
  STRATA_CHECK(end != value && *end == '\0' && v >= 0 && v < (1L << 24))
      << "environment variable " << name << "='" << value << "' is not a valid count or rank";
  return static_cast<int>(v);
}

}  // namespace

ProcessInfo discover_process(const GetEnv& getenv_fn) {
  const GetEnv get = getenv_fn ? getenv_fn : GetEnv([](const char* n) { return std::getenv(n); });
  struct Source {
    const char* launcher;
    const char* rank;
    const char* size;
    const char* local_rank;
  };
  const Source sources[] = {
      {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
      {"srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
      {"env", "RANK", "WORLD_SIZE", "LOCAL_RANK"}};
  for (const Source& s : sources) {
    const char* rank = get(s.rank);
    const char* size = get(s.size);
    if (rank == nullptr || size == nullptr) continue;
    ProcessInfo info;
    info.launcher = s.launcher;
    info.rank = parse_int(s.rank, rank);
    info.world_size = parse_int(s.size, size);
    const char* local = get(s.local_rank);
    info.local_rank = local != nullptr ? parse_int(s.local_rank, local) : 0;
    info.has_local_rank = local != nullptr;
    STRATA_CHECK(info.world_size >= 1 && info.rank < info.world_size)
        << s.rank << "=" << rank << " is outside " << s.size << "=" << size;
    return info;
  }
  return ProcessInfo{};
}

DeviceChoice choose_device(const std::string& flag, int processes, int local_rank,
                           int local_processes, int devices) {
  STRATA_CHECK(processes >= 1 && local_rank >= 0 && local_processes >= 1 && devices >= 0)
      << "choose_device: " << processes << " processes, local rank " << local_rank << " of "
      << local_processes << ", " << devices << " devices";
  DeviceChoice choice;
  if (flag == "cpu") return choice;
  const std::string gpus = std::to_string(devices) + " GPU" + (devices == 1 ? "" : "s");
  const bool per_rank = flag == "cuda" || (flag == "auto" && processes > 1);
  if (per_rank) {
    if (devices == 0) {
      STRATA_CHECK(flag == "auto") << "--device cuda: this process (local rank " << local_rank
                                   << ") sees no CUDA device; use --device cpu";
      return choice;  // auto without a GPU: the CPU
    }
    choice.device = Device::cuda(local_rank % devices);
    if (processes > 1 && local_processes > devices) {
      choice.warning = "--device " + flag + ": " + std::to_string(local_processes) +
                       " processes on this node share its " + gpus +
                       " (each on cuda:(local rank % " + std::to_string(devices) + "))";
    }
    return choice;
  }
  if (flag == "auto") {  // a process alone
    if (devices > 0) choice.device = Device::cuda(0);
    return choice;
  }
  const Device d = parse_device(flag);  // cuda:N, or an error naming the bad spelling
  if (d.index >= devices) {
    std::string list = "cpu";
    for (int i = 0; i < devices; ++i) list += ", " + Device::cuda(i).str();
    STRATA_THROW() << "--device " << flag << ": no such device here (local rank " << local_rank
                   << " sees " << list << ")";
  }
  choice.device = d;
  if (processes > 1 && local_processes > 1) {
    choice.warning = "--device " + flag + ": all " + std::to_string(local_processes) +
                     " processes on this node share " + d.str() +
                     " (--device cuda gives each its own: cuda:(local rank % " +
                     std::to_string(devices) + "))";
  }
  return choice;
}

std::string choose_comm(const std::string& flag, int processes, bool local_threads, bool cuda_ranks,
                        bool have_nccl, bool shared_gpus) {
  STRATA_CHECK(flag == "auto" || flag == "mpi" || flag == "nccl")
      << "--comm " << flag << ": expected auto, mpi or nccl";
  if (flag == "nccl") {
    STRATA_CHECK(cuda_ranks)
        << "--comm nccl carries CUDA tensors, but the ranks (or some of them) run on the CPU; "
           "use --comm mpi (or auto), or put the ranks on GPUs with --device "
           "cuda";
    STRATA_CHECK(have_nccl) << "--comm nccl: this build has no NCCL (configure with "
                               "-DSTRATA_WITH_NCCL=ON and MPI); use --comm mpi";
  }
  if (processes == 1) {
    STRATA_CHECK(!local_threads || flag == "auto")
        << "--comm " << flag << " is for MPI processes (mpirun, srun); the ranks of --local are "
        << "threads of this process and use the local backend (CUDA tensors through host "
           "copies): drop --comm, or launch the ranks with mpirun";
    return local_threads ? "local" : "none";
  }
  if (flag == "nccl") {
    STRATA_CHECK(!shared_gpus)
        << "--comm nccl: some ranks share a GPU, and NCCL cannot put two ranks of a "
           "communicator on one GPU; give each rank its own (--device cuda with at most as "
           "many processes per node as GPUs), or use --comm mpi";
    return "nccl";
  }
  if (flag == "mpi") return "mpi";
  return cuda_ranks && have_nccl && !shared_gpus ? "nccl" : "mpi";
}

Topology::Topology(int world_size, int groups, int stages, int rank)
    : groups_(groups), stages_(stages), rank_(rank) {
  STRATA_CHECK(groups >= 1 && stages >= 1)
      << "--groups (" << groups << ") and --stages (" << stages << ") must be at least 1";
  STRATA_CHECK_EQ(groups * stages, world_size)
      << "the world has " << world_size << " processes but --groups " << groups << " x --stages "
      << stages << " needs " << groups * stages;
  STRATA_CHECK(rank >= 0 && rank < world_size)
      << "rank " << rank << " outside a world of " << world_size;
}

int Topology::rank_of(int group, int stage) const {
  STRATA_CHECK(group >= 0 && group < groups_ && stage >= 0 && stage < stages_)
      << "group " << group << ", stage " << stage << " outside " << describe();
  return group * stages_ + stage;
}

std::string Topology::describe() const {
  std::ostringstream s;
  s << "G=" << groups_ << " group" << (groups_ == 1 ? "" : "s") << " x S=" << stages_ << " stage"
    << (stages_ == 1 ? "" : "s") << "; rank " << rank_ << " = group " << group() << ", stage "
    << stage();
  return s.str();
}

}  // namespace strata::parallel
