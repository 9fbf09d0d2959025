// The NCCL backend under mpirun, one GPU per rank (device = local rank). Every test is skipped,
// on every rank together, unless each rank has its own CUDA device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "comm_checks.h"
#include "engine/cuda_runtime.h"
#include "engine/exec_context.h"
#include "mpi_test_main.h"
#include "parallel/comm/nccl_comm.h"
#include "parallel/runtime/executor.h"
#include "parallel/topology.h"
#include "testing/require_gpu.h"

namespace strata::parallel {
namespace {

using testing::mpi_world;

// True on every rank when every rank has a device of its own (decided together).
bool every_rank_has_a_gpu(MpiCommunicator& world) {
  const ProcessInfo process = discover_process();
  Tensor ok = Tensor::full({1}, process.local_rank < cuda_device_count() ? 1.0 : 0.0, DType::kI32);
  wait(*world.all_reduce(ok), world, "device check");
  return ok.item<int32_t>() == world.size();
}

class NcclComm : public ::testing::Test {
 protected:
  void SetUp() override {
    world_ = mpi_world();
    if (!every_rank_has_a_gpu(*world_)) {
      STRATA_SKIP_WITHOUT_GPU("no CUDA device of its own on every rank (rank " +
                              std::to_string(world_->rank()) + ": " +
                              ::strata::testing::why_no_cuda_device() + ")");
    }
    device_ = Device::cuda(discover_process().local_rank);
    ctx_ = std::make_unique<ExecContext>(device_);
    nccl_ = std::make_unique<NcclCommunicator>(*world_, device_);
  }
  Tensor on_device(const Tensor& t) { return to_allocator(t, ctx_->allocator()); }
  static Tensor on_host(const Tensor& t) { return to_allocator(t, default_cpu_allocator()); }

  std::unique_ptr<MpiCommunicator> world_;
  Device device_;
  std::unique_ptr<ExecContext> ctx_;
  std::unique_ptr<NcclCommunicator> nccl_;
};

TEST_F(NcclComm, AllReduceMatchesTheRankOrderSum) {
  const int n = nccl_->size();
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
    Tensor x = on_device(comm_checks::input_for(nccl_->rank(), DType::kF32, {4097}, 11));
    wait(*nccl_->all_reduce(x, op), *nccl_, "all_reduce");
    std::vector<Tensor> inputs;
    for (int q = 0; q < n; ++q)
      inputs.push_back(comm_checks::input_for(q, DType::kF32, {4097}, 11));
    EXPECT_TRUE(::strata::testing::all_close(
        on_host(x), comm_checks::reduce_in_rank_order(inputs, op), 1e-6 * n, 1e-6));
  }
}

TEST_F(NcclComm, RingOfSendsAndReceivesDoesNotDeadlock) {
  const int n = nccl_->size(), r = nccl_->rank();
  Tensor out = on_device(Tensor::full({1000}, r)), in = on_device(Tensor::zeros({1000}));
  auto recv = nccl_->irecv(in, (r + n - 1) % n, 0);
  auto send = nccl_->isend(out, (r + 1) % n, 0);
  wait(*recv, *nccl_, "ring recv");
  wait(*send, *nccl_, "ring send");
  EXPECT_EQ(on_host(in).to_vector<float>(),
            std::vector<float>(1000, static_cast<float>((r + n - 1) % n)));
}

TEST_F(NcclComm, BroadcastGatherScatter) {
  const int n = nccl_->size(), r = nccl_->rank();
  Tensor b = on_device(comm_checks::input_for(r, DType::kI64, {33}, 12));
  wait(*nccl_->broadcast(b, n - 1), *nccl_, "broadcast");
  EXPECT_TRUE(
      comm_checks::same_bytes(on_host(b), comm_checks::input_for(n - 1, DType::kI64, {33}, 12)));
  Tensor g = on_device(Tensor::full({3}, r));
  Tensor all = on_device(Tensor::zeros({n, 3}));
  wait(*nccl_->all_gather(g, all), *nccl_, "all_gather");
  for (int q = 0; q < n; ++q) {
    EXPECT_EQ(on_host(all).select(0, q).to_vector<float>(), std::vector<float>(3, q));
  }
  Tensor s = on_device(Tensor::full({n * 2}, 1.0 + r));
  Tensor mine = on_device(Tensor::zeros({2}));
  wait(*nccl_->reduce_scatter(s, mine), *nccl_, "reduce_scatter");
  EXPECT_EQ(on_host(mine).to_vector<float>(), std::vector<float>(2, n * (n + 1) / 2.0f));
  nccl_->barrier("barrier");
}

TEST_F(NcclComm, OperationsWaitForTheCallerStream) {
  cudaStream_t caller = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&caller, cudaStreamNonBlocking), cudaSuccess);
  nccl_->set_caller_stream(caller);
  Tensor x = on_device(Tensor::zeros({1 << 20}));
  // The value 1 is written on the caller's stream only; the all_reduce must see it.
  ASSERT_EQ(cudaMemsetAsync(x.raw_data(), 0, x.nbytes(), caller), cudaSuccess);
  const float one = 1.0f;
  ASSERT_EQ(cudaMemcpyAsync(x.raw_data(), &one, sizeof(one), cudaMemcpyHostToDevice, caller),
            cudaSuccess);
  wait(*nccl_->all_reduce(x), *nccl_, "ordered all_reduce");
  EXPECT_EQ(on_host(x.narrow(0, 0, 1).clone()).item<float>(), static_cast<float>(nccl_->size()));
  nccl_->set_caller_stream(nullptr);
  cudaStreamDestroy(caller);
}

TEST_F(NcclComm, SplitIntoGroups) {
  auto sub = nccl_->split(nccl_->rank() % 2, nccl_->rank());
  ASSERT_TRUE(sub);
  Tensor one = on_device(Tensor::full({1}, 1.0));
  wait(*sub->all_reduce(one), *sub, "sub all_reduce");
  EXPECT_EQ(on_host(one).item<float>(), static_cast<float>(sub->size()));
}

TEST_F(NcclComm, TimeoutAbortsTheCommunicator) {
  if (nccl_->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  if (nccl_->rank() == 0) {
    Tensor t = on_device(Tensor::zeros({8}));
    auto r = nccl_->irecv(t, 1, 0);
    EXPECT_THROW(r->wait(std::chrono::milliseconds(300), "RecvAct(mb 0)"), CommTimeout);
    EXPECT_THROW(nccl_->all_reduce(t), CommAborted);
  }
  world_->barrier("after the NCCL timeout");
}

// NcclMpiCommunicator (strata train --comm nccl): CUDA tensors over NCCL, host ones over MPI,
// split together.
TEST_F(NcclComm, HostAndDeviceTensorsTakeTheirOwnHalf) {
  const int n = world_->size(), r = world_->rank();
  NcclMpiCommunicator both(mpi_world(), device_);
  EXPECT_EQ(both.backend(), "nccl");
  EXPECT_TRUE(both.stream_ordered());
  EXPECT_EQ(both.rank(), r);
  EXPECT_EQ(both.size(), n);
  Tensor host = Tensor::full({5}, 1.0 + r, DType::kF64);  // the trainer's metrics: over MPI
  wait(*both.all_reduce(host), both, "host all_reduce");
  EXPECT_EQ(host.to_vector<double>(), std::vector<double>(5, n * (n + 1) / 2.0));
  Tensor dev = on_device(Tensor::full({7}, 1.0 + r));  // gradients: over NCCL
  wait(*both.all_reduce(dev), both, "device all_reduce");
  EXPECT_EQ(on_host(dev).to_vector<float>(), std::vector<float>(7, n * (n + 1) / 2.0f));
  EXPECT_THROW(both.all_gather(dev, Tensor::zeros({7 * n})), Error);  // one side each
  both.barrier("hybrid barrier");
  auto sub = both.split(r % 2, n - r);  // reversed order within each color
  ASSERT_TRUE(sub);
  EXPECT_EQ(sub->backend(), "nccl");
  Tensor rank = on_device(Tensor::full({1}, sub->rank(), DType::kI32));
  Tensor ranks = on_device(Tensor::zeros({sub->size()}, DType::kI32));
  wait(*sub->all_gather(rank, ranks), *sub, "sub all_gather");  // NCCL's rank order is MPI's
  std::vector<int32_t> expected(static_cast<size_t>(sub->size()));
  for (int q = 0; q < sub->size(); ++q) expected[q] = q;
  EXPECT_EQ(on_host(ranks).to_vector<int32_t>(), expected);
  Tensor word = Tensor::full({1}, 1.0);
  wait(*sub->all_reduce(word), *sub, "sub host all_reduce");
  EXPECT_EQ(word.item<float>(), static_cast<float>(sub->size()));
}

// The executor's links over NCCL (make_stage_links with the world as a pipeline of n stages):
// activations forward and gradients backward on their own communicators, receives posted before
// the sends they depend on, as a stage does.
TEST_F(NcclComm, StageLinksCarryBothDirections) {
  const int n = world_->size(), s = world_->rank();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  NcclMpiCommunicator pipe(mpi_world(), device_);
  StageLinks links = make_stage_links(pipe, s, n);
  EXPECT_EQ(links.act_in != nullptr, s > 0);
  EXPECT_EQ(links.grad_out != nullptr, s > 0);
  EXPECT_EQ(links.act_out != nullptr, s < n - 1);
  EXPECT_EQ(links.grad_in != nullptr, s < n - 1);
  Tensor act = on_device(Tensor::zeros({1000})), grad = on_device(Tensor::zeros({10}));
  std::vector<std::unique_ptr<Request>> requests;
  // The gradient from the next stage is posted first, as a stage posts a receive it will need.
  if (links.grad_in) requests.push_back(links.grad_in->irecv(grad, 1, 0));
  if (links.act_in) {
    wait(*links.act_in->irecv(act, 0, 0), *links.act_in, "activation from the previous stage");
    EXPECT_EQ(on_host(act).to_vector<float>(), std::vector<float>(1000, s - 1.0f));
  }
  if (links.act_out) {
    requests.push_back(links.act_out->isend(on_device(Tensor::full({1000}, s)), 1, 0));
  }
  if (links.grad_out) {
    requests.push_back(links.grad_out->isend(on_device(Tensor::full({10}, -s)), 0, 0));
  }
  for (auto& r : requests) wait(*r, pipe, "link transfers");
  if (links.grad_in) {
    EXPECT_EQ(on_host(grad).to_vector<float>(), std::vector<float>(10, -(s + 1.0f)));
  }
  world_->barrier("after the links");
}

}  // namespace
}  // namespace strata::parallel
