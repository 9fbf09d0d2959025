// The swap and recompute mechanisms of a stage (parallel/runtime/stage_memory.h) and their
// transport (copy_engine.h): bitwise the gradients and statistics of keeping everything, whatever
// the plan and however slow the copies; every record released; device memory actually freed.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <vector>

#include "engine/allocator.h"
#include "engine/exec_context.h"
#include "graph/layers.h"
#include "graph/model.h"
#include "graph/param_store.h"
#include "parallel/runtime/copy_engine.h"
#include "parallel/runtime/memory_plan.h"
#include "parallel/runtime/stage_memory.h"
#include "testing/testing.h"

namespace strata::parallel {
namespace {

// Linear, batch norm (running statistics), ReLU (saves its output, which the next layer saves
// as its input: a shared storage), dropout (Philox masks), linear, ReLU, linear.
std::unique_ptr<graph::Model> small_model() {
  auto m = std::make_unique<graph::Model>("m", Shape{6});
  m->add(std::make_unique<graph::LinearLayer>("fc1", 6, 16, true));
  m->add(std::make_unique<graph::BatchNormLayer>("bn", Shape{16}, 0.1, 1e-5, true));
  m->add(std::make_unique<graph::ReluLayer>("relu1"));
  m->add(std::make_unique<graph::DropoutLayer>("drop", 0.3));
  m->add(std::make_unique<graph::LinearLayer>("fc2", 16, 12, true));
  m->add(std::make_unique<graph::ReluLayer>("relu2"));
  m->add(std::make_unique<graph::LinearLayer>("fc3", 12, 4, false));
  return m;
}

struct Result {
  std::vector<float> grads, buffers, input_grad;
  StageMemoryStats stats;
  size_t peak = 0;
};

// Three micro-batches forwarded, then backwarded oldest first (as a stage of a pipeline holds
// them), under `plan`, on layers [1, 7) so that the stage has an input gradient to return.
Result run(const MemoryPlan& plan, std::chrono::microseconds delay = {}) {
  auto model = small_model();
  CpuAllocator device;
  CpuAllocator pool;
  ExecContext ctx(Device::cpu(), &device, 2);
  graph::ParamStore store(*model, 0, model->size(), device);
  store.initialize(3);
  CopyEngine copies(ctx, pool, "--swap-pool");
  copies.set_copy_delay(delay);
  Result r;
  {
    StageMemory memory(ctx, *model, store, 1, model->size(), plan, &copies);
    std::vector<Tensor> inputs;
    for (int64_t mb = 0; mb < 3; ++mb) {
      graph::ForwardOptions options;
      options.seed = 7;
      options.step = 2;
      options.sample_offset = 5 * mb;
      const Tensor x = strata::testing::random_tensor({5, 6}, 40 + mb, -1, 1, DType::kF32);
      Tape tape;
      const Tensor h =
          model->forward(ctx, 0, 1, {to_allocator(x, device)}, tape, graph::ForwardOptions{})[0];
      inputs.push_back(h);
      memory.forward(mb, {h}, options);
    }
    EXPECT_EQ(memory.live_micro_batches(), 3);
    for (int64_t mb = 0; mb < 3; ++mb) {
      memory.prefetch(mb);
      const Tensor dy = strata::testing::random_tensor({5, 4}, 90 + mb, -1, 1, DType::kF32);
      const TensorList dx = memory.backward(mb, {to_allocator(dy, device)});
      for (float v : dx[0].to_vector<float>()) r.input_grad.push_back(v);
    }
    EXPECT_EQ(memory.live_records(), 0);
    r.stats = memory.stats();
  }
  r.grads = store.grads().to_vector<float>();
  r.buffers = store.buffers().to_vector<float>();
  r.peak = device.stats().peak;
  return r;
}

MemoryPlan plan_of(std::vector<MemoryPolicy> policies) {
  MemoryPlan p;
  p.layers = std::move(policies);
  return p;
}

template <typename F>
void expect_error(F call, const std::string& text) {
  try {
    call();
    ADD_FAILURE() << "expected an error containing: " << text;
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

constexpr MemoryPolicy K = MemoryPolicy::kKeep, S = MemoryPolicy::kSwap,
                       R = MemoryPolicy::kRecompute;

TEST(StageMemory, SwapAndRecomputeGiveBitwiseTheGradientsAndStatisticsOfKeep) {
  const Result keep = run(MemoryPlan::uniform(7, K));
  EXPECT_EQ(keep.stats.records_created, 18);  // 3 micro-batches x 6 layers
  EXPECT_EQ(keep.stats.records_released, 18);
  EXPECT_EQ(keep.stats.max_micro_batches, 3);
  for (const MemoryPlan& plan :
       {MemoryPlan::uniform(7, S), MemoryPlan::uniform(7, R), plan_of({K, R, R, S, K, R, S}),
        plan_of({K, S, K, R, R, R, K}), plan_of({K, K, R, K, S, S, R})}) {
    const Result other = run(plan);
    EXPECT_EQ(other.grads, keep.grads)
        << describe_memory_plan(plan, 1, 7, {"0", "fc1", "bn", "relu1", "drop", "fc2", "relu2"});
    EXPECT_EQ(other.buffers, keep.buffers) << "running statistics updated once per forward";
    EXPECT_EQ(other.input_grad, keep.input_grad);
    EXPECT_EQ(other.stats.records_released, other.stats.records_created);
  }
}

TEST(StageMemory, RecomputeReplaysSegmentsAndSwapMovesBytesBothWays) {
  const Result recompute = run(MemoryPlan::uniform(7, R));
  EXPECT_EQ(recompute.stats.recomputed_layers, 18);  // one segment of 6 layers per micro-batch
  EXPECT_GT(recompute.stats.recompute_seconds, 0.0);
  EXPECT_EQ(recompute.stats.swapped_out_bytes, 0u);
  const Result swap = run(MemoryPlan::uniform(7, S));
  EXPECT_GT(swap.stats.swapped_out_bytes, 0u);
  EXPECT_EQ(swap.stats.swapped_in_bytes, swap.stats.swapped_out_bytes);
  EXPECT_EQ(swap.stats.recomputed_layers, 0);
}

// Copies slower than compute: the backward waits for its tensors, and nothing changes.
TEST(StageMemory, ADelayedCopyMakesComputeWaitAndChangesNothing) {
  const Result keep = run(MemoryPlan::uniform(7, K));
  const Result slow = run(MemoryPlan::uniform(7, S), std::chrono::milliseconds(15));
  EXPECT_EQ(slow.grads, keep.grads);
  EXPECT_EQ(slow.buffers, keep.buffers);
  EXPECT_EQ(slow.input_grad, keep.input_grad);
  EXPECT_GT(slow.stats.swap_wait_seconds, 0.01);
}

// Device memory: records that swap or recompute leave the device.
TEST(StageMemory, SwapAndRecomputeLowerThePeakOfDeviceMemory) {
  const Result keep = run(MemoryPlan::uniform(7, K));
  const Result swap = run(MemoryPlan::uniform(7, S), std::chrono::microseconds(0));
  const Result recompute = run(MemoryPlan::uniform(7, R));
  EXPECT_LT(recompute.peak, keep.peak);
  EXPECT_LT(swap.peak, keep.peak);
}

TEST(CopyEngine, RoundTripIsBitExact) {
  CpuAllocator device, pool;
  ExecContext ctx(Device::cpu(), &device, 1);
  CopyEngine copies(ctx, pool, "--swap-pool");
  const Tensor t = strata::testing::random_tensor({1000, 7}, 5, -3, 3, DType::kF32);
  const Tensor on_device = to_allocator(t, device);
  auto out = copies.to_host(on_device.storage());
  auto in = copies.to_device(out->destination(), out);
  copies.order_before_compute(*in);
  const Tensor back(in->destination(), 0, t.shape(), t.strides(), t.dtype());
  EXPECT_EQ(back.to_vector<float>(), t.to_vector<float>());
  EXPECT_EQ(&in->destination()->allocator(), &device);
  EXPECT_EQ(&out->destination()->allocator(), &pool);
  EXPECT_EQ(copies.stats().bytes_to_host, t.nbytes());
  EXPECT_EQ(copies.stats().bytes_to_device, t.nbytes());
}

TEST(CopyEngine, AFullPoolNamesItsSizeAndTheFlag) {
  CpuAllocator device, pool;
  pool.set_limit(1000);
  ExecContext ctx(Device::cpu(), &device, 1);
  CopyEngine copies(ctx, pool, "--swap-pool");
  const Tensor t = Tensor::zeros({1000}, DType::kF32, &device);
  try {
    copies.to_host(t.storage());
    FAIL() << "expected the pool to be full";
  } catch (const OutOfMemoryError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("swap pool"), std::string::npos) << what;
    EXPECT_NE(what.find("--swap-pool 1000 B"), std::string::npos) << what;
  }
}

// Under a device limit, memory that swap-outs still hold is waited for before an allocation is
// refused (the allocator's pressure handler), so a slow copy does not turn into out of memory.
TEST(StageMemory, PressureWaitsForSwapOutsInFlight) {
  auto model = small_model();
  CpuAllocator device, pool;
  ExecContext ctx(Device::cpu(), &device, 1);
  graph::ParamStore store(*model, 0, model->size(), device);
  store.initialize(3);
  CopyEngine copies(ctx, pool, "--swap-pool");
  copies.set_copy_delay(std::chrono::milliseconds(30));
  StageMemory memory(ctx, *model, store, 0, model->size(), MemoryPlan::uniform(7, S), &copies);
  const Tensor x =
      to_allocator(strata::testing::random_tensor({64, 6}, 4, -1, 1, DType::kF32), device);
  graph::ForwardOptions options;
  memory.forward(0, {x}, options);
  // Everything the forward saved is on its way out; allocate as much again under a limit that
  // only fits once the swap-outs are done.
  const size_t in_use = device.stats().current;
  const size_t params = store.params().nbytes() + store.grads().nbytes() + store.buffers().nbytes();
  ASSERT_GT(in_use, params + x.nbytes());
  device.set_limit(in_use);
  const Tensor big = Tensor::empty({static_cast<int64_t>((in_use - params - x.nbytes()) / 4)},
                                   DType::kF32, &device);
  EXPECT_TRUE(big.defined());
  device.set_limit(0);
  memory.backward(0, {Tensor::zeros({64, 4}, DType::kF32, &device)});
}

TEST(MemoryPlan, ParsesRangesByNameAndIndexOverABase) {
  const std::vector<std::string> names{"embed", "blocks.0", "blocks.1", "blocks.2", "head"};
  const MemoryPlan plan = parse_memory_plan("blocks.0-blocks.1:recompute, 3:swap", names,
                                            MemoryPlan::uniform(5, MemoryPolicy::kKeep));
  EXPECT_EQ(plan, plan_of({K, R, R, S, K}));
  EXPECT_EQ(describe_memory_plan(plan, 0, 5, names),
            "keep embed, recompute blocks.0-blocks.1, swap blocks.2, keep head");
  const std::vector<RecomputeSegment> segments =
      recompute_segments(plan_of({R, R, K, R, S, R}), 0, 6);
  ASSERT_EQ(segments.size(), 3u);
  EXPECT_EQ(segments[0].begin, 0u);
  EXPECT_EQ(segments[0].end, 2u);
  EXPECT_EQ(segments[1].begin, 3u);
  EXPECT_EQ(segments[2].begin, 5u);
  EXPECT_EQ(parse_memory_plan("", names, MemoryPlan::uniform(5, S)), MemoryPlan::uniform(5, S));
}

TEST(MemoryPlan, BadSpecsNameTheItemAndListTheLayers) {
  const std::vector<std::string> names{"embed", "blocks.0", "head"};
  const MemoryPlan base = MemoryPlan::uniform(3, K);
  expect_error([&] { parse_memory_plan("blocks.9:swap", names, base); },
               "--memory-plan range 'blocks.9': no layer is named 'blocks.9' "
               "(layers: embed blocks.0 head)");
  expect_error([&] { parse_memory_plan("head:fast", names, base); },
               "unknown memory policy 'fast' (valid: keep, swap, recompute)");
  expect_error([&] { parse_memory_plan("head", names, base); }, "is not RANGE:POLICY");
}

}  // namespace
}  // namespace strata::parallel
