// The MPI backend on real processes: run by ctest through mpirun with 2, 3 and 4 ranks, every
// rank running every test. The shared conformance checks (comm_checks.h), sub-communicators for
// every G x S layout of the world, size errors, and CUDA tensors through host staging (skipped
// without a GPU on every rank).
#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "comm_checks.h"
#include "engine/cuda_runtime.h"
#include "engine/exec_context.h"
#include "mpi_test_main.h"
#include "ops/elementwise.h"
#include "parallel/comm/mpi_comm.h"
#include "parallel/topology.h"
#include "testing/require_gpu.h"

namespace strata::parallel {
namespace {

using testing::mpi_session;
using testing::mpi_world;

TEST(MpiComm, SessionMatchesTheLauncher) {
  const ProcessInfo process = discover_process();
  EXPECT_EQ(mpi_session().rank(), process.rank);
  EXPECT_EQ(mpi_session().size(), process.world_size);
  EXPECT_GE(mpi_session().thread_level(), MPI_THREAD_FUNNELED);
  EXPECT_NE(mpi_session().describe().find("MPI rank " + std::to_string(process.rank)),
            std::string::npos);
  auto world = mpi_world();
  EXPECT_EQ(world->backend(), "mpi");
  EXPECT_EQ(world->rank(), process.rank);
  EXPECT_EQ(world->size(), process.world_size);
  EXPECT_FALSE(world->stream_ordered());
}

// The ranks on this node (MPI_Comm_split_type): under one mpirun on one machine, the launcher's
// local rank and every rank of the world.
TEST(MpiComm, NodeRanksMatchTheLauncher) {
  const ProcessInfo process = discover_process();
  auto world = mpi_world();
  const NodeRanks node = world->node_ranks();
  EXPECT_EQ(node.size, world->size());
  if (process.has_local_rank) {
    EXPECT_EQ(node.rank, process.local_rank);
  }
  auto sub = world->split(world->rank() % 2, world->rank());
  const NodeRanks sub_node = static_cast<MpiCommunicator&>(*sub).node_ranks();
  EXPECT_EQ(sub_node.size, sub->size());
  EXPECT_EQ(sub_node.rank, sub->rank());
}

TEST(MpiComm, SendRecvRing) { comm_checks::send_recv_ring(*mpi_world()); }

TEST(MpiComm, TagsOutOfOrder) { comm_checks::tags_out_of_order(*mpi_world()); }

TEST(MpiComm, ZeroSizeTensors) { comm_checks::zero_size(*mpi_world()); }

TEST(MpiComm, AllReduceIsTheSameOnEveryRank) {
  auto world = mpi_world();
  for (DType dtype : {DType::kF32, DType::kF64, DType::kI32, DType::kI64}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      for (int64_t numel : {1, 1000, 100003}) {
        comm_checks::all_reduce(*world, dtype, op, numel, /*exact=*/false);
      }
    }
  }
}

TEST(MpiComm, Broadcast) { comm_checks::broadcast(*mpi_world()); }

TEST(MpiComm, AllGather) { comm_checks::all_gather(*mpi_world()); }

TEST(MpiComm, ReduceScatter) { comm_checks::reduce_scatter(*mpi_world(), /*exact=*/false); }

TEST(MpiComm, SplitIntoEveryGroupsTimesStagesLayout) {
  auto world = mpi_world();
  for (int groups = 1; groups <= world->size(); ++groups) {
    if (world->size() % groups != 0) continue;
    SCOPED_TRACE("G=" + std::to_string(groups) + " S=" + std::to_string(world->size() / groups));
    comm_checks::split_grid(*world, groups, world->size() / groups);
  }
}

TEST(MpiComm, Barrier) { comm_checks::barrier_waits_for_everyone(*mpi_world()); }

TEST(MpiComm, ReceiveTimesOut) { comm_checks::receive_times_out(*mpi_world()); }

TEST(MpiComm, BarrierTimesOutWhenARankIsLate) {
  auto world = mpi_world(std::chrono::milliseconds(300));
  const bool late = world->rank() == world->size() - 1;
  if (late) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    world->barrier("the late barrier");  // completes: the others' abandoned barrier lives on in MPI
  } else {
    EXPECT_THROW(world->barrier("Barrier(step 4)"), CommTimeout);
  }
  world->set_timeout(std::chrono::seconds(20));
  world->barrier("everyone again");
}

TEST(MpiComm, ReceiveOfTheWrongSizeIsAnError) {
  auto world = mpi_world();
  if (world->size() < 2 || world->rank() > 1) return;
  if (world->rank() == 0) {
    Tensor shorter = Tensor::zeros({3}), longer = Tensor::zeros({5});
    wait(*world->isend(shorter, 1, 0), *world, "short send");
    wait(*world->isend(longer, 1, 1), *world, "long send");
  } else {
    Tensor a = Tensor::zeros({4}), b = Tensor::zeros({4});
    EXPECT_THROW(wait(*world->irecv(a, 0, 0), *world, "recv of a shorter message"), Error);
    EXPECT_THROW(wait(*world->irecv(b, 0, 1), *world, "recv of a longer message"), Error);
  }
}

TEST(MpiComm, BadArgumentsNameTheProblem) {
  auto world = mpi_world();
  Tensor t = Tensor::zeros({4});
  EXPECT_THROW(world->isend(t, world->size(), 0), Error);
  EXPECT_THROW(world->irecv(t, 0, 40000), Error);
  EXPECT_THROW(world->all_reduce(Tensor::zeros({2}, DType::kU8)), Error);
  EXPECT_THROW(world->reduce_scatter(t, Tensor::zeros({3})), Error);
}

// CUDA tensors through pinned host staging (or directly with a CUDA-aware MPI). The skip is
// decided together, so that every rank runs the same collectives.
TEST(MpiComm, CudaTensorsThroughStaging) {
  auto world = mpi_world();
  Tensor have = Tensor::full({1}, cuda_device_count() > 0 ? 1.0 : 0.0, DType::kI32);
  wait(*world->all_reduce(have), *world, "device count");
  if (have.item<int32_t>() != world->size())
    STRATA_SKIP_WITHOUT_GPU("no CUDA device on every rank");
  ExecContext ctx(Device::cuda(discover_process().local_rank % cuda_device_count()));
  const int n = world->size(), r = world->rank();
  Tensor x = to_allocator(comm_checks::input_for(r, DType::kF32, {1000}, 3), ctx.allocator());
  wait(*world->all_reduce(x), *world, "cuda all_reduce");
  std::vector<Tensor> inputs;
  for (int q = 0; q < n; ++q) inputs.push_back(comm_checks::input_for(q, DType::kF32, {1000}, 3));
  EXPECT_TRUE(::strata::testing::all_close(
      to_allocator(x, default_cpu_allocator()),
      comm_checks::reduce_in_rank_order(inputs, ReduceOp::kSum), 1e-5, 1e-5));
  Tensor ring = to_allocator(Tensor::full({16}, r), ctx.allocator());
  Tensor got = to_allocator(Tensor::zeros({16}), ctx.allocator());
  auto recv = world->irecv(got, (r + n - 1) % n, 2);
  auto send = world->isend(ring, (r + 1) % n, 2);
  wait(*recv, *world, "cuda recv");
  wait(*send, *world, "cuda send");
  EXPECT_EQ(to_allocator(got, default_cpu_allocator()).to_vector<float>(),
            std::vector<float>(16, static_cast<float>((r + n - 1) % n)));
}

// Every operation the executor and GroupedDp use, on CUDA tensors handed to the communicator right
// after the kernel producing them was enqueued on the context's stream (x 2, exact in float32):
// the staging copies must wait for it, and a completed request's results must be on the device.
TEST(MpiComm, CudaTensorsAreReadAfterTheirProducerAndWrittenBeforeCompletion) {
  auto world = mpi_world();
  Tensor have = Tensor::full({1}, cuda_device_count() > 0 ? 1.0 : 0.0, DType::kI32);
  wait(*world->all_reduce(have), *world, "device count");
  if (have.item<int32_t>() != world->size())
    STRATA_SKIP_WITHOUT_GPU("no CUDA device on every rank");
  ExecContext ctx(Device::cuda(discover_process().local_rank % cuda_device_count()));
  const int n = world->size(), r = world->rank();
  auto produced = [&](const Tensor& host) {
    return ops::scale(ctx, to_allocator(host, ctx.allocator()), 2.0);
  };
  auto on_host = [](const Tensor& t) { return to_allocator(t, default_cpu_allocator()); };
  auto twice = [](const Tensor& t) {
    std::vector<float> v = t.to_vector<float>();
    for (float& x : v) x *= 2.0f;
    return v;
  };
  const Shape big{1 << 20};
  Tensor b = produced(comm_checks::input_for(r, DType::kF32, big, 21));
  wait(*world->broadcast(b, n - 1), *world, "cuda broadcast");
  EXPECT_EQ(on_host(b).to_vector<float>(),
            twice(comm_checks::input_for(n - 1, DType::kF32, big, 21)));
  Tensor mine = produced(Tensor::full({3}, r));
  Tensor all = Tensor::empty({n * 3}, DType::kF32, &ctx.allocator());
  wait(*world->all_gather(mine, all), *world, "cuda all_gather");
  for (int q = 0; q < n; ++q) {
    EXPECT_EQ(on_host(all).narrow(0, 3 * q, 3).to_vector<float>(), std::vector<float>(3, 2.0f * q));
  }
  Tensor parts = produced(Tensor::full({n * 2}, 1.0 + r));
  Tensor slice = Tensor::empty({2}, DType::kF32, &ctx.allocator());
  wait(*world->reduce_scatter(parts, slice), *world, "cuda reduce_scatter");
  EXPECT_EQ(on_host(slice).to_vector<float>(),
            std::vector<float>(2, static_cast<float>(n * (n + 1))));
  Tensor sum = produced(Tensor::full(big, 1.0 + r));
  wait(*world->all_reduce(sum), *world, "cuda all_reduce");
  EXPECT_EQ(on_host(sum).to_vector<float>(),
            std::vector<float>(big[0], static_cast<float>(n * (n + 1))));
  Tensor out = produced(comm_checks::input_for(r, DType::kF32, big, 22));
  Tensor in = Tensor::empty(big, DType::kF32, &ctx.allocator());
  auto recv = world->irecv(in, (r + n - 1) % n, 3);
  auto send = world->isend(out, (r + 1) % n, 3);
  wait(*recv, *world, "cuda recv");
  wait(*send, *world, "cuda send");
  EXPECT_EQ(on_host(in).to_vector<float>(),
            twice(comm_checks::input_for((r + n - 1) % n, DType::kF32, big, 22)));
}

}  // namespace
}  // namespace strata::parallel
