#include <gtest/gtest.h>

#include <map>
#include <string>

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
  EXPECT_TRUE(mpi.has_local_rank);
  ProcessInfo srun = discover_process(fake({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}}));
  EXPECT_EQ(srun.launcher, "srun");
  EXPECT_EQ(srun.rank, 5);
  EXPECT_FALSE(srun.has_local_rank);  // MPI says then (MpiCommunicator::node_ranks)
  EXPECT_EQ(srun.local_rank, 0);
  ProcessInfo env = discover_process(fake({{"RANK", "1"}, {"WORLD_SIZE", "2"}}));
  EXPECT_EQ(env.launcher, "env");
  EXPECT_FALSE(env.has_local_rank);
  ProcessInfo local = discover_process(
      fake({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "2"}}));
  EXPECT_TRUE(local.has_local_rank);
  EXPECT_EQ(local.local_rank, 2);
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

// The message of the strata::Error that `fn` throws ("" when it throws none).
template <typename Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// choose_device(flag, processes, local rank, processes on the node, devices).
TEST(Topology, DeviceOfEachProcessWithoutAGpu) {
  EXPECT_EQ(choose_device("cpu", 4, 1, 4, 0).device, Device::cpu());
  EXPECT_EQ(choose_device("auto", 4, 1, 4, 0).device, Device::cpu());
  EXPECT_EQ(choose_device("auto", 1, 0, 1, 0).device, Device::cpu());
  EXPECT_TRUE(choose_device("auto", 4, 1, 4, 0).warning.empty());
  EXPECT_TRUE(contains(error_of([] { choose_device("cuda", 4, 1, 4, 0); }), "--device cuda"));
  EXPECT_TRUE(contains(error_of([] { choose_device("cuda", 1, 0, 1, 0); }), "no CUDA device"));
  const std::string missing = error_of([] { choose_device("cuda:0", 2, 0, 2, 0); });
  EXPECT_TRUE(contains(missing, "--device cuda:0")) << missing;
  EXPECT_TRUE(contains(missing, "no such device")) << missing;
  EXPECT_TRUE(contains(error_of([] { choose_device("gpu", 2, 0, 2, 0); }), "bad device 'gpu'"));
}

TEST(Topology, DeviceOfEachProcessWithOneGpu) {
  // A process alone.
  EXPECT_EQ(choose_device("auto", 1, 0, 1, 1).device, Device::cuda(0));
  EXPECT_EQ(choose_device("cuda", 1, 0, 1, 1).device, Device::cuda(0));
  EXPECT_EQ(choose_device("cuda:0", 1, 0, 1, 1).device, Device::cuda(0));
  EXPECT_TRUE(choose_device("cuda:0", 1, 0, 1, 1).warning.empty());
  EXPECT_EQ(choose_device("cpu", 1, 0, 1, 1).device, Device::cpu());
  // Two MPI processes on the node share the GPU, with a warning.
  for (const char* flag : {"auto", "cuda", "cuda:0"}) {
    for (int local = 0; local < 2; ++local) {
      const DeviceChoice c = choose_device(flag, 2, local, 2, 1);
      EXPECT_EQ(c.device, Device::cuda(0)) << flag;
      EXPECT_TRUE(contains(c.warning, "share")) << flag << ": " << c.warning;
      EXPECT_TRUE(contains(c.warning, std::string("--device ") + flag)) << c.warning;
    }
  }
  // One process per node (two nodes): its own GPU, no warning.
  EXPECT_TRUE(choose_device("cuda", 2, 0, 1, 1).warning.empty());
  EXPECT_TRUE(choose_device("cuda:0", 2, 0, 1, 1).warning.empty());
  EXPECT_TRUE(contains(error_of([] { choose_device("cuda:1", 2, 0, 2, 1); }), "cpu, cuda:0"));
}

TEST(Topology, DeviceOfEachProcessWithFourGpus) {
  for (int local = 0; local < 6; ++local) {
    EXPECT_EQ(choose_device("cuda", 6, local, 6, 4).device, Device::cuda(local % 4));
    EXPECT_EQ(choose_device("auto", 6, local, 6, 4).device, Device::cuda(local % 4));
    EXPECT_EQ(choose_device("cuda:2", 6, local, 6, 4).device, Device::cuda(2));
    EXPECT_EQ(choose_device("cpu", 6, local, 6, 4).device, Device::cpu());
  }
  // Four processes on the node: one GPU each. Six: shared, with a warning.
  EXPECT_TRUE(choose_device("cuda", 8, 3, 4, 4).warning.empty());
  EXPECT_TRUE(choose_device("auto", 8, 3, 4, 4).warning.empty());
  EXPECT_TRUE(contains(choose_device("cuda", 6, 5, 6, 4).warning, "6 processes"));
  // An explicit GPU for several processes of a node: allowed, with a warning naming the remedy.
  const DeviceChoice same = choose_device("cuda:3", 4, 1, 4, 4);
  EXPECT_EQ(same.device, Device::cuda(3));
  EXPECT_TRUE(contains(same.warning, "share cuda:3")) << same.warning;
  EXPECT_TRUE(contains(same.warning, "--device cuda")) << same.warning;
  // A process alone: auto is the first GPU.
  EXPECT_EQ(choose_device("auto", 1, 0, 1, 4).device, Device::cuda(0));
  EXPECT_TRUE(contains(error_of([] { choose_device("cuda:4", 4, 0, 4, 4); }), "cuda:3"));
}

// choose_comm(flag, MPI processes, local threads, CUDA ranks, NCCL built, GPUs shared).
TEST(Topology, CommunicatorOfTheRanks) {
  EXPECT_EQ(choose_comm("auto", 4, false, true, true, false), "nccl");
  EXPECT_EQ(choose_comm("auto", 4, false, true, false, false), "mpi");  // no NCCL built
  EXPECT_EQ(choose_comm("auto", 4, false, true, true, true), "mpi");    // ranks share a GPU
  EXPECT_EQ(choose_comm("auto", 4, false, false, true, false), "mpi");  // CPU ranks
  EXPECT_EQ(choose_comm("mpi", 4, false, true, true, false), "mpi");
  EXPECT_EQ(choose_comm("mpi", 4, false, false, true, false), "mpi");
  EXPECT_EQ(choose_comm("nccl", 4, false, true, true, false), "nccl");
  EXPECT_EQ(choose_comm("auto", 1, true, false, true, false), "local");
  EXPECT_EQ(choose_comm("auto", 1, false, true, true, false), "none");
  EXPECT_EQ(choose_comm("nccl", 1, false, true, true, false), "none");
  // nccl on CPU ranks names the flag, whatever the layout.
  for (int processes : {1, 4}) {
    const std::string cpu =
        error_of([&] { choose_comm("nccl", processes, false, false, true, false); });
    EXPECT_TRUE(contains(cpu, "--comm nccl")) << cpu;
    EXPECT_TRUE(contains(cpu, "CPU")) << cpu;
  }
  EXPECT_TRUE(
      contains(error_of([] { choose_comm("nccl", 4, false, true, false, false); }), "no NCCL"));
  EXPECT_TRUE(
      contains(error_of([] { choose_comm("nccl", 4, false, true, true, true); }), "share a GPU"));
  EXPECT_TRUE(
      contains(error_of([] { choose_comm("mpi", 1, true, false, true, false); }), "--local"));
  EXPECT_TRUE(
      contains(error_of([] { choose_comm("nccl", 1, true, true, true, false); }), "--local"));
  EXPECT_TRUE(
      contains(error_of([] { choose_comm("gloo", 4, false, true, true, false); }), "--comm gloo"));
}

}  // namespace
}  // namespace strata::parallel
