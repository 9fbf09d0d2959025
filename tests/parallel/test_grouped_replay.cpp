// Grouped training against independent one-process replays: the Trainer on G groups x S stages
// of local ranks, and a loop written here from the definitions on one ParamStore holding the whole
// model, which computes each gradient on the global batch (or micro-batch) in one pass and applies
// it with the ops' update rules and optimizer state of its own.
//
//   --dp-delay D (gpipe and 1f1b, SGD with momentum and AdamW): update u applies the gradient of
//   update u - D as optimizer step u - D (learning rate, momentum, AdamW's moments and bias
//   correction), the first D updates apply nothing (and must not accumulate their gradient into
//   the next one), and the last D gradients are applied at the end of the run.
//
//   async-1f1b with G > 1: micro-batch i runs its forward on stage s with the weights of update
//   v_s(i) = max(0, i - (S - s) + 1) (stage s runs S - s forwards before its first backward, then
//   alternates backward, update, forward), its backward on the same weights (weight stashing), and
//   stage s's update i applies the sum over the groups of micro-batch i's gradient (the mean over
//   the micro-batch's rows in every group).
//
// The replay's gradients are sums in another order than the pipeline's (one pass over the batch
// instead of micro-batches summed over the groups), so the weights agree to fp32 rounding; a
// wrong step index, a stale weight version or a missing update moves them by a learning rate's
// worth.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/exec_context.h"
#include "graph/model_spec.h"
#include "graph/param_store.h"
#include "graph/train_step.h"
#include "io/data_loader.h"
#include "ops/optimizer.h"
#include "parallel/grouped_fixtures.h"
#include "parallel/trainer.h"

namespace strata::parallel {
namespace {

using grouped::mlp_spec;
using grouped::same_values;
using grouped::train_local;
using grouped::Values;

constexpr int64_t kSamples = 512, kFeatures = 12, kClasses = 5;  // train_local's data set

// The whole model on one store, with an optimizer written out here.
class Replay {
 public:
  Replay(const proto::ModelSpec& spec, const TrainConfig& config)
      : ctx_(Device::cpu(), nullptr, 1),
        data_(std::make_shared<testing::LinearClasses>(kSamples, kFeatures, kClasses)),
        model_(graph::build_model(spec)),
        store_(*model_, 0, model_->size(), ctx_.allocator()),
        config_(config) {
    store_.initialize(config.seed);  // the Trainer's initialization, keyed by parameter name
    const int64_t n = store_.params().numel();
    for (int i = 0; i < 2; ++i) state_.push_back(Tensor::zeros({n}, DType::kF32));
  }

  // Sample indices of step k's global batch in the loader's order (one epoch: 16 steps of 32).
  std::vector<int64_t> batch(int64_t step) const {
    io::DataLoaderOptions o;
    o.batch_size = config_.batch_size;
    o.shuffle = true;
    o.seed = config_.seed;
    io::DataLoader loader(data_, o);
    const std::vector<int64_t> order = loader.epoch_order(0);
    EXPECT_LT((step + 1) * config_.batch_size, kSamples + 1) << "the replay covers one epoch";
    return std::vector<int64_t>(order.begin() + step * config_.batch_size,
                                order.begin() + (step + 1) * config_.batch_size);
  }
  // Micro-batch i of step k of G groups x M micro-batches: in every group g, rows
  // [floor(i r / M), floor((i + 1) r / M)) of its shard, rows [g B / G, (g + 1) B / G).
  std::vector<int64_t> micro_batch(int64_t step, int64_t i, int groups, int64_t m) const {
    const std::vector<int64_t> rows = batch(step);
    const int64_t b = static_cast<int64_t>(rows.size());
    std::vector<int64_t> out;
    for (int g = 0; g < groups; ++g) {
      const int64_t begin = g * b / groups, r = (g + 1) * b / groups - begin;
      for (int64_t j = begin + i * r / m; j < begin + (i + 1) * r / m; ++j) out.push_back(rows[j]);
    }
    return out;
  }

  // The gradient of the mean loss over `samples` at the current parameters.
  Tensor gradient(const std::vector<int64_t>& samples) {
    const int64_t n = static_cast<int64_t>(samples.size());
    Tensor x = Tensor::zeros({n, kFeatures}, DType::kF32);
    Tensor y = Tensor::zeros({n}, DType::kI64);
    for (int64_t r = 0; r < n; ++r) {
      data_->get(samples[r], x.data<float>() + r * kFeatures, y.data<int64_t>() + r);
    }
    store_.zero_grads();
    graph::train_forward_backward(ctx_, *model_, x, y, {}, graph::ForwardOptions{});
    return store_.grads().clone();
  }

  // `g` applied as optimizer step `index` (from 0).
  void apply(const Tensor& g, int64_t index) {
    const graph::OptimizerConfig& c = config_.optimizer;
    const double lr = c.schedule.lr_at(index);
    for (const auto& e : store_.param_entries()) {
      auto view = [&](const Tensor& t) { return t.narrow(0, e.offset, e.numel).view(e.shape); };
      const double wd = e.weight_decay ? c.weight_decay : 0.0;
      if (c.kind == graph::OptimizerKind::kSgd) {
        ops::SgdOptions o;
        o.lr = lr;
        o.momentum = c.momentum;
        o.weight_decay = wd;
        ops::sgd_step(ctx_, view(store_.params()), view(g), view(state_[0]), o, index + 1);
      } else {
        ops::AdamWOptions o;
        o.lr = lr;
        o.beta1 = c.beta1;
        o.beta2 = c.beta2;
        o.eps = c.eps;
        o.weight_decay = wd;
        ops::adamw_step(ctx_, view(store_.params()), view(g), view(state_[0]), view(state_[1]), o,
                        index + 1);
      }
    }
  }

  // The parameters of layers [begin, end) (a stage's), by name.
  Values weights(size_t begin = 0, size_t end = SIZE_MAX) const {
    Values v;
    const auto& entries = store_.param_entries();
    for (size_t i = 0; i < entries.size(); ++i) {
      if (entries[i].layer_index < begin || entries[i].layer_index >= end) continue;
      v[entries[i].full_name()] = store_.param(i).to_vector<float>();
    }
    return v;
  }
  Tensor params() const { return store_.params().clone(); }
  void set_params(const Tensor& p) { store_.params().copy_from(p); }
  const graph::ParamStore& store() const { return store_; }

 private:
  ExecContext ctx_;
  std::shared_ptr<const io::Dataset> data_;
  std::unique_ptr<graph::Model> model_;
  graph::ParamStore store_;
  TrainConfig config_;
  std::vector<Tensor> state_;  // momentum, or AdamW's two moments
};

// Delayed SGD/AdamW as defined: gradient u computed on w_u, applied at update u + D as step u.
Values replay_delayed(const TrainConfig& config, int delay) {
  Replay replay(mlp_spec(), config);
  std::vector<Tensor> computed;
  for (int64_t u = 0; u < config.steps; ++u) {
    computed.push_back(replay.gradient(replay.batch(u)));
    if (u >= delay) replay.apply(computed[u - delay], u - delay);
  }
  for (int64_t u = std::max<int64_t>(0, config.steps - delay); u < config.steps; ++u) {
    replay.apply(computed[u], u);  // the flush at the end of the run
  }
  return replay.weights();
}

TrainConfig delayed_config(graph::OptimizerKind kind) {
  TrainConfig c = grouped::train_config(7);
  c.optimizer.kind = kind;
  c.optimizer.weight_decay = 0.05;
  // A warm-up and a cosine decay make every step's learning rate different.
  c.optimizer.schedule.kind = ops::LrScheduleKind::kCosine;
  c.optimizer.schedule.warmup_steps = 3;
  c.optimizer.schedule.total_steps = 7;
  c.optimizer.schedule.base_lr = kind == graph::OptimizerKind::kSgd ? 0.1 : 0.02;
  c.optimizer.schedule.min_lr = 0.001;
  return c;
}

void expect_delayed_run_matches_replay(graph::OptimizerKind kind) {
  const TrainConfig config = delayed_config(kind);
  for (const auto& [schedule, delay] : std::vector<std::pair<ScheduleKind, int>>{
           {ScheduleKind::kGPipe, 2}, {ScheduleKind::k1F1B, 1}}) {
    SCOPED_TRACE(std::string(schedule_name(schedule)) + ", --dp-delay " + std::to_string(delay));
    PipelineConfig p = grouped::layout(2, 2, 2, 8, schedule);
    p.grad_sync.delay = delay;
    p.grad_sync.bucket_mb = 1e-9;
    const grouped::RunResult run = train_local(mlp_spec(), p, config);
    EXPECT_TRUE(same_values(run.groups.at(1), run.weights(), 0.0));
    const Values reference = replay_delayed(config, delay);
    EXPECT_TRUE(same_values(run.weights(), reference, 2e-6));
    // The replay is not blind to the delay: without it, it trains other weights.
    EXPECT_FALSE(same_values(replay_delayed(config, 0), reference, 1e-3));
  }
}

TEST(GroupedReplay, DelayedSgdMatchesTheOneProcessReplay) {
  expect_delayed_run_matches_replay(graph::OptimizerKind::kSgd);
}

TEST(GroupedReplay, DelayedAdamWMatchesTheOneProcessReplay) {
  expect_delayed_run_matches_replay(graph::OptimizerKind::kAdamW);
}

// async-1f1b over G groups: per-stage weight histories, each micro-batch's forward and backward
// on the version its stage had when the forward ran.
Values replay_async(const TrainConfig& config, const PipelineConfig& p) {
  Replay replay(mlp_spec(), config);
  const int S = p.stages;
  const int64_t M = p.micro_batches, N = config.steps * M;  // micro-batches, one update each
  // history[k]: the whole parameter buffer after k updates of every stage (stage s's layers are
  // its own: a stage's update touches only them).
  std::vector<Tensor> history{replay.params()};
  std::vector<int> owner(static_cast<size_t>(replay.params().numel()), 0);  // element's stage
  {
    for (const auto& e : replay.store().param_entries()) {
      int s = 0;
      while (e.layer_index >= p.partition[s].second) ++s;
      std::fill(owner.begin() + e.offset, owner.begin() + e.offset + e.numel, s);
    }
  }
  for (int64_t i = 0; i < N; ++i) {
    // The weights micro-batch i saw: stage s's part of version v_s(i).
    Tensor seen = Tensor::zeros({replay.params().numel()}, DType::kF32);
    for (size_t e = 0; e < owner.size(); ++e) {
      const int s = owner[e];
      const int64_t v = std::max<int64_t>(0, i - (S - s) + 1);
      seen.data<float>()[e] = history[static_cast<size_t>(v)].data<float>()[e];
    }
    replay.set_params(seen);
    const Tensor g = replay.gradient(replay.micro_batch(i / M, i % M, p.groups, M));
    replay.set_params(history.back());
    replay.apply(g, i);  // every stage's update i
    history.push_back(replay.params());
  }
  return replay.weights();
}

TEST(GroupedReplay, AsynchronousScheduleOverGroupsMatchesTheOneProcessReplay) {
  TrainConfig config = grouped::train_config(3);
  config.optimizer.schedule.base_lr = 0.1;
  for (const auto& [groups, stages] : std::vector<std::pair<int, int>>{{2, 2}, {2, 3}}) {
    SCOPED_TRACE(std::to_string(groups) + " x " + std::to_string(stages));
    PipelineConfig p = grouped::layout(groups, stages, 4, 8, ScheduleKind::kAsync1F1B);
    const grouped::RunResult run = train_local(mlp_spec(), p, config);
    EXPECT_TRUE(same_values(run.groups.at(1), run.weights(), 0.0));
    const Values reference = replay_async(config, p);
    EXPECT_TRUE(same_values(run.weights(), reference, 2e-6));
    // Versions matter here: the same updates without stashing (every forward and backward on
    // the newest weights) are other weights.
    PipelineConfig one_stage = p;
    one_stage.stages = 1;
    one_stage.partition = {{0, 8}};
    EXPECT_FALSE(same_values(replay_async(config, one_stage), reference, 1e-3));
  }
}

}  // namespace
}  // namespace strata::parallel
