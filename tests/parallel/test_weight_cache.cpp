// The weight cache (--weight-cache on, parallel/runtime/weight_versions.h): async-1f1b's and
// 2bw's stashed weight versions in a host pool with one of them cached on the device. The results
// are bit for bit those without the cache; the first stage's measured device peak is lower, and
// grows less with the number of stages.
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "graph/layers.h"
#include "parallel/comm/local_comm.h"
#include "parallel/runtime/executor.h"
#include "pipeline_testing.h"
#include "testing/testing.h"

namespace strata::parallel {
namespace {

using testing::same_weights;
using testing::Weights;

constexpr int64_t kWidth = 128;  // parameters well above the activations of 4 rows
constexpr int64_t kRows = 4;

// Stage s < S - 1: a linear layer kWidth -> kWidth and a ReLU; the last stage: kWidth -> 3. The
// first stage is the same whatever S.
std::unique_ptr<graph::Model> model(int S) {
  auto m = std::make_unique<graph::Model>("cache", Shape{kWidth});
  for (int s = 0; s + 1 < S; ++s) {
    m->add(std::make_unique<graph::LinearLayer>("fc" + std::to_string(s), kWidth, kWidth, true));
    m->add(std::make_unique<graph::ReluLayer>("relu" + std::to_string(s)));
  }
  m->add(std::make_unique<graph::LinearLayer>("out", kWidth, 3, true));
  return m;
}

std::pair<size_t, size_t> range(int s, int S) {
  return {static_cast<size_t>(2 * s), static_cast<size_t>(s == S - 1 ? 2 * s + 1 : 2 * s + 2)};
}

class Source final : public MicroBatchSource {
 public:
  explicit Source(int64_t m) : m_(m) {}
  Info info(int64_t mb) override {
    return {mb / m_, (mb % m_) * kRows, kRows, static_cast<double>(m_ * kRows)};
  }
  TensorList input(int64_t mb) override {
    return {strata::testing::random_tensor({kRows, kWidth}, 500 + static_cast<uint64_t>(mb), -1, 1,
                                           DType::kF32)};
  }
  Tensor target(int64_t mb) override {
    return strata::testing::random_ids({kRows}, 3, 600 + static_cast<uint64_t>(mb));
  }

 private:
  int64_t m_;
};

struct CacheRun {
  Weights weights;
  double loss = 0.0;              // the last stage's, over the run
  std::vector<size_t> peak;       // per stage: the device allocator's peak
  std::vector<size_t> host_peak;  // per stage: the host pool's peak
  std::vector<int64_t> versions;  // per stage: weight versions held at once
  size_t first_stage_params = 0;  // bytes
};

CacheRun run(ScheduleKind kind, int S, int64_t M, int64_t steps, bool cache) {
  const Schedule sc = make_schedule(kind, S, steps * M, 0, M);
  EXPECT_TRUE(check_schedule(sc).ok) << check_schedule(sc).error;
  CacheRun out;
  out.peak.assign(S, 0);
  out.host_peak.assign(S, 0);
  out.versions.assign(S, 0);
  std::mutex mutex;
  LocalWorld world(S);
  run_local_ranks(world, [&](LocalCommunicator& comm) {
    const int s = comm.rank();
    auto m = model(S);
    CpuAllocator device, host;
    ExecContext ctx(Device::cpu(), &device, 1);
    const auto [b, e] = range(s, S);
    StepStats stats;
    Weights weights;
    size_t param_bytes = 0;
    {
      graph::ParamStore store(*m, b, e, ctx.allocator());
      store.initialize(9);
      param_bytes = store.params().nbytes();
      ExecutorConfig config;
      config.kind = kind;
      config.optimizer.kind = graph::OptimizerKind::kSgd;
      config.optimizer.momentum = 0.0;
      config.optimizer.schedule.base_lr = 0.1;
      config.weight_cache = cache;
      config.swap_pool = &host;
      StageComms comms;
      comms.pipe = &comm;
      Executor executor(ctx, *m, store, {s, S, b, e}, comms, config);
      Source source(M);
      stats = executor.run(sc.programs[s], source);
      executor.finish();
      weights = testing::store_weights(store);
      std::lock_guard<std::mutex> lock(mutex);
      out.versions[s] = executor.weight_versions_peak();
    }
    std::lock_guard<std::mutex> lock(mutex);
    for (auto& [name, v] : weights) out.weights[name] = v;
    out.peak[s] = device.stats().peak;
    out.host_peak[s] = host.stats().peak;
    if (s == S - 1) out.loss = stats.loss;
    if (s == 0) out.first_stage_params = param_bytes;
  });
  return out;
}

TEST(WeightCache, Async1f1bBitwiseWithLowerPeakThatGrowsLessWithStages) {
  const int64_t M = 4, steps = 3;
  CacheRun off[2], on[2];
  const int stages[2] = {2, 4};
  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE("S = " + std::to_string(stages[i]));
    off[i] = run(ScheduleKind::kAsync1F1B, stages[i], M, steps, false);
    on[i] = run(ScheduleKind::kAsync1F1B, stages[i], M, steps, true);
    EXPECT_TRUE(same_weights(on[i].weights, off[i].weights, 0.0));
    EXPECT_EQ(on[i].loss, off[i].loss);
    // The same versions are kept (S on the first stage), on the host instead of the device.
    EXPECT_EQ(on[i].versions[0], stages[i]);
    EXPECT_EQ(off[i].versions[0], stages[i]);
    EXPECT_EQ(off[i].host_peak[0], 0u);
    EXPECT_GE(on[i].host_peak[0], static_cast<size_t>(stages[i] - 1) * on[i].first_stage_params);
    EXPECT_LT(on[i].peak[0], off[i].peak[0]);
  }
  const size_t P = on[0].first_stage_params;
  EXPECT_EQ(P, on[1].first_stage_params);
  // Without the cache the first stage keeps two more versions at S = 4 (and its latest set
  // aside), with it only more host memory.
  const double grows_off = static_cast<double>(off[1].peak[0]) - off[0].peak[0];
  const double grows_on = static_cast<double>(on[1].peak[0]) - on[0].peak[0];
  EXPECT_GE(grows_off, 2.0 * P);
  EXPECT_LT(grows_on, 0.5 * P);
  std::printf("first stage peak (P = %zu B): S=2 off %zu on %zu, S=4 off %zu on %zu\n", P,
              off[0].peak[0], on[0].peak[0], off[1].peak[0], on[1].peak[0]);
}

TEST(WeightCache, TwoBwBitwiseWithLowerPeak) {
  const CacheRun off = run(ScheduleKind::k2BW, 4, 4, 4, false);
  const CacheRun on = run(ScheduleKind::k2BW, 4, 4, 4, true);
  EXPECT_TRUE(same_weights(on.weights, off.weights, 0.0));
  EXPECT_EQ(on.loss, off.loss);
  for (int s = 0; s < 4; ++s) {
    EXPECT_EQ(on.versions[s], 2) << "stage " << s;
    // The last stage's layer (kWidth -> 3) is small beside its activations.
    if (s < 3) EXPECT_LT(on.peak[s], off.peak[s]) << "stage " << s;
    EXPECT_LE(on.peak[s], off.peak[s]) << "stage " << s;
  }
}

// Prefetches that overtake each other behind a slow copy thread (a loaded machine): each copy's
// device storage is allocated when it is queued, so a cached copy dropped while in flight must be
// waited for, or the device holds one more version per overtaken prefetch. The store's weights
// and one cached version at most, however slow the copies.
TEST(WeightCache, OvertakenPrefetchesHoldOneCachedVersionOnTheDevice) {
  auto m = model(2);
  CpuAllocator device, host;
  ExecContext ctx(Device::cpu(), &device, 1);
  graph::ParamStore store(*m, 0, 2, device);
  store.initialize(1);
  CopyEngine copies(ctx, host, "--swap-pool");
  WeightVersions versions(ctx, store);
  versions.use_cache(&copies);
  for (int64_t v = 0; v < 4; ++v) versions.stash(v);
  const size_t params = store.params().numel() * sizeof(float);
  device.reset_peak();
  const size_t before = device.stats().peak;
  copies.set_copy_delay(std::chrono::milliseconds(20));
  for (int64_t v = 0; v < 4; ++v) versions.prefetch(v);  // each overtakes the one before
  versions.use(3, 4, "Forward", 0);
  versions.restore_latest();
  EXPECT_LE(device.stats().peak, before + 2 * params)
      << "device peak " << device.stats().peak << " B over " << before << " B of store and "
      << "gradients; parameters " << params << " B";
}

TEST(WeightCache, SynchronousSchedulesAreRefusedByName) {
  LocalWorld world(1);
  run_local_ranks(world, [&](LocalCommunicator& comm) {
    auto m = model(1);
    CpuAllocator host;
    ExecContext ctx(Device::cpu(), nullptr, 1);
    graph::ParamStore store(*m, 0, m->size(), ctx.allocator());
    ExecutorConfig config;
    config.kind = ScheduleKind::k1F1B;
    config.weight_cache = true;
    config.swap_pool = &host;
    StageComms comms;
    comms.pipe = &comm;
    try {
      Executor executor(ctx, *m, store, {0, 1, 0, m->size()}, comms, config);
      ADD_FAILURE() << "accepted --weight-cache on with 1f1b";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--weight-cache on needs"), std::string::npos)
          << e.what();
    }
  });
}

}  // namespace
}  // namespace strata::parallel
