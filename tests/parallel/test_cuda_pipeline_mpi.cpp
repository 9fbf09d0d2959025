// Issue 5 on GPUs, under mpirun with 2 ranks: a tiny GPT-2 cut into 2 stages, one per MPI rank,
// each rank on cuda:(local rank % devices) as `strata train --device cuda` puts it (both ranks may
// share one GPU), trained with the MPI communicator (CUDA tensors staged through pinned host
// memory) and with the NCCL one (NcclMpiCommunicator: NCCL needs a GPU per rank, so that case is
// skipped when the ranks share one), against one process running the same 2 micro-batches on
// the same device. Every test is skipped, on every rank together, without a CUDA device.
//
// Bounds: the pipeline computes the same sums in the same order as the one process (the tied
// embedding's gradient is the sum of its two copies, a + b), so the losses agree to float32
// rounding (1e-5 relative, as the local-ranks test of test_cuda_training.cpp). Between the MPI
// and NCCL runs the only cross-rank sums are those two-term sums, the same bits on either
// backend; they are still compared within 1e-5, not for equality, because the attention
// backward accumulates dq with atomicAdd (ops/attention_cuda.cu), whose order may change from
// run to run when a sequence spans several key tiles.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "engine/cuda_runtime.h"
#include "engine/device.h"
#include "engine/exec_context.h"
#include "io/synthetic.h"
#include "io/text_datasets.h"
#include "models/registry.h"
#include "mpi_test_main.h"
#include "parallel/checkpointing.h"
#include "parallel/topology.h"
#include "parallel/trainer.h"
#include "pipeline_testing.h"
#include "testing/require_gpu.h"

#ifdef STRATA_WITH_NCCL
#include "parallel/comm/nccl_comm.h"
#endif

namespace strata::parallel {
namespace {

using testing::LossRecorder;
using testing::TinyGpt2;

using testing::mpi_world;

constexpr std::chrono::seconds kTimeout(120);

// 6 steps of 2 micro-batches of 4 sequences; one stage, or two cut in the middle.
std::vector<double> train_losses(const TinyGpt2& g, Device device, int stages,
                                 Communicator* world) {
  TrainConfig config;
  config.steps = 6;
  config.batch_size = 8;
  config.seed = 3;
  config.log_every = 1;
  config.num_workers = 0;
  config.optimizer.schedule.base_lr = 1e-3;
  config.optimizer.schedule.kind = ops::LrScheduleKind::kConstant;
  PipelineConfig pipeline;
  pipeline.micro_batches = 2;
  pipeline.stages = stages;
  const size_t layers = static_cast<size_t>(g.spec.layer_size());
  if (stages == 2) pipeline.partition = {{0, layers / 2}, {layers / 2, layers}};
  LossRecorder recorder;
  ExecContext ctx(device);
  Trainer trainer(ctx, g.spec, g.data, nullptr, config, pipeline, world,
                  world == nullptr || world->rank() == 0 ? &recorder : nullptr);
  trainer.run();
  return recorder.losses;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_FALSE(want.empty()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << ", step " << i + 1;
    EXPECT_LE(std::fabs(got[i] - want[i]), 1e-5 * std::fabs(want[i]))
        << what << ", step " << i + 1 << ": " << got[i] << " vs " << want[i];
  }
  EXPECT_NE(want.front(), want.back()) << what << ": training did not move";
}

class CudaPipelineMpi : public ::testing::Test {
 protected:
  void SetUp() override {
    world_ = mpi_world(kTimeout);
    // Decided together, so that every rank skips or runs the same collectives.
    Tensor have = Tensor::full({1}, cuda_device_count() > 0 ? 1.0 : 0.0, DType::kI32);
    wait(*world_->all_reduce(have), *world_, "device check");
    if (have.item<int32_t>() != world_->size()) {
      STRATA_SKIP_WITHOUT_GPU("no CUDA device on every rank (" +
                              ::strata::testing::why_no_cuda_device() + " on rank " +
                              std::to_string(world_->rank()) + ")");
    }
    if (world_->size() != 2) GTEST_SKIP() << "runs as 2 ranks";
    // This rank's GPU, as strata train --device cuda chooses it.
    const ProcessInfo process = discover_process();
    const NodeRanks node = world_->node_ranks();
    device_ = choose_device("cuda", world_->size(),
                            process.has_local_rank ? process.local_rank : node.rank, node.size,
                            cuda_device_count())
                  .device;
    // Whether the two ranks share a GPU (the same host and device UUID).
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    const std::vector<std::string> gpus = all_gather_strings(
        world_.get(), std::string(host) + "/" + cuda::device_uuid(device_.index));
    shared_gpu_ = gpus[0] == gpus[1];
  }

  std::unique_ptr<MpiCommunicator> world_;
  Device device_;
  bool shared_gpu_ = false;
};

TEST_F(CudaPipelineMpi, TinyGpt2OverMpiMatchesOneProcess) {
  const TinyGpt2 g;
  const std::vector<double> piped = train_losses(g, device_, 2, world_.get());
  if (world_->rank() == 0) {
    const std::vector<double> single = train_losses(g, device_, 1, nullptr);
    expect_close(piped, single, "2 stages over MPI against one process on " + device_.str());
  }
  world_->barrier("the end of the comparison");
}

TEST_F(CudaPipelineMpi, TinyGpt2OverNcclMatchesMpiAndOneProcess) {
#ifndef STRATA_WITH_NCCL
  STRATA_SKIP_WITHOUT_GPU("this build has no NCCL");
#else
  if (shared_gpu_) GTEST_SKIP() << "the 2 ranks share one GPU: NCCL needs a GPU per rank";
  const TinyGpt2 g;
  std::vector<double> over_nccl;
  {
    NcclMpiCommunicator nccl(mpi_world(kTimeout), device_);
    over_nccl = train_losses(g, device_, 2, &nccl);
  }
  const std::vector<double> over_mpi = train_losses(g, device_, 2, world_.get());
  if (world_->rank() == 0) {
    const std::vector<double> single = train_losses(g, device_, 1, nullptr);
    expect_close(over_nccl, single, "2 stages over NCCL against one process on " + device_.str());
    expect_close(over_nccl, over_mpi, "2 stages over NCCL against 2 stages over MPI");
  }
  world_->barrier("the end of the comparison");
#endif
}

}  // namespace
}  // namespace strata::parallel
