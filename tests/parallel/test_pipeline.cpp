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
#include <set>
#include <string>
#include <thread>

#include "graph/layers.h"
#include "graph/model_spec.h"
#include "io/data_loader.h"
#include "io/dataset.h"
#include "models/registry.h"
#include "ops/cross_entropy.h"
#include "ops/lr_schedule.h"
#include "ops/matmul.h"
#include "ops/optimizer.h"
#include "parallel/comm/local_comm.h"
#include "parallel/runtime/executor.h"
#include "parallel/trainer.h"
#include "pipeline_testing.h"
#include "testing/testing.h"
#include "tools/bench/timed_linear.h"

namespace strata::parallel {
namespace {

using testing::even_partition;
using testing::layout;
using testing::LinearClasses;
using testing::mlp_spec;
using testing::same_weights;
using testing::train_config;

// A backend that calls itself stream-ordered (as nccl does) over the local one, so that on the
// CPU the trainer splits the point-to-point links of a stream-ordered pipeline and the executor
// posts receives when it reaches them. Each communicator is named by its chain of splits
// ("world/1/0"); the names of those that carried point-to-point messages are recorded.
class StreamOrderedLocal final : public Communicator {
 public:
  StreamOrderedLocal(Communicator* inner, std::string name)
      : inner_(inner), name_(std::move(name)) {
    set_timeout(inner->timeout());
  }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend() const override { return "stream-ordered local"; }
  std::unique_ptr<Request> isend(const Tensor& t, int peer, int tag) override {
    record();
    return inner_->isend(t, peer, tag);
  }
  std::unique_ptr<Request> irecv(const Tensor& t, int peer, int tag) override {
    record();
    return inner_->irecv(t, peer, tag);
  }
  std::unique_ptr<Request> all_reduce(const Tensor& t, ReduceOp op) override {
    return inner_->all_reduce(t, op);
  }
  std::unique_ptr<Request> broadcast(const Tensor& t, int root) override {
    return inner_->broadcast(t, root);
  }
  std::unique_ptr<Request> all_gather(const Tensor& in, const Tensor& out) override {
    return inner_->all_gather(in, out);
  }
  std::unique_ptr<Request> reduce_scatter(const Tensor& in, const Tensor& out) override {
    return inner_->reduce_scatter(in, out);
  }
  void barrier(const std::string& what) override {
    inner_->set_timeout(timeout());
    inner_->barrier(what);
  }
  std::unique_ptr<Communicator> split(int color, int key) override {
    inner_->set_timeout(timeout());
    std::unique_ptr<Communicator> sub = inner_->split(color, key);
    if (sub == nullptr) return nullptr;
    auto result =
        std::make_unique<StreamOrderedLocal>(sub.get(), name_ + "/" + std::to_string(color));
    result->owned_ = std::move(sub);
    result->set_timeout(timeout());
    return result;
  }
  bool stream_ordered() const override { return true; }

  // The communicators that carried sends or receives, by name.
  static std::set<std::string> p2p_names() {
    std::lock_guard<std::mutex> lock(mutex_);
    return p2p_;
  }
  static void reset() {
    std::lock_guard<std::mutex> lock(mutex_);
    p2p_.clear();
  }

 private:
  void record() {
    std::lock_guard<std::mutex> lock(mutex_);
    p2p_.insert(name_);
  }
  std::unique_ptr<Communicator> owned_;
  Communicator* inner_;
  std::string name_;
  static inline std::mutex mutex_;
  static inline std::set<std::string> p2p_;
};

// Weights by "layer.param" after training in the given layout (collected from every stage), with
// the local backend, or (stream_ordered) the local backend through StreamOrderedLocal.
std::map<std::string, std::vector<float>> train(const PipelineConfig& pipeline, int64_t steps,
                                                TrainSummary* summary = nullptr,
                                                bool stream_ordered = false) {
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
    run_local_ranks(world, [&](LocalCommunicator& comm) {
      if (!stream_ordered) return body(&comm);
      StreamOrderedLocal ordered(&comm, "world");
      body(&ordered);
    });
  }
  return weights;
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

// A stream-ordered backend (nccl's way) gets a communicator per direction between neighbouring
// stages and its receives posted when reached: on the CPU the same messages in the same order,
// hence the same weights bit for bit, for every schedule, with groups too.
TEST(Pipeline, StreamOrderedBackendUsesLinksAndGivesTheSameWeights) {
  for (const PipelineConfig& p :
       {layout(2, 1, 4, ScheduleKind::k1F1B), layout(3, 1, 4, ScheduleKind::kGPipe),
        layout(4, 1, 8, ScheduleKind::k1F1B), layout(4, 1, 4, ScheduleKind::kAsync1F1B),
        layout(2, 2, 2, ScheduleKind::k1F1B)}) {
    SCOPED_TRACE("S=" + std::to_string(p.stages) + " G=" + std::to_string(p.groups) + " " +
                 schedule_name(p.schedule));
    const auto plain = train(p, 4);
    StreamOrderedLocal::reset();
    EXPECT_TRUE(same_weights(train(p, 4, nullptr, true), plain, 0.0));
    // Every send and receive went over a link: a split of a pipeline communicator
    // ("world/group/boundary"), never the pipeline communicator ("world/group") itself.
    const std::set<std::string> used = StreamOrderedLocal::p2p_names();
    EXPECT_FALSE(used.empty());
    for (const std::string& name : used) {
      EXPECT_EQ(std::count(name.begin(), name.end(), '/'), 2) << name;
    }
    // A link per boundary and group (both directions split with the boundary as color).
    EXPECT_EQ(used.size(), static_cast<size_t>((p.stages - 1) * p.groups));
  }
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
    return {strata::testing::random_tensor({4, 6}, 100 + static_cast<uint64_t>(mb), -1, 1,
                                           DType::kF32)};
  }
  Tensor target(int64_t mb) override {
    return strata::testing::random_ids({4}, 3, 200 + static_cast<uint64_t>(mb));
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

// async-1f1b updates after every micro-batch (M updates a step) while the learning-rate schedule
// is given in steps: the cosine must span the whole run, not its first 1/M (where it reached 0).
TEST(Pipeline, AsyncLearningRateScheduleSpansTheWholeRun) {
  struct LrRecorder final : TrainObserver {
    std::vector<double> lr;
    void on_log(const StepRecord& r) override { lr.push_back(r.lr); }
  };
  auto data = std::make_shared<LinearClasses>(512, 12, 5);
  TrainConfig config = train_config(4);
  config.log_every = 1;
  config.optimizer.schedule.kind = ops::LrScheduleKind::kCosine;
  config.optimizer.schedule.total_steps = 4;
  const PipelineConfig pipeline = layout(2, 1, 4, ScheduleKind::kAsync1F1B);
  LrRecorder recorder;
  LocalWorld world(2);
  run_local_ranks(world, [&](LocalCommunicator& comm) {
    ExecContext ctx(Device::cpu(), nullptr, 1);
    Trainer trainer(ctx, mlp_spec(), data, nullptr, config, pipeline, &comm,
                    comm.rank() == 0 ? &recorder : nullptr);
    trainer.run();
  });
  // The last update of step s (1-based) is update 4 s - 1 of 16.
  ops::LrSchedule expected = config.optimizer.schedule;
  expected.total_steps = 16;
  ASSERT_EQ(recorder.lr.size(), 4u);
  for (size_t s = 0; s < 3; ++s) {
    EXPECT_GT(recorder.lr[s], 0.0) << "step " << s + 1;
    EXPECT_NEAR(recorder.lr[s], expected.lr_at(4 * static_cast<int64_t>(s) + 3), 1e-12)
        << "step " << s + 1;
  }
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

// ---- Asynchronous 1F1B against a one-process replay of its weight-version rule ----------------

namespace strata::parallel {
namespace {

// The model of the replay test: per stage a linear layer and a ReLU (the last stage: a linear
// layer to 3 classes), cut at the ReLUs.
constexpr int kReplayStages = 4;

std::unique_ptr<graph::Model> replay_model() {
  auto model = std::make_unique<graph::Model>("replay", Shape{6});
  for (int s = 0; s < kReplayStages; ++s) {
    const std::string i = std::to_string(s);
    const bool last = s == kReplayStages - 1;
    model->add(std::make_unique<graph::LinearLayer>("fc" + i, s == 0 ? 6 : 8, last ? 3 : 8, true));
    if (!last) model->add(std::make_unique<graph::ReluLayer>("relu" + i));
  }
  return model;
}

std::pair<size_t, size_t> replay_range(int s) {
  return {static_cast<size_t>(2 * s),
          static_cast<size_t>(s == kReplayStages - 1 ? 2 * s + 1 : 2 * s + 2)};
}

constexpr uint64_t kReplaySeed = 3;
constexpr double kReplayLr = 0.1;

graph::OptimizerConfig plain_sgd() {
  graph::OptimizerConfig c;
  c.kind = graph::OptimizerKind::kSgd;
  c.momentum = 0.0;
  c.schedule.base_lr = kReplayLr;
  return c;
}

// versions[s][m]: the number of OptimizerStep instructions before Forward(m) in stage s's
// program, i.e. the weight version micro-batch m sees on stage s.
std::vector<std::vector<int64_t>> forward_versions(const Schedule& schedule) {
  std::vector<std::vector<int64_t>> versions;
  for (const Program& program : schedule.programs) {
    std::vector<int64_t> v(static_cast<size_t>(schedule.micro_batches), -1);
    int64_t updates = 0;
    for (const Instruction& in : program) {
      if (in.op == OpCode::kOptimizerStep) ++updates;
      if (in.op == OpCode::kForward) v[static_cast<size_t>(in.micro_batch)] = updates;
    }
    versions.push_back(v);
  }
  return versions;
}

// One process, no executor: per stage the weight versions W_s[0..N]. Micro-batch m runs forward
// through every stage s on W_s[versions[s][m]], its loss, backward on the same weights, and then
// W_s[m + 1] = SGD(W_s[m], its gradient). Returns every stage's W_s[N].
testing::Weights replay(const std::vector<std::vector<int64_t>>& versions, int64_t n,
                        MicroBatchSource& source) {
  ExecContext ctx(Device::cpu(), nullptr, 1);
  auto model = replay_model();
  std::vector<std::unique_ptr<graph::ParamStore>> stores;
  std::vector<std::vector<Tensor>> w(kReplayStages);  // w[s][version]
  for (int s = 0; s < kReplayStages; ++s) {
    const auto [b, e] = replay_range(s);
    stores.push_back(std::make_unique<graph::ParamStore>(*model, b, e, ctx.allocator()));
    stores[s]->initialize(kReplaySeed);
    w[s].push_back(stores[s]->params().clone());
  }
  ops::SgdOptions sgd;
  sgd.lr = kReplayLr;
  for (int64_t m = 0; m < n; ++m) {
    const MicroBatchSource::Info info = source.info(m);
    graph::ForwardOptions options;
    options.step = info.step;
    options.sample_offset = info.sample_offset;
    std::vector<Tape> tapes(kReplayStages);
    TensorList x = source.input(m);
    for (int s = 0; s < kReplayStages; ++s) {
      const int64_t v = versions[s][static_cast<size_t>(m)];
      stores[s]->params().copy_from(w[s][static_cast<size_t>(v)]);
      options.weight_version = static_cast<uint64_t>(v);
      const auto [b, e] = replay_range(s);
      x = model->forward(ctx, b, e, x, tapes[s], options);
    }
    ops::CrossEntropyOptions loss;
    loss.normalizer = info.loss_normalizer;
    const Tensor target = source.target(m);
    TensorList g{ops::cross_entropy_backward(ctx, x[0], target, loss, 1.0)};
    for (int s = kReplayStages - 1; s >= 0; --s) {
      const auto [b, e] = replay_range(s);
      stores[s]->zero_grads();
      g = model->backward(ctx, b, e, g, tapes[s]);  // on W_s[v_s(m)], still in the store
    }
    for (int s = 0; s < kReplayStages; ++s) {
      stores[s]->params().copy_from(w[s][static_cast<size_t>(m)]);
      for (size_t i = 0; i < stores[s]->param_entries().size(); ++i) {
        ops::sgd_step(ctx, stores[s]->param(i), stores[s]->grad(i), Tensor(), sgd, m + 1);
      }
      w[s].push_back(stores[s]->params().clone());
    }
  }
  testing::Weights out;
  for (int s = 0; s < kReplayStages; ++s) {
    stores[s]->params().copy_from(w[s].back());
    for (auto& [name, v] : testing::store_weights(*stores[s])) out[name] = v;
  }
  return out;
}

TEST(Pipeline, AsyncMatchesAOneProcessReplayOfItsWeightVersions) {
  const int S = kReplayStages;
  const int64_t N = 16;
  const Schedule schedule = make_schedule(ScheduleKind::kAsync1F1B, S, N);
  ASSERT_TRUE(check_schedule(schedule).ok) << check_schedule(schedule).error;
  const auto versions = forward_versions(schedule);

  // PipeDream's rule, derived from the program: stage s runs w = S - s warm-up forwards, then
  // B(j) OptimizerStep F(j + w) for every j, so Forward(m) follows the updates of micro-batches
  // 0 .. m - (S - s): v_s(m) = max(0, m - (S - s) + 1). Stage s misses the S - s - 1 newest
  // updates; the last stage is never stale.
  for (int s = 0; s < S; ++s) {
    for (int64_t m = 0; m < N; ++m) {
      EXPECT_EQ(versions[s][m], std::max<int64_t>(0, m - (S - s) + 1))
          << "stage " << s << ", micro-batch " << m;
    }
  }

  // The executor on S local ranks.
  testing::Weights piped;
  std::mutex mutex;
  LocalWorld world(S);
  run_local_ranks(world, [&](LocalCommunicator& comm) {
    const int s = comm.rank();
    auto model = replay_model();
    ExecContext ctx(Device::cpu(), nullptr, 1);
    const auto [b, e] = replay_range(s);
    graph::ParamStore store(*model, b, e, ctx.allocator());
    store.initialize(kReplaySeed);
    ExecutorConfig config;
    config.kind = ScheduleKind::kAsync1F1B;
    config.optimizer = plain_sgd();
    StageComms comms;
    comms.pipe = &comm;
    Executor executor(ctx, *model, store, {s, S, b, e}, comms, config);
    FixedSource source;
    executor.run(schedule.programs[s], source);
    executor.finish();
    EXPECT_EQ(executor.optimizer_steps(), N) << "stage " << s;
    std::lock_guard<std::mutex> lock(mutex);
    for (auto& [name, v] : testing::store_weights(store)) piped[name] = v;
  });

  FixedSource source;
  // Bit for bit: the replay runs the same ops on the same operands in the same order (one
  // thread each), only scheduled differently.
  EXPECT_TRUE(same_weights(piped, replay(versions, N, source), 0.0));
  // The comparison tells the versions apart: replaying with fresh weights (v_s(m) = m, no
  // staleness) ends elsewhere.
  std::vector<std::vector<int64_t>> fresh(S);
  for (int s = 0; s < S; ++s) {
    for (int64_t m = 0; m < N; ++m) fresh[s].push_back(m);
  }
  EXPECT_FALSE(same_weights(piped, replay(fresh, N, source), 1e-5));
}

// ---- Bubble and overlap with stages of a fixed duration ---------------------------------------

// Stages of a fixed duration: tools/bench/timed_linear.h (forward `forward`, backward twice).
using bench::TimedLinear;

constexpr auto kStageForward = std::chrono::milliseconds(10);

// S balanced stages of one TimedLinear each, trained for `steps` steps of M micro-batches of 4.
TrainSummary timed_run(int S, int64_t M, ScheduleKind kind, int64_t steps,
                       const std::string& trace_path = "") {
  auto data = std::make_shared<LinearClasses>(512, 12, 5);
  auto build = [S] {
    auto model = std::make_unique<graph::Model>("timed", Shape{12});
    for (int s = 0; s < S; ++s) {
      model->add(std::make_unique<TimedLinear>("fc" + std::to_string(s), 12, s == S - 1 ? 5 : 12,
                                               kStageForward));
    }
    return model;
  };
  TrainConfig config = train_config(steps);
  config.batch_size = 4 * M;
  PipelineConfig pipeline = layout(S, 1, M, kind);
  pipeline.partition = even_partition(static_cast<size_t>(S), S);
  pipeline.trace_path = trace_path;
  TrainSummary summary;
  LocalWorld world(S);
  run_local_ranks(world, [&](LocalCommunicator& comm) {
    ExecContext ctx(Device::cpu(), nullptr, 1);
    Trainer trainer(ctx, build, data, nullptr, config, pipeline, &comm, nullptr);
    const TrainSummary s = trainer.run();
    if (comm.rank() == 0) summary = s;
  });
  return summary;
}

TEST(Pipeline, MeasuredBubbleOfBalancedStagesMatchesTheory) {
  // Stage times are sleeps, so the bubble does not depend on the cores; 5 points of margin
  // cover the work around the sleeps (messages, loading, updates) and late wake-ups on a loaded
  // machine (a few ms now and then, hence stages of 10 ms rather than 5).
  for (const int S : {2, 4}) {
    for (const int64_t M : {4, 8}) {
      const TrainSummary summary = timed_run(S, M, ScheduleKind::kGPipe, 3);
      const double theory = static_cast<double>(S - 1) / static_cast<double>(M + S - 1);
      EXPECT_DOUBLE_EQ(summary.theoretical_bubble, theory);
      EXPECT_NEAR(summary.measured_bubble, theory, 0.05) << "gpipe, S " << S << ", M " << M;
    }
  }
}

// Per rank, the longest overlap of a transfer span with a Forward or Backward event, and the
// number of transfer spans.
struct RankOverlap {
  double longest_us = 0.0;
  int transfers = 0;
};

std::map<int, RankOverlap> transfer_overlaps(const nlohmann::json& trace) {
  struct Span {
    double begin, end;
  };
  std::map<int, std::vector<Span>> compute, transfers;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const std::string name = e["name"];
    const Span span{e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>()};
    const int pid = e["pid"];
    if (e["cat"] == "transfer") transfers[pid].push_back(span);
    if (name.rfind("Forward", 0) == 0 || name.rfind("Backward", 0) == 0) {
      compute[pid].push_back(span);
    }
  }
  std::map<int, RankOverlap> out;
  for (const auto& [pid, spans] : transfers) {
    RankOverlap& r = out[pid];
    r.transfers = static_cast<int>(spans.size());
    for (const Span& t : spans) {
      for (const Span& c : compute[pid]) {
        r.longest_us = std::max(r.longest_us, std::min(t.end, c.end) - std::max(t.begin, c.begin));
      }
    }
  }
  return out;
}

TEST(Pipeline, TraceShowsTransfersOverlappingCompute) {
  const std::string path = ::testing::TempDir() + "/pipeline_overlap_trace.json";
  const int S = 2;
  const int64_t M = 4, steps = 2;
  timed_run(S, M, ScheduleKind::kGPipe, steps, path);
  std::ifstream in(path);
  const auto overlaps = transfer_overlaps(nlohmann::json::parse(in));
  ASSERT_EQ(overlaps.size(), static_cast<size_t>(S)) << "ranks with transfers in the trace";
  const double forward_us = std::chrono::duration<double, std::micro>(kStageForward).count();
  for (const auto& [rank, o] : overlaps) {
    // Each rank sends M messages and receives M per step (activations or gradients).
    EXPECT_EQ(o.transfers, 2 * M * steps) << "rank " << rank;
    // A receive posted ahead is in flight while the rank computes the micro-batch before it.
    EXPECT_GT(o.longest_us, 0.5 * forward_us)
        << "rank " << rank << ": no transfer overlaps a Forward or Backward by half a forward";
  }
}

}  // namespace
}  // namespace strata::parallel
