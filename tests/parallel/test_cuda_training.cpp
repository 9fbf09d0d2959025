// Model-level CUDA check: a tiny GPT-2 and a tiny ResNet trained for a few steps on the CPU and
// on cuda:0 from the same seed and data give the same per-step losses within a float32 bound
// (the kernels sum in other orders; dropout masks are the same Philox stream on both devices).
// The same tiny GPT-2 as a pipeline of 2 local ranks (threads) on one device gives the losses of
// the single device. Both again in bf16 and fp16 mixed precision against the CPU's emulation of
// them. Layers moved between the two local ranks on one device during the run (issue 14's GPU
// check) give bitwise the losses of the run without the move. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "engine/device.h"
#include "engine/exec_context.h"
#include "io/synthetic.h"
#include "io/text_datasets.h"
#include "models/registry.h"
#include "parallel/comm/local_comm.h"
#include "parallel/trainer.h"
#include "pipeline_testing.h"
#include "testing/cuda_parity.h"

namespace strata {
namespace {

using parallel::testing::LossRecorder;
using parallel::testing::TinyGpt2;

// A tiny ResNet on 256 synthetic 32 x 32 images of 10 classes.
struct TinyResNet {
  std::shared_ptr<const io::Dataset> data = [] {
    io::SyntheticImageOptions options;
    options.samples = 256;
    options.channels = 3;
    options.height = 32;
    options.width = 32;
    options.num_classes = 10;
    return io::open_synthetic_images(io::Split::kTrain, options);
  }();
  proto::ModelSpec spec = models::model_spec("resnet", "tiny", {3, 32, 32}, 10);
};

std::vector<double> train_losses(Device device, const proto::ModelSpec& spec,
                                 std::shared_ptr<const io::Dataset> data, int64_t batch,
                                 const parallel::PipelineConfig& pipeline = {},
                                 DType compute = DType::kF32, int* migrations = nullptr) {
  parallel::TrainConfig config;
  config.compute_dtype = compute;
  if (compute == DType::kF16) config.loss_scale = parallel::parse_loss_scale("dynamic");
  config.steps = 6;
  config.batch_size = batch;
  config.seed = 3;
  config.log_every = 1;
  config.optimizer.schedule.base_lr = 1e-3;
  config.optimizer.schedule.kind = ops::LrScheduleKind::kConstant;
  LossRecorder recorder;
  const int ranks = pipeline.stages * pipeline.groups;
  if (ranks == 1) {
    ExecContext ctx(device);
    parallel::Trainer trainer(ctx, spec, data, nullptr, config, pipeline, nullptr, &recorder);
    trainer.run();
    if (migrations != nullptr) *migrations = recorder.migrations;
    return recorder.losses;
  }
  // Local ranks: threads of this process, each with its own context (stream) on `device`.
  parallel::LocalWorld world(ranks);
  parallel::run_local_ranks(world, [&](parallel::LocalCommunicator& comm) {
    ExecContext ctx(device);
    parallel::Trainer trainer(ctx, spec, data, nullptr, config, pipeline, &comm,
                              comm.rank() == 0 ? &recorder : nullptr);
    trainer.run();
  });
  if (migrations != nullptr) *migrations = recorder.migrations;
  return recorder.losses;
}

void expect_same_losses(const std::vector<double>& gpu, const std::vector<double>& cpu,
                        double bound) {
  ASSERT_EQ(gpu.size(), cpu.size());
  ASSERT_FALSE(cpu.empty());
  for (size_t i = 0; i < cpu.size(); ++i) {
    ASSERT_TRUE(std::isfinite(gpu[i])) << "step " << i + 1;
    EXPECT_LE(std::fabs(gpu[i] - cpu[i]), bound * std::fabs(cpu[i]))
        << "step " << i + 1 << ": cuda " << gpu[i] << " vs cpu " << cpu[i];
  }
  // Training moved: the losses are not all the first one.
  EXPECT_NE(cpu.front(), cpu.back());
}

TEST(CudaTraining, TinyGpt2LossesMatchTheCpu) {
  STRATA_REQUIRE_CUDA();
  const TinyGpt2 g;
  const std::vector<double> cpu = train_losses(Device::cpu(), g.spec, g.data, 8);
  const std::vector<double> gpu = train_losses(Device::cuda(0), g.spec, g.data, 8);
  expect_same_losses(gpu, cpu, 1e-4);
}

TEST(CudaTraining, TinyResNetLossesMatchTheCpu) {
  STRATA_REQUIRE_CUDA();
  const TinyResNet r;
  const std::vector<double> cpu = train_losses(Device::cpu(), r.spec, r.data, 16);
  const std::vector<double> gpu = train_losses(Device::cuda(0), r.spec, r.data, 16);
  expect_same_losses(gpu, cpu, 1e-4);
}

// Mixed precision: the CPU emulates 16 bits (f32 math on 16-bit values, rounded where CUDA rounds),
// so the two devices follow the same 16-bit path; they differ only in summation orders, whose
// effects bf16's 8-bit mantissa magnifies. The 16-bit runs also stay near the f32 one.
TEST(CudaTraining, TinyGpt2MixedPrecisionLossesMatchTheCpu) {
  STRATA_REQUIRE_CUDA();
  const TinyGpt2 g;
  const std::vector<double> f32 = train_losses(Device::cpu(), g.spec, g.data, 8);
  for (DType d : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(d));
    const std::vector<double> cpu = train_losses(Device::cpu(), g.spec, g.data, 8, {}, d);
    const std::vector<double> gpu = train_losses(Device::cuda(0), g.spec, g.data, 8, {}, d);
    expect_same_losses(gpu, cpu, d == DType::kBF16 ? 2e-2 : 5e-3);
    expect_same_losses(gpu, f32, d == DType::kBF16 ? 3e-2 : 1e-2);
  }
}

TEST(CudaTraining, TinyResNetMixedPrecisionLossesMatchTheCpu) {
  STRATA_REQUIRE_CUDA();
  const TinyResNet r;
  for (DType d : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(d));
    const std::vector<double> cpu = train_losses(Device::cpu(), r.spec, r.data, 16, {}, d);
    const std::vector<double> gpu = train_losses(Device::cuda(0), r.spec, r.data, 16, {}, d);
    expect_same_losses(gpu, cpu, d == DType::kBF16 ? 3e-2 : 1e-2);
  }
}

// Issue 5's GPU check: 2 stages as local ranks on one device (activations, gradients and the tied
// embedding's gradient cross between the ranks through host copies) against one rank running the
// same 2 micro-batches: the same sums in the same order, so equal up to float32 rounding.
TEST(CudaTraining, TinyGpt2PipelineOfLocalRanksOnOneDeviceMatchesOneRank) {
  STRATA_REQUIRE_CUDA();
  const TinyGpt2 g;
  parallel::PipelineConfig one;
  one.micro_batches = 2;
  parallel::PipelineConfig two = one;
  two.stages = 2;
  const size_t layers = static_cast<size_t>(g.spec.layer_size());
  two.partition = {{0, layers / 2}, {layers / 2, layers}};
  const std::vector<double> single = train_losses(Device::cuda(0), g.spec, g.data, 8, one);
  const std::vector<double> piped = train_losses(Device::cuda(0), g.spec, g.data, 8, two);
  expect_same_losses(piped, single, 1e-5);
}

// Issue 14's GPU check: a --migrate-at move on GPU ranks (2 local ranks on one device, 1f1b and
// gpipe) gives bitwise the per-step losses of the same run without it: the moved layer's weights,
// gradients and optimizer state cross between the ranks' stores, the arithmetic is the same.
void expect_moves_change_no_loss(Device device) {
  const TinyGpt2 g;
  const size_t layers = static_cast<size_t>(g.spec.layer_size());
  for (parallel::ScheduleKind kind :
       {parallel::ScheduleKind::k1F1B, parallel::ScheduleKind::kGPipe}) {
    SCOPED_TRACE(parallel::schedule_name(kind));
    parallel::PipelineConfig plain;
    plain.micro_batches = 2;
    plain.stages = 2;
    plain.schedule = kind;
    plain.partition = {{0, layers / 2}, {layers / 2, layers}};
    parallel::PipelineConfig moved = plain;
    // After step 2 one layer goes down, after step 4 it comes back.
    moved.migrations = {{2, {{0, layers / 2 + 1}, {layers / 2 + 1, layers}}},
                        {4, {{0, layers / 2}, {layers / 2, layers}}}};
    const std::vector<double> a = train_losses(device, g.spec, g.data, 8, plain);
    int moves = 0;
    const std::vector<double> b =
        train_losses(device, g.spec, g.data, 8, moved, DType::kF32, &moves);
    ASSERT_EQ(a.size(), 6u);
    EXPECT_EQ(moves, 2) << "the layers did not move";
    EXPECT_EQ(a, b) << "a move on " << device.str() << " changed a loss";
  }
}

TEST(CudaTraining, TinyGpt2MigrationOnOneDeviceEqualsTheRunWithout) {
  STRATA_REQUIRE_CUDA();
  expect_moves_change_no_loss(Device::cuda(0));
}

// The same check on CPU ranks, so that the harness itself is tested where there is no GPU.
TEST(CudaTraining, TinyGpt2MigrationCheckHoldsOnTheCpu) {
  expect_moves_change_no_loss(Device::cpu());
}

}  // namespace
}  // namespace strata
