// Pipelines of local ranks (threads) against the single process: the synchronous schedules give
// the same weights to fp32 rounding for every layout; the asynchronous one runs each backward on
// the weights its forward saw; failures on one rank stop every rank quickly.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "graph/layers.h"
#include "graph/model_spec.h"
#include "io/data_loader.h"
#include "io/dataset.h"
#include "models/registry.h"
#include "ops/matmul.h"
#include "parallel/comm/local_comm.h"
#include "parallel/executor.h"
#include "parallel/trainer.h"
#include "testing/testing.h"

namespace strata::parallel {
namespace {

// A learnable synthetic classification set: the class is the argmax of a fixed linear map.
class LinearClasses final : public io::Dataset {
 public:
  LinearClasses(int64_t n, int64_t features, int64_t classes)
      : n_(n),
        features_(features),
        classes_(classes),
        x_(testing::random_tensor({n, features}, 11, -1, 1, DType::kF32)),
        w_(testing::random_tensor({classes, features}, 12, -1, 1, DType::kF64)) {}
  std::string name() const override { return "linear-classes"; }
  int64_t size() const override { return n_; }
  io::SampleSpec input_spec() const override { return {{features_}, DType::kF32}; }
  io::SampleSpec target_spec() const override { return {{}, DType::kI64}; }
  int64_t num_classes() const override { return classes_; }
  void get(int64_t i, void* input, void* target) const override {
    const float* x = x_.data<float>() + i * features_;
    std::copy(x, x + features_, static_cast<float*>(input));
    const double* w = w_.data<double>();
    int64_t best = 0;
    double best_v = -1e300;
    for (int64_t c = 0; c < classes_; ++c) {
      double v = 0;
      for (int64_t f = 0; f < features_; ++f) v += w[c * features_ + f] * x[f];
      if (v > best_v) best_v = v, best = c;
    }
    *static_cast<int64_t*>(target) = best;
  }

 private:
  int64_t n_, features_, classes_;
  Tensor x_, w_;
};

// Four linear layers with ReLUs: eight layers to cut into up to four stages.
proto::ModelSpec mlp_spec() {
  return graph::parse_model_spec(R"(
    name: "mlp4"
    input { shape: [12] }
    layer { name: "fc1" type: "linear" linear { out_features: 16 } }
    layer { name: "relu1" type: "relu" }
    layer { name: "fc2" type: "linear" linear { out_features: 16 } }
    layer { name: "relu2" type: "relu" }
    layer { name: "fc3" type: "linear" linear { out_features: 16 } }
    layer { name: "relu3" type: "relu" }
    layer { name: "fc4" type: "linear" linear { out_features: 16 } }
    layer { name: "fc5" type: "linear" linear { out_features: 5 } }
  )",
                                 "mlp4");
}

std::vector<std::pair<size_t, size_t>> even_partition(size_t layers, int stages) {
  std::vector<std::pair<size_t, size_t>> p;
  for (int s = 0; s < stages; ++s) p.push_back({layers * s / stages, layers * (s + 1) / stages});
  return p;
}

TrainConfig train_config(int64_t steps) {
  TrainConfig c;
  c.steps = steps;
  c.batch_size = 32;
  c.seed = 7;
  c.num_workers = 0;
  c.optimizer.kind = graph::OptimizerKind::kSgd;
  c.optimizer.momentum = 0.9;
  c.optimizer.schedule.base_lr = 0.05;
  return c;
}

// Weights by "layer.param" after training in the given layout (collected from every stage).
std::map<std::string, std::vector<float>> train(const PipelineConfig& pipeline, int64_t steps,
                                                TrainSummary* summary = nullptr) {
  auto data = std::make_shared<LinearClasses>(512, 12, 5);
  const proto::ModelSpec spec = mlp_spec();
  const TrainConfig config = train_config(steps);
  std::map<std::string, std::vector<float>> weights;
  std::mutex mutex;
  auto body = [&](Communicator* world) {
    ExecContext ctx(Device::cpu(), nullptr, 1);
    Trainer trainer(ctx, spec, data, nullptr, config, pipeline, world, nullptr);
    const TrainSummary s = trainer.run();
    std::lock_guard<std::mutex> lock(mutex);
    if (summary != nullptr && (world == nullptr || world->rank() == 0)) *summary = s;
    if (trainer.group() != 0) return;
    const auto& entries = trainer.store().param_entries();
    for (size_t i = 0; i < entries.size(); ++i) {
      weights[entries[i].full_name()] = trainer.store().param(i).to_vector<float>();
    }
  };
  const int n = pipeline.stages * pipeline.groups;
  if (n == 1) {
    body(nullptr);
  } else {
    LocalWorld world(n);
    run_local_ranks(world, [&](LocalCommunicator& comm) { body(&comm); });
  }
  return weights;
}

::testing::AssertionResult same_weights(const std::map<std::string, std::vector<float>>& a,
                                        const std::map<std::string, std::vector<float>>& b,
                                        double tolerance) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "different parameter sets";
  double worst = 0;
  std::string where;
  for (const auto& [name, va] : a) {
    const auto it = b.find(name);
    if (it == b.end()) return ::testing::AssertionFailure() << name << " missing";
    for (size_t i = 0; i < va.size(); ++i) {
      const double d = std::fabs(va[i] - it->second[i]);
      if (!(d <= worst)) worst = d, where = name + "[" + std::to_string(i) + "]";
    }
  }
  if (worst <= tolerance) return ::testing::AssertionSuccess() << "max |diff| " << worst;
  return ::testing::AssertionFailure() << "max |diff| " << worst << " at " << where;
}

PipelineConfig layout(int stages, int groups, int64_t micro_batches, ScheduleKind kind) {
  PipelineConfig p;
  p.stages = stages;
  p.groups = groups;
  p.micro_batches = micro_batches;
  p.schedule = kind;
  p.partition = even_partition(8, stages);
  return p;
}

TEST(Pipeline, SynchronousLayoutsMatchTheSingleProcess) {
  PipelineConfig single;
  single.micro_batches = 1;
  const auto reference = train(single, 6);
  // fp32 rounding: micro-batching and groups change the order gradients are summed in.
  const double tol = 1e-6;
  EXPECT_TRUE(same_weights(train(layout(1, 1, 4, ScheduleKind::kGPipe), 6), reference, tol));
  EXPECT_TRUE(same_weights(train(layout(2, 1, 4, ScheduleKind::kGPipe), 6), reference, tol));
  EXPECT_TRUE(same_weights(train(layout(4, 1, 4, ScheduleKind::k1F1B), 6), reference, tol));
  EXPECT_TRUE(same_weights(train(layout(2, 2, 2, ScheduleKind::k1F1B), 6), reference, tol));
  EXPECT_TRUE(same_weights(train(layout(1, 4, 1, ScheduleKind::k1F1B), 6), reference, tol));
}

TEST(Pipeline, GPipeAnd1F1BAgree) {
  EXPECT_TRUE(same_weights(train(layout(4, 1, 8, ScheduleKind::kGPipe), 4),
                           train(layout(4, 1, 8, ScheduleKind::k1F1B), 4), 1e-6));
}

TEST(Pipeline, RepeatableBitForBit) {
  EXPECT_TRUE(same_weights(train(layout(2, 2, 2, ScheduleKind::k1F1B), 3),
                           train(layout(2, 2, 2, ScheduleKind::k1F1B), 3), 0.0));
}

TEST(Pipeline, ReportsBubbleAndWritesTrace) {
  const std::string path = ::testing::TempDir() + "/pipeline_trace.json";
  PipelineConfig p = layout(4, 1, 4, ScheduleKind::k1F1B);
  p.trace_path = path;
  TrainSummary summary;
  train(p, 2, &summary);
  ASSERT_EQ(summary.stages.size(), 4u);
  EXPECT_DOUBLE_EQ(summary.theoretical_bubble, 3.0 / 7.0);
  EXPECT_GT(summary.measured_bubble, 0.0);
  EXPECT_LT(summary.measured_bubble, 1.0);
  std::ifstream in(path);
  const auto trace = nlohmann::json::parse(in);
  std::map<int, int> forwards;  // per rank
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "X" && e["name"].get<std::string>().rfind("Forward", 0) == 0) {
      ++forwards[e["pid"].get<int>()];
      EXPECT_TRUE(e["args"].contains("micro_batch"));
    }
  }
  for (int r = 0; r < 4; ++r) EXPECT_EQ(forwards[r], 2 * 4) << "rank " << r;
}

// A linear layer whose backward checks that it runs on the weights its forward saw (weight
// stashing), and counts the backwards that saw a version older than the latest.
class CheckedLinear final : public graph::Layer {
 public:
  CheckedLinear(std::string name, int64_t in, int64_t out, int* stale)
      : Layer(name), linear_(name, in, out, true), stale_(stale) {}
  const char* type() const override { return "checked_linear"; }
  std::vector<graph::ParamSpec> param_specs() const override { return linear_.param_specs(); }
  Shape output_shape(const Shape& in) const override { return linear_.output_shape(in); }
  TensorList forward(ExecContext& ctx, const TensorList& in, LayerTape& tape) override {
    tape.save(in[0]);
    tape.save(param(0).clone());  // the weights forward used
    latest_ = std::max(latest_, tape.weight_version);
    return {ops::linear_forward(ctx, in[0], param(0), param(1))};
  }
  TensorList backward(ExecContext& ctx, const TensorList& g, LayerTape& tape) override {
    EXPECT_EQ(param(0).to_vector<float>(), tape.at(1).to_vector<float>())
        << name() << ": backward ran on other weights than its forward";
    if (tape.weight_version < latest_) ++*stale_;
    return {ops::linear_backward(ctx, g[0], tape.at(0), param(0), grad(0), grad(1), true)};
  }

 private:
  graph::LinearLayer linear_;
  int* stale_;
  uint64_t latest_ = 0;
};

// Micro-batches of a fixed synthetic set (rows 4 each), normalized per micro-batch.
class FixedSource final : public MicroBatchSource {
 public:
  Info info(int64_t mb) override { return {mb, 0, 4, 4.0}; }
  TensorList input(int64_t mb) override {
    return {testing::random_tensor({4, 6}, 100 + static_cast<uint64_t>(mb), -1, 1, DType::kF32)};
  }
  Tensor target(int64_t mb) override {
    return testing::random_ids({4}, 3, 200 + static_cast<uint64_t>(mb));
  }
};

TEST(Pipeline, AsyncScheduleStashesWeights) {
  const int S = 3;
  const int64_t N = 12;
  const Schedule schedule = make_schedule(ScheduleKind::kAsync1F1B, S, N);
  ASSERT_TRUE(check_schedule(schedule).ok) << check_schedule(schedule).error;
  LocalWorld world(S);
  std::vector<int> stale(S, 0);
  run_local_ranks(world, [&](LocalCommunicator& comm) {
    const int s = comm.rank();
    graph::Model model("checked", Shape{6});
    model.add(std::make_unique<CheckedLinear>("fc0", 6, 6, &stale[s]));
    model.add(std::make_unique<CheckedLinear>("fc1", 6, 6, &stale[s]));
    model.add(std::make_unique<CheckedLinear>("fc2", 6, 3, &stale[s]));
    ExecContext ctx(Device::cpu(), nullptr, 1);
    graph::ParamStore store(model, s, s + 1, ctx.allocator());
    store.initialize(3);
    ExecutorConfig config;
    config.kind = ScheduleKind::kAsync1F1B;
    config.optimizer.kind = graph::OptimizerKind::kSgd;
    config.optimizer.momentum = 0.0;
    config.optimizer.schedule.base_lr = 0.1;
    StageComms comms;
    comms.pipe = &comm;
    Executor executor(ctx, model, store, {s, S, static_cast<size_t>(s), static_cast<size_t>(s + 1)},
                      comms, config);
    FixedSource source;
    executor.run(schedule.programs[s], source);
    executor.finish();
    EXPECT_EQ(executor.optimizer_steps(), N);
  });
  // Stages before the last run backwards on stashed (older) weights; the last never needs to.
  EXPECT_GT(stale[0], 0);
  EXPECT_EQ(stale[S - 1], 0);
}

TEST(Pipeline, AFailingRankStopsEveryRankQuickly) {
  auto data = std::make_shared<LinearClasses>(512, 12, 5);
  const PipelineConfig p = layout(4, 1, 4, ScheduleKind::k1F1B);
  LocalWorld world(4);
  const auto start = std::chrono::steady_clock::now();
  try {
    run_local_ranks(world, [&](LocalCommunicator& comm) {
      comm.set_timeout(std::chrono::seconds(60));
      ExecContext ctx(Device::cpu(), nullptr, 1);
      Trainer trainer(ctx, mlp_spec(), data, nullptr, train_config(3), p, &comm, nullptr);
      if (comm.rank() == 2) STRATA_THROW() << "stage 2 lost its device";
      trainer.run();
    });
    FAIL() << "expected the failure to propagate";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("stage 2 lost its device"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST(Pipeline, StuckPeerTimesOutNamingTheInstruction) {
  auto data = std::make_shared<LinearClasses>(512, 12, 5);
  const PipelineConfig p = layout(2, 1, 2, ScheduleKind::k1F1B);
  LocalWorld world(2);
  try {
    run_local_ranks(world, [&](LocalCommunicator& comm) {
      comm.set_timeout(std::chrono::milliseconds(500));
      ExecContext ctx(Device::cpu(), nullptr, 1);
      Trainer trainer(ctx, mlp_spec(), data, nullptr, train_config(3), p, &comm, nullptr);
      if (comm.rank() == 1) {
        std::this_thread::sleep_for(std::chrono::seconds(3));  // never joins the pipeline
        return;
      }
      trainer.run();
    });
    FAIL() << "expected a timeout";
  } catch (const CommTimeout& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("rank 0"), std::string::npos) << m;
    EXPECT_NE(m.find("RecvGrad"), std::string::npos) << m;
    EXPECT_NE(m.find("stage 0"), std::string::npos) << m;
  }
}

TEST(Pipeline, BadLayoutsAreErrorsBeforeAnyWork) {
  auto data = std::make_shared<LinearClasses>(512, 12, 5);
  ExecContext ctx;
  PipelineConfig p = layout(2, 1, 3, ScheduleKind::k1F1B);  // 3 does not divide 32
  LocalWorld world(2);
  auto comms = world.communicators();
  EXPECT_THROW(Trainer(ctx, mlp_spec(), data, nullptr, train_config(1), p, comms[0].get(), nullptr),
               Error);
  p = layout(2, 1, 2, ScheduleKind::k1F1B);
  p.partition = {{0, 3}, {2, 8}};  // overlap
  EXPECT_THROW(Trainer(ctx, mlp_spec(), data, nullptr, train_config(1), p, comms[0].get(), nullptr),
               Error);
  p.partition = {{0, 8}, {8, 8}};  // empty stage
  EXPECT_THROW(Trainer(ctx, mlp_spec(), data, nullptr, train_config(1), p, comms[0].get(), nullptr),
               Error);
  p = layout(3, 1, 2, ScheduleKind::k1F1B);  // world of 2 is not 1 x 3
  EXPECT_THROW(Trainer(ctx, mlp_spec(), data, nullptr, train_config(1), p, comms[0].get(), nullptr),
               Error);
}

}  // namespace
}  // namespace strata::parallel

namespace strata::parallel {
namespace {

// Token sequences with structure (a cycle entered at a random phase), for GPT-2 and BERT.
class CycleTokens final : public io::Dataset {
 public:
  CycleTokens(int64_t n, int64_t seq_len, bool mlm) : n_(n), t_(seq_len), mlm_(mlm) {}
  std::string name() const override { return "cycle-tokens"; }
  int64_t size() const override { return n_; }
  io::SampleSpec input_spec() const override {
    return mlm_ ? io::SampleSpec{{3, t_}, DType::kI32} : io::SampleSpec{{t_}, DType::kI32};
  }
  io::SampleSpec target_spec() const override { return {{t_}, DType::kI64}; }
  int64_t num_classes() const override { return 32; }
  void get(int64_t i, void* input, void* target) const override {
    int32_t* in = static_cast<int32_t*>(input);
    int64_t* out = static_cast<int64_t*>(target);
    for (int64_t t = 0; t < t_; ++t) {
      const int32_t token = static_cast<int32_t>((i * 7 + t) % 12);
      if (!mlm_) {
        in[t] = token;
        out[t] = (i * 7 + t + 1) % 12;
        continue;
      }
      const bool masked = (i + t) % 4 == 0;
      const bool padding = t >= t_ - 2;  // the last two positions are padding
      in[t] = masked ? 31 : token;       // 31: the mask token
      in[t_ + t] = 0;
      in[2 * t_ + t] = padding ? 0 : 1;
      out[t] = masked && !padding ? token : -100;
    }
  }

 private:
  int64_t n_, t_;
  bool mlm_;
};

std::map<std::string, std::vector<float>> train_tokens(const proto::ModelSpec& spec, bool mlm,
                                                       int stages, int64_t micro_batches) {
  auto data = std::make_shared<CycleTokens>(256, 16, mlm);
  TrainConfig config = train_config(3);
  config.batch_size = 8;
  PipelineConfig pipeline;
  pipeline.stages = stages;
  pipeline.micro_batches = micro_batches;
  pipeline.schedule = ScheduleKind::k1F1B;
  const size_t layers = static_cast<size_t>(spec.layer_size());
  pipeline.partition = stages == 1 ? std::vector<std::pair<size_t, size_t>>{{0, layers}}
                                   : std::vector<std::pair<size_t, size_t>>{{0, 2}, {2, layers}};
  std::map<std::string, std::vector<float>> weights;
  std::mutex mutex;
  auto body = [&](Communicator* world) {
    ExecContext ctx(Device::cpu(), nullptr, 1);
    Trainer trainer(ctx, spec, data, nullptr, config, pipeline, world, nullptr);
    trainer.run();
    std::lock_guard<std::mutex> lock(mutex);
    const auto& entries = trainer.store().param_entries();
    for (size_t i = 0; i < entries.size(); ++i) {
      if (entries[i].alias) continue;
      // A tied copy must stay equal to its owner: record it under its own name too.
      weights[entries[i].full_name()] = trainer.store().param(i).to_vector<float>();
    }
  };
  if (stages == 1) {
    body(nullptr);
  } else {
    LocalWorld world(stages);
    run_local_ranks(world, [&](LocalCommunicator& comm) { body(&comm); });
  }
  return weights;
}

TEST(Pipeline, TiedEmbeddingsAcrossStagesMatchTheSingleProcess) {
  // GPT-2 tiny with dropout: the embedding on stage 0, the tied head on stage 1.
  models::ModelRequest r;
  r.name = "gpt2";
  r.size = "tiny";
  r.input_shape = {16};
  r.num_classes = 32;
  r.dims.seq_len = 16;
  const proto::ModelSpec gpt2 = models::model_spec(r);
  const auto single = train_tokens(gpt2, false, 1, 1);
  auto piped = train_tokens(gpt2, false, 2, 2);
  // The head's copy of the token embedding stayed equal to the owner.
  ASSERT_TRUE(piped.count("head.weight"));
  EXPECT_EQ(piped["head.weight"], piped["embed.wte.weight"]);
  piped.erase("head.weight");
  EXPECT_TRUE(same_weights(piped, single, 1e-6));
}

TEST(Pipeline, IntegerTensorsCrossStagesWithoutGradients) {
  // BERT tiny: the attention mask travels from stage to stage beside the hidden states.
  models::ModelRequest r;
  r.name = "bert";
  r.size = "tiny";
  r.input_shape = {3, 16};
  r.num_classes = 32;
  r.dims.seq_len = 16;
  const proto::ModelSpec bert = models::model_spec(r);
  const auto single = train_tokens(bert, true, 1, 1);
  auto piped = train_tokens(bert, true, 2, 2);
  ASSERT_TRUE(piped.count("mlm_head.decoder.weight"));
  EXPECT_EQ(piped["mlm_head.decoder.weight"], piped["embeddings.word_embeddings.weight"]);
  piped.erase("mlm_head.decoder.weight");
  EXPECT_TRUE(same_weights(piped, single, 1e-6));
}

}  // namespace
}  // namespace strata::parallel
