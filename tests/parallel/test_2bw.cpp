// PipeDream-2BW (--schedule 2bw): the programs (1F1B order, one update per step of M
// micro-batches), the executor against an independent one-process replay of the delayed update
// rule W(t+1) = W(t) - lr * g(W(t-1)), the weight versions a stage holds (two), and the Trainer.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "graph/layers.h"
#include "graph/optimizer.h"
#include "ops/cross_entropy.h"
#include "parallel/comm/local_comm.h"
#include "parallel/runtime/executor.h"
#include "parallel/trainer.h"
#include "pipeline_testing.h"
#include "testing/testing.h"

namespace strata::parallel {
namespace {

using testing::same_weights;
using testing::Weights;

int64_t count(const Program& p, OpCode op) {
  int64_t n = 0;
  for (const Instruction& in : p) n += in.op == op ? 1 : 0;
  return n;
}

// ---- the programs ------------------------------------------------------------------------------

TEST(TwoBw, ParsesAndIsAsynchronousWithOneUpdatePerStep) {
  EXPECT_EQ(parse_schedule("2bw"), ScheduleKind::k2BW);
  EXPECT_STREQ(schedule_name(ScheduleKind::k2BW), "2bw");
  EXPECT_FALSE(is_synchronous(ScheduleKind::k2BW));
  EXPECT_EQ(updates_per_step(ScheduleKind::k2BW, 4), 1);
  EXPECT_EQ(updates_per_step(ScheduleKind::kAsync1F1B, 4), 4);
  EXPECT_EQ(updates_per_step(ScheduleKind::k1F1B, 4), 1);
  try {
    parse_schedule("2BW-flush");
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gpipe, 1f1b, async-1f1b, 2bw"), std::string::npos);
  }
}

// Runs of several steps: valid, 1F1B's in-flight bound, an update after every M-th backward and
// nowhere else, the same forward/backward order as async-1f1b.
TEST(TwoBw, ProgramsAreValidAndUpdateAfterEveryMthBackward) {
  for (int S : {1, 2, 3, 4}) {
    for (int64_t M : {std::max<int64_t>(S - 1, 1), static_cast<int64_t>(S), 2 * int64_t{S} + 1}) {
      const int64_t steps = 3, N = steps * M;
      const Schedule sc = make_schedule(ScheduleKind::k2BW, S, N, 0, M);
      const ScheduleCheck check = check_schedule(sc);
      ASSERT_TRUE(check.ok) << "S " << S << " M " << M << ": " << check.error;
      const Schedule async = make_schedule(ScheduleKind::kAsync1F1B, S, N);
      for (int s = 0; s < S; ++s) {
        EXPECT_EQ(check.max_in_flight[s], std::min<int64_t>(S - s, N));
        const Program& p = sc.programs[s];
        EXPECT_EQ(count(p, OpCode::kOptimizerStep), steps);
        EXPECT_EQ(count(p, OpCode::kReduceGrads), steps);
        int64_t backwards = 0;
        for (size_t k = 0; k < p.size(); ++k) {
          if (p[k].op == OpCode::kBackward) ++backwards;
          if (p[k].op == OpCode::kReduceGrads) {
            EXPECT_EQ(backwards % M, 0) << "S " << S << " M " << M << " stage " << s;
          }
        }
        Program compute, async_compute;
        for (const Instruction& in : p) {
          if (in.op == OpCode::kForward || in.op == OpCode::kBackward) compute.push_back(in);
        }
        for (const Instruction& in : async.programs[s]) {
          if (in.op == OpCode::kForward || in.op == OpCode::kBackward) async_compute.push_back(in);
        }
        EXPECT_EQ(compute, async_compute) << "S " << S << " M " << M << " stage " << s;
      }
    }
  }
}

TEST(TwoBw, RefusesFewerMicroBatchesThanStagesLessOne) {
  try {
    make_schedule(ScheduleKind::k2BW, 4, 8, 0, 2);
    FAIL() << "accepted M = 2 on 4 stages";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--micro-batches >= --stages - 1"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(make_schedule(ScheduleKind::k2BW, 2, 7, 0, 2), Error);  // not whole steps
}

// The checker tells 2bw's update rule apart: async-1f1b's programs (an update per backward) and
// a 2bw program that never applies its last backwards are rejected.
TEST(TwoBw, CheckerRejectsOtherUpdatePlacements) {
  Schedule sc = make_schedule(ScheduleKind::kAsync1F1B, 2, 4);
  sc.kind = ScheduleKind::k2BW;
  sc.update_every = 2;
  ScheduleCheck check = check_schedule(sc);
  EXPECT_FALSE(check.ok);
  EXPECT_NE(check.error.find("follows no Backward that ends an update"), std::string::npos)
      << check.error;

  // One stage, micro-batches 0-2 with updates every 2: the third backward's gradient is left.
  sc = make_schedule(ScheduleKind::k2BW, 1, 4, 0, 2);
  sc.programs[0].resize(sc.programs[0].size() - 4);  // F3 B3 ReduceGrads OptimizerStep
  sc.micro_batches = 3;
  check = check_schedule(sc);
  EXPECT_FALSE(check.ok);
  EXPECT_NE(check.error.find("never applied"), std::string::npos) << check.error;
}

// ---- the executor against a one-process replay of the delayed update rule ---------------------

constexpr int kStages = 4;
constexpr uint64_t kSeed = 5;
constexpr int64_t kRows = 4;

// Per stage a linear layer and a ReLU (the last: a linear layer to 3 classes), cut at the ReLUs.
std::unique_ptr<graph::Model> model() {
  auto m = std::make_unique<graph::Model>("two_bw", Shape{6});
  for (int s = 0; s < kStages; ++s) {
    const std::string i = std::to_string(s);
    const bool last = s == kStages - 1;
    m->add(std::make_unique<graph::LinearLayer>("fc" + i, s == 0 ? 6 : 8, last ? 3 : 8, true));
    if (!last) m->add(std::make_unique<graph::ReluLayer>("relu" + i));
  }
  return m;
}

std::pair<size_t, size_t> range(int s) {
  return {static_cast<size_t>(2 * s),
          static_cast<size_t>(s == kStages - 1 ? 2 * s + 1 : 2 * s + 2)};
}

graph::OptimizerConfig sgd() {
  graph::OptimizerConfig c;
  c.kind = graph::OptimizerKind::kSgd;
  c.momentum = 0.0;
  c.schedule.base_lr = 0.2;
  return c;
}

// Micro-batches of kRows synthetic rows; step = mb / M, normalized by the step's M * kRows rows
// (the gradients of a step's micro-batches add up to that of its mean).
class StepSource final : public MicroBatchSource {
 public:
  explicit StepSource(int64_t m) : m_(m) {}
  Info info(int64_t mb) override {
    return {mb / m_, (mb % m_) * kRows, kRows, static_cast<double>(m_ * kRows)};
  }
  TensorList input(int64_t mb) override {
    return {strata::testing::random_tensor({kRows, 6}, 300 + static_cast<uint64_t>(mb), -1, 1,
                                           DType::kF32)};
  }
  Tensor target(int64_t mb) override {
    return strata::testing::random_ids({kRows}, 3, 400 + static_cast<uint64_t>(mb));
  }

 private:
  int64_t m_;
};

struct Piped {
  Weights weights;
  std::vector<double> losses;          // per step (the last stage's segments)
  std::vector<int64_t> peak_versions;  // per stage
};

// The executor on kStages local ranks, the run's program cut after every update.
Piped run_pipeline(ScheduleKind kind, int64_t M, int64_t steps) {
  const Schedule sc = make_schedule(kind, kStages, steps * M, 0, M);
  EXPECT_TRUE(check_schedule(sc).ok) << check_schedule(sc).error;
  Piped out;
  out.peak_versions.assign(kStages, 0);
  std::mutex mutex;
  LocalWorld world(kStages);
  run_local_ranks(world, [&](LocalCommunicator& comm) {
    const int s = comm.rank();
    auto m = model();
    ExecContext ctx(Device::cpu(), nullptr, 1);
    const auto [b, e] = range(s);
    graph::ParamStore store(*m, b, e, ctx.allocator());
    store.initialize(kSeed);
    ExecutorConfig config;
    config.kind = kind;
    config.optimizer = sgd();
    StageComms comms;
    comms.pipe = &comm;
    Executor executor(ctx, *m, store, {s, kStages, b, e}, comms, config);
    StepSource source(M);
    std::vector<Program> segments(1);
    for (const Instruction& in : sc.programs[s]) {
      segments.back().push_back(in);
      if (in.op == OpCode::kOptimizerStep) segments.emplace_back();
    }
    segments.pop_back();
    std::vector<double> losses;
    for (const Program& p : segments) losses.push_back(executor.run(p, source).loss);
    executor.finish();
    EXPECT_EQ(executor.optimizer_steps(), updates_per_step(kind, M) * steps) << "stage " << s;
    std::lock_guard<std::mutex> lock(mutex);
    for (auto& [name, v] : testing::store_weights(store)) out.weights[name] = v;
    out.peak_versions[s] = executor.weight_versions_peak();
    if (s == kStages - 1) out.losses = losses;
  });
  return out;
}

// One process, the whole model in one store, no schedule: step t runs its M micro-batches in
// order, forward and backward on W[delay ? max(t - 1, 0) : t], the gradients accumulating; then
// W[t + 1] = SGD(W[t], that gradient). Returns the final weights and each step's loss sum.
std::pair<Weights, std::vector<double>> replay(int64_t M, int64_t steps, bool delay) {
  ExecContext ctx(Device::cpu(), nullptr, 1);
  auto m = model();
  graph::ParamStore store(*m, 0, m->size(), ctx.allocator());
  store.initialize(kSeed);
  graph::Optimizer optimizer(store, sgd());
  std::vector<Tensor> w{store.params().clone()};
  std::vector<double> losses;
  StepSource source(M);
  for (int64_t t = 0; t < steps; ++t) {
    store.params().copy_from(w[static_cast<size_t>(delay ? std::max<int64_t>(t - 1, 0) : t)]);
    store.zero_grads();
    double loss_sum = 0.0;
    for (int64_t mb = t * M; mb < (t + 1) * M; ++mb) {
      const MicroBatchSource::Info info = source.info(mb);
      graph::ForwardOptions options;
      options.step = info.step;
      options.sample_offset = info.sample_offset;
      Tape tape;
      const TensorList x = m->forward(ctx, 0, m->size(), source.input(mb), tape, options);
      ops::CrossEntropyOptions loss;
      loss.normalizer = info.loss_normalizer;
      const Tensor target = source.target(mb);
      loss_sum +=
          ops::cross_entropy_forward(ctx, x[0], target, loss).to(DType::kF64).item<double>();
      m->backward(ctx, 0, m->size(), {ops::cross_entropy_backward(ctx, x[0], target, loss, 1.0)},
                  tape);
    }
    losses.push_back(loss_sum);
    store.params().copy_from(w.back());
    optimizer.step(ctx, t);
    w.push_back(store.params().clone());
  }
  store.params().copy_from(w.back());
  return {testing::store_weights(store), losses};
}

// M = S (the paper's m = d) and M = S - 1 (the fewest 2bw runs with two versions).
class TwoBwReplay : public ::testing::TestWithParam<int64_t> {};

TEST_P(TwoBwReplay, MatchesTheDelayedUpdateRuleBitForBitWithTwoVersions) {
  const int64_t M = GetParam(), steps = 5;
  const Piped piped = run_pipeline(ScheduleKind::k2BW, M, steps);
  const auto [weights, losses] = replay(M, steps, true);
  // Bit for bit: each stage runs the same ops on the same operands in the same order as the
  // replay (the gradients of a step accumulate micro-batch by micro-batch in both, SGD is
  // elementwise), so the values cannot differ by rounding either.
  EXPECT_TRUE(same_weights(piped.weights, weights, 0.0));
  ASSERT_EQ(piped.losses.size(), losses.size());
  for (size_t t = 0; t < losses.size(); ++t) {
    EXPECT_EQ(piped.losses[t], losses[t]) << "step " << t;
  }
  // The comparison tells the rules apart: without the delay (PipeDream-Flush's
  // W(t+1) = W(t) - lr * g(W(t))) the weights end elsewhere.
  EXPECT_FALSE(same_weights(piped.weights, replay(M, steps, false).first, 1e-5));
  // Two versions per stage (the latest and the step's), the last stage included; async-1f1b's
  // first stage holds one per micro-batch in flight.
  for (int s = 0; s < kStages; ++s) EXPECT_EQ(piped.peak_versions[s], 2) << "stage " << s;
  const Piped async = run_pipeline(ScheduleKind::kAsync1F1B, M, 2);
  EXPECT_EQ(async.peak_versions[0], std::min<int64_t>(kStages, 2 * M));
  EXPECT_EQ(async.peak_versions[kStages - 1], 1);
}

INSTANTIATE_TEST_SUITE_P(M, TwoBwReplay, ::testing::Values(kStages, kStages - 1));

// ---- the Trainer -------------------------------------------------------------------------------

// The Trainer's bookkeeping for 2bw: one update per step (so the learning-rate schedule counts
// steps, not micro-batches), the loss of a step normalized by its batch, and step 0 on the initial
// weights like 1f1b's (its loss equal to fp32 rounding); later steps differ from 1f1b's (delayed
// gradients) while the loss still goes down.
TEST(TwoBw, TrainerRunsOneUpdatePerStepAndTrains) {
  auto data = std::make_shared<testing::LinearClasses>(256, 12, 5);
  auto train = [&](ScheduleKind kind) {
    testing::LossRecorder losses;
    TrainConfig config = testing::train_config(12);
    config.log_every = 1;
    config.optimizer.schedule.kind = ops::LrScheduleKind::kCosine;
    PipelineConfig pipeline = testing::layout(2, 1, 4, kind);
    LocalWorld world(2);
    run_local_ranks(world, [&](LocalCommunicator& comm) {
      ExecContext ctx(Device::cpu(), nullptr, 1);
      Trainer trainer(ctx, testing::mlp_spec(), data, nullptr, config, pipeline, &comm,
                      comm.rank() == 0 ? &losses : nullptr);
      trainer.run();
    });
    return losses.losses;
  };
  const std::vector<double> two_bw = train(ScheduleKind::k2BW);
  const std::vector<double> flush = train(ScheduleKind::k1F1B);
  ASSERT_EQ(two_bw.size(), 12u);
  ASSERT_EQ(flush.size(), 12u);
  EXPECT_NEAR(two_bw[0], flush[0], 1e-6 * std::fabs(flush[0]));
  EXPECT_NE(two_bw[3], flush[3]);
  for (double l : two_bw) EXPECT_TRUE(std::isfinite(l));
  EXPECT_LT(two_bw.back(), two_bw.front());
}

}  // namespace
}  // namespace strata::parallel
