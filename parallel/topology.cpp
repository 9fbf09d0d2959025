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
    STRATA_CHECK(info.world_size >= 1 && info.rank < info.world_size)
        << s.rank << "=" << rank << " is outside " << s.size << "=" << size;
    return info;
  }
  return ProcessInfo{};
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
