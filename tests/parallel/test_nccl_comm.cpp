// The NCCL backend under mpirun, one GPU per rank (device = local rank). Every test is skipped,
// on every rank together, unless each rank has its own CUDA device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "comm_checks.h"
#include "engine/cuda_runtime.h"
#include "engine/exec_context.h"
#include "mpi_test_main.h"
#include "parallel/comm/nccl_comm.h"
#include "parallel/topology.h"

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
    if (!every_rank_has_a_gpu(*world_)) GTEST_SKIP() << "no CUDA device";
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

}  // namespace
}  // namespace strata::parallel
