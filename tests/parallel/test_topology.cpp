#include <gtest/gtest.h>

#include <map>

#include "engine/check.h"
#include "parallel/topology.h"

namespace strata::parallel {
namespace {

GetEnv fake(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

TEST(Topology, DiscoversTheLauncher) {
  ProcessInfo single = discover_process(fake({}));
  EXPECT_EQ(single.launcher, "single");
  EXPECT_EQ(single.world_size, 1);
  ProcessInfo mpi = discover_process(fake({{"OMPI_COMM_WORLD_RANK", "3"},
                                           {"OMPI_COMM_WORLD_SIZE", "4"},
                                           {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                           {"SLURM_PROCID", "0"},
                                           {"SLURM_NTASKS", "8"}}));
  EXPECT_EQ(mpi.launcher, "mpirun");  // mpirun's variables win over an enclosing allocation's
  EXPECT_EQ(mpi.rank, 3);
  EXPECT_EQ(mpi.world_size, 4);
  EXPECT_EQ(mpi.local_rank, 1);
  ProcessInfo srun = discover_process(fake({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}}));
  EXPECT_EQ(srun.launcher, "srun");
  EXPECT_EQ(srun.rank, 5);
  ProcessInfo env = discover_process(fake({{"RANK", "1"}, {"WORLD_SIZE", "2"}}));
  EXPECT_EQ(env.launcher, "env");
  EXPECT_THROW(discover_process(fake({{"RANK", "2"}, {"WORLD_SIZE", "2"}})), Error);
  EXPECT_THROW(discover_process(fake({{"RANK", "x"}, {"WORLD_SIZE", "2"}})), Error);
}

TEST(Topology, GroupsTimesStages) {
  Topology t(8, 2, 4, 6);
  EXPECT_EQ(t.group(), 1);
  EXPECT_EQ(t.stage(), 2);
  EXPECT_EQ(t.rank_of(1, 3), 7);
  EXPECT_EQ(t.describe(), "G=2 groups x S=4 stages; rank 6 = group 1, stage 2");
  try {
    Topology(6, 2, 4, 0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs 8"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Topology(4, 2, 2, 4), Error);
}

}  // namespace
}  // namespace strata::parallel
