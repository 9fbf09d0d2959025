// Checkpoints through the Trainer: N steps straight and k steps, stop, resume, N - k more end
// bitwise equal (single process and pipelines of local ranks, with dropout, batch norm, AdamW and
// a cosine schedule with warm-up); a checkpoint of one layout loads into another; stop and save
// requests are agreed by every rank; non-finite steps are skipped or stop the run; checkpoints
// that do not fit are refused with nothing loaded; loss scaling; mixed precision (bf16/fp16 on f32
// master weights) near fp32, bit for bit across layouts and resumes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>

#include "engine/allocator.h"
#include "graph/checkpoint.h"
#include "graph/model_spec.h"
#include "io/data_loader.h"
#include "io/dataset.h"
#include "io/text_datasets.h"
#include "models/registry.h"
#include "parallel/comm/local_comm.h"
#include "parallel/trainer.h"
#include "pipeline_testing.h"
#include "testing/testing.h"

namespace strata::parallel {
namespace {

namespace fs = std::filesystem;

// The class is the argmax of a fixed linear map; samples in `poisoned` have NaN features;
// features are drawn from [-scale, scale].
class Classes final : public io::Dataset {
 public:
  explicit Classes(std::set<int64_t> poisoned = {}, float scale = 1.0f)
      : x_(strata::testing::random_tensor({kN, kF}, 21, -scale, scale, DType::kF32)),
        w_(strata::testing::random_tensor({kC, kF}, 22, -1, 1, DType::kF64)),
        poisoned_(std::move(poisoned)) {}
  static constexpr int64_t kN = 256, kF = 12, kC = 5;
  std::string name() const override { return "classes"; }
  int64_t size() const override { return kN; }
  io::SampleSpec input_spec() const override { return {{kF}, DType::kF32}; }
  io::SampleSpec target_spec() const override { return {{}, DType::kI64}; }
  int64_t num_classes() const override { return kC; }
  void get(int64_t i, void* input, void* target) const override {
    const float* x = x_.data<float>() + i * kF;
    float* in = static_cast<float*>(input);
    std::copy(x, x + kF, in);
    if (poisoned_.count(i)) in[3] = std::nanf("");
    const double* w = w_.data<double>();
    int64_t best = 0;
    double best_v = -1e300;
    for (int64_t c = 0; c < kC; ++c) {
      double v = 0;
      for (int64_t f = 0; f < kF; ++f) v += w[c * kF + f] * x[f];
      if (v > best_v) best_v = v, best = c;
    }
    *static_cast<int64_t*>(target) = best;
  }

 private:
  Tensor x_, w_;
  std::set<int64_t> poisoned_;
};

// Seven layers with dropout (random streams) and optionally batch norm (buffers).
proto::ModelSpec spec(bool batch_norm) {
  std::string text = R"(
    name: "resumable"
    input { shape: [12] }
    layer { name: "fc1" type: "linear" linear { out_features: 16 } }
  )";
  text += batch_norm ? R"(layer { name: "bn1" type: "batch_norm" })"
                     : R"(layer { name: "act0" type: "gelu" })";
  text += R"(
    layer { name: "relu1" type: "relu" }
    layer { name: "drop1" type: "dropout" dropout { p: 0.25 } }
    layer { name: "fc2" type: "linear" linear { out_features: 16 } }
    layer { name: "relu2" type: "relu" }
    layer { name: "fc3" type: "linear" linear { out_features: 5 } }
  )";
  return graph::parse_model_spec(text, "resumable");
}

constexpr int64_t kSteps = 12;  // 8 steps per epoch: runs cross an epoch boundary

TrainConfig config() {
  TrainConfig c;
  c.steps = kSteps;
  c.batch_size = 32;
  c.seed = 3;
  c.num_workers = 0;
  c.optimizer.kind = graph::OptimizerKind::kAdamW;
  c.optimizer.weight_decay = 0.01;
  c.optimizer.schedule.kind = ops::LrScheduleKind::kCosine;
  c.optimizer.schedule.base_lr = 0.02;
  c.optimizer.schedule.warmup_steps = 3;
  return c;
}

PipelineConfig layout(int stages, int groups, int64_t micro_batches) {
  PipelineConfig p;
  p.stages = stages;
  p.groups = groups;
  p.micro_batches = micro_batches;
  p.schedule = ScheduleKind::k1F1B;
  const std::vector<std::vector<std::pair<size_t, size_t>>> cuts = {
      {{0, 7}}, {{0, 3}, {3, 7}}, {{0, 2}, {2, 5}, {5, 7}}};
  p.partition = cuts[stages - 1];
  return p;
}

// Stops the run (through its RunControl) after step `at`: called on rank 0 before the step's
// control poll, so every rank stops there.
class StopAt final : public TrainObserver {
 public:
  StopAt(RunControl* control, int64_t at) : control_(control), at_(at) {}
  void on_step(const StepRecord& r) override {
    if (r.step == at_) control_->stop.fetch_add(1);
  }

 private:
  RunControl* control_;
  int64_t at_;
};

using Weights = std::map<std::string, std::vector<float>>;

struct Outcome {
  Weights weights;  // parameters and buffers by name (group 0)
  TrainSummary summary;
  int64_t start_step = 0;
};

// Runs (or, with run = false, only builds and loads) a Trainer on every rank of `pipeline`.
Outcome run(const TrainConfig& c, const PipelineConfig& pipeline, const proto::ModelSpec& model,
            std::shared_ptr<const io::Dataset> data, bool train = true,
            TrainObserver* observer = nullptr) {
  Outcome out;
  std::mutex mutex;
  auto body = [&](Communicator* world) {
    ExecContext ctx(Device::cpu(), nullptr, 1);
    Trainer trainer(ctx, model, data, nullptr, c, pipeline, world, observer);
    TrainSummary s;
    if (train) s = trainer.run();
    std::lock_guard<std::mutex> lock(mutex);
    const bool rank0 = world == nullptr || world->rank() == 0;
    if (rank0) out.summary = s, out.start_step = trainer.start_step();
    if (trainer.group() != 0) return;
    const graph::ParamStore& store = trainer.store();
    for (size_t i = 0; i < store.param_entries().size(); ++i) {
      if (store.param_entries()[i].tied_to.empty()) {
        out.weights[store.param_entries()[i].full_name()] = store.param(i).to_vector<float>();
      }
    }
    for (size_t i = 0; i < store.buffer_entries().size(); ++i) {
      out.weights[store.buffer_entries()[i].full_name()] = store.buffer(i).to_vector<float>();
    }
  };
  const int n = pipeline.stages * pipeline.groups;
  if (n == 1) {
    body(nullptr);
  } else {
    LocalWorld world(n);
    run_local_ranks(world, [&](LocalCommunicator& comm) { body(&comm); });
  }
  return out;
}

std::string fresh(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/strata_resume_" + name;
  fs::remove_all(dir);
  return dir;
}

// The (kind, layer.name, slot) -> crc32c of every tensor of a checkpoint.
std::map<std::string, uint32_t> checksums(const std::string& path) {
  std::map<std::string, uint32_t> out;
  const proto::CheckpointManifest manifest = graph::read_manifest(path);
  for (const auto& t : manifest.tensor()) {
    out[t.kind() + " " + t.layer() + "." + t.name() + " " + t.slot()] = t.crc32c();
  }
  return out;
}

double max_diff(const Weights& a, const Weights& b) {
  double worst = 0;
  for (const auto& [name, va] : a) {
    const auto& vb = b.at(name);
    for (size_t i = 0; i < va.size(); ++i)
      worst = std::max(worst, std::fabs(va[i] - double(vb[i])));
  }
  return worst;
}

// N straight vs k, stop, resume, N - k: bitwise equal weights, buffers and optimizer state.
void expect_exact_resume(const PipelineConfig& pipeline, bool batch_norm, int64_t k,
                         const std::string& name, const TrainConfig& base = config(),
                         std::shared_ptr<const io::Dataset> data = std::make_shared<Classes>()) {
  SCOPED_TRACE(name);
  const proto::ModelSpec model = spec(batch_norm);
  TrainConfig straight = base;
  straight.checkpoint.dir = fresh(name + "_straight");
  const Outcome reference = run(straight, pipeline, model, data);
  EXPECT_EQ(reference.summary.steps, kSteps);

  TrainConfig first = base;
  first.checkpoint.dir = fresh(name + "_resumed");
  RunControl control;
  first.control = &control;
  StopAt stop(&control, k);
  const Outcome interrupted = run(first, pipeline, model, data, true, &stop);
  EXPECT_TRUE(interrupted.summary.stopped);
  EXPECT_EQ(interrupted.summary.steps, k);
  ASSERT_TRUE(fs::exists(first.checkpoint.dir + "/" + graph::checkpoint_name(k)));
  EXPECT_NE(max_diff(interrupted.weights, reference.weights), 0.0);

  TrainConfig second = base;
  second.checkpoint.dir = first.checkpoint.dir;
  second.checkpoint.resume = "auto";
  const Outcome resumed = run(second, pipeline, model, data);
  EXPECT_EQ(resumed.start_step, k);
  EXPECT_EQ(resumed.summary.first_step, k);
  EXPECT_EQ(resumed.summary.steps, kSteps);
  EXPECT_EQ(resumed.weights, reference.weights)
      << "max |diff| " << max_diff(resumed.weights, reference.weights);
  // Optimizer state too: the final checkpoints hold the same bytes.
  const std::string last = "/" + graph::checkpoint_name(kSteps);
  EXPECT_EQ(checksums(second.checkpoint.dir + last), checksums(straight.checkpoint.dir + last));
}

TEST(Resume, SingleProcessIsBitwiseExact) {
  expect_exact_resume(layout(1, 1, 1), true, 5, "single");
  expect_exact_resume(layout(1, 1, 1), false, 8, "single_epoch_boundary");
}

TEST(Resume, PipelineOfLocalRanksIsBitwiseExact) {
  expect_exact_resume(layout(2, 1, 2), true, 5, "pipeline");
  expect_exact_resume(layout(2, 2, 2), true, 7, "pipeline_groups");
}

TEST(Resume, AnotherLayoutLoadsTheSameWeightsAndContinues) {
  auto data = std::make_shared<Classes>();
  const proto::ModelSpec model = spec(false);  // no batch norm: layouts agree to fp32 rounding
  // Written by G = 2 x S = 2, stopped after step 5.
  TrainConfig first = config();
  first.checkpoint.dir = fresh("layout");
  RunControl control;
  first.control = &control;
  StopAt stop(&control, 5);
  const Outcome written = run(first, layout(2, 2, 2), model, data, true, &stop);
  ASSERT_EQ(written.summary.steps, 5);

  TrainConfig load = config();
  load.checkpoint.resume = first.checkpoint.dir + "/" + graph::checkpoint_name(5);
  for (const auto& [s, g] : std::vector<std::pair<int, int>>{{1, 1}, {3, 1}, {1, 2}}) {
    SCOPED_TRACE("S=" + std::to_string(s) + " G=" + std::to_string(g));
    const Outcome loaded = run(load, layout(s, g, 2), model, data, /*train=*/false);
    EXPECT_EQ(loaded.start_step, 5);
    EXPECT_EQ(loaded.weights, written.weights);
  }
  // Training goes on from there in another layout and ends where the uninterrupted run does, up
  // to the rounding of summing gradients in another order.
  const Outcome reference = run(config(), layout(1, 1, 1), model, data);
  const Outcome continued = run(load, layout(3, 1, 2), model, data);
  EXPECT_EQ(continued.summary.steps, kSteps);
  EXPECT_LT(max_diff(continued.weights, reference.weights), 1e-5);
  EXPECT_GT(max_diff(continued.weights, written.weights), 1e-3);  // it trained
}

// --dp-delay D: a checkpoint mid-run holds the D gradients all-reduced but not applied yet, and
// the resumed run applies them when the uninterrupted one does (bitwise equal at the end).
TEST(Resume, DelayedGradientsAreCheckpointedAndApplied) {
  PipelineConfig two_by_two = layout(2, 2, 2);
  two_by_two.grad_sync.delay = 2;
  expect_exact_resume(two_by_two, true, 5, "delay2");
  PipelineConfig groups = layout(1, 2, 2);
  groups.grad_sync.delay = 3;
  expect_exact_resume(groups, false, 2, "delay3_early");  // stopped before D updates

  // The manifest says how many are pending; the tensors are per parameter, oldest first.
  auto data = std::make_shared<Classes>();
  TrainConfig c = config();
  c.checkpoint.dir = fresh("delay_manifest");
  RunControl control;
  c.control = &control;
  StopAt stop(&control, 5);
  run(c, two_by_two, spec(false), data, true, &stop);
  const std::string path = c.checkpoint.dir + "/" + graph::checkpoint_name(5);
  const proto::CheckpointManifest m = graph::read_manifest(path);
  EXPECT_EQ(m.run().dp_delay(), 2);
  EXPECT_EQ(m.run().dp_pending(), 2);
  std::set<std::string> slots;
  for (const auto& t : m.tensor()) {
    if (t.layer() == "fc1" && t.name() == "weight") slots.insert(t.slot());
  }
  EXPECT_EQ(slots, (std::set<std::string>{"", "exp_avg", "exp_avg_sq", "dp_delayed_grad_0",
                                          "dp_delayed_grad_1"}));
  // The end of training applies every gradient: nothing pending in the last checkpoint.
  TrainConfig end = config();
  end.checkpoint.dir = fresh("delay_end");
  run(end, two_by_two, spec(false), data);
  EXPECT_EQ(graph::read_manifest(end.checkpoint.dir + "/" + graph::checkpoint_name(kSteps))
                .run()
                .dp_pending(),
            0);

  // Another stage layout with the same delay continues (gradients keyed by parameter).
  PipelineConfig three = layout(3, 2, 2);
  three.grad_sync.delay = 2;
  TrainConfig load = config();
  load.checkpoint.resume = path;
  const Outcome straight = run(config(), two_by_two, spec(false), data);
  const Outcome continued = run(load, three, spec(false), data);
  EXPECT_EQ(continued.start_step, 5);
  EXPECT_LT(max_diff(continued.weights, straight.weights), 1e-5);

  // A tied parameter split between stages (GPT-2's embedding and head) has a delayed gradient
  // on each side, which one key per parameter cannot hold: refused before any step.
  {
    const int64_t seq_len = 8, vocab = 64;
    auto tokens = std::make_shared<io::LanguageModelDataset>(
        io::make_synthetic_token_source("synthetic/train", 64 * seq_len + 1, vocab, 7), seq_len,
        vocab);
    const proto::ModelSpec gpt2 = models::model_spec("gpt2", "tiny", {seq_len}, vocab);
    const size_t layers = static_cast<size_t>(gpt2.layer_size());
    PipelineConfig tied = layout(1, 2, 2);
    tied.stages = 2;
    tied.partition = {{0, layers / 2}, {layers / 2, layers}};
    tied.grad_sync.delay = 1;
    TrainConfig with_checkpoints = config();
    with_checkpoints.checkpoint.dir = fresh("delay_tied");
    try {
      run(with_checkpoints, tied, gpt2, tokens, false);
      ADD_FAILURE() << "--dp-delay with checkpoints and a tied parameter split between stages";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("tied parameter is split between stages 0 and 1"),
                std::string::npos)
          << e.what();
    }
    with_checkpoints.checkpoint.dir.clear();  // without checkpoints the delay is fine
    EXPECT_NO_THROW(run(with_checkpoints, tied, gpt2, tokens, false));
  }

  // Another delay, or one group (no delayed all-reduce), would drop or misplace them: refused.
  for (const auto& [delay, groups_n] : std::vector<std::pair<int, int>>{{1, 2}, {0, 2}, {2, 1}}) {
    PipelineConfig other = layout(2, groups_n, 2);
    other.grad_sync.delay = delay;
    try {
      run(load, other, spec(false), data, false);
      ADD_FAILURE() << "resumed delay 2 with delay " << delay << ", " << groups_n << " groups";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--dp-delay 2"), std::string::npos) << e.what();
    }
  }
}

TEST(Resume, AutoWithoutACheckpointStartsFresh) {
  auto data = std::make_shared<Classes>();
  TrainConfig c = config();
  c.steps = 4;
  c.checkpoint.dir = fresh("auto_fresh");
  c.checkpoint.resume = "auto";
  const Outcome o = run(c, layout(1, 1, 1), spec(true), data);
  EXPECT_EQ(o.start_step, 0);
  EXPECT_EQ(o.summary.steps, 4);
  EXPECT_TRUE(fs::exists(c.checkpoint.dir + "/step-000004/manifest.pb"));
  // Again: now there is one, at the end of the run, so there is nothing left to train.
  const Outcome again = run(c, layout(1, 1, 1), spec(true), data);
  EXPECT_EQ(again.start_step, 4);
  EXPECT_EQ(again.summary.steps, 4);
  EXPECT_EQ(again.weights, o.weights);
}

TEST(Resume, SaveRequestsWriteACheckpointAndTrainingGoesOn) {
  auto data = std::make_shared<Classes>();
  TrainConfig c = config();
  c.checkpoint.dir = fresh("save_request");
  c.checkpoint.keep_last = 0;
  RunControl control;
  c.control = &control;
  class SaveAt final : public TrainObserver {
   public:
    explicit SaveAt(RunControl* c) : c_(c) {}
    void on_step(const StepRecord& r) override {
      if (r.step == 4) c_->save.fetch_add(1);
    }
    RunControl* c_;
  } save(&control);
  const Outcome o = run(c, layout(2, 1, 2), spec(true), data, true, &save);
  EXPECT_FALSE(o.summary.stopped);
  EXPECT_EQ(o.summary.steps, kSteps);
  EXPECT_TRUE(fs::exists(c.checkpoint.dir + "/step-000004"));
  EXPECT_TRUE(fs::exists(c.checkpoint.dir + "/step-000012"));
  EXPECT_FALSE(fs::exists(c.checkpoint.dir + "/step-000005"));  // one request, one checkpoint
}

TEST(Resume, RefusesACheckpointOfAnotherModelOrOptimizer) {
  auto data = std::make_shared<Classes>();
  TrainConfig c = config();
  c.steps = 4;
  c.checkpoint.dir = fresh("refuse");
  run(c, layout(1, 1, 1), spec(true), data);
  TrainConfig load = config();
  load.checkpoint.resume = c.checkpoint.dir;
  // Another model (gelu instead of batch norm): layers the model lacks.
  try {
    run(load, layout(2, 1, 2), spec(false), data, false);
    ADD_FAILURE() << "loaded a checkpoint of another model";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bn1"), std::string::npos) << e.what();
  }
  load.optimizer.kind = graph::OptimizerKind::kSgd;
  try {
    run(load, layout(1, 1, 1), spec(true), data, false);
    ADD_FAILURE() << "loaded adamw state into sgd";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer adamw"), std::string::npos) << e.what();
  }
  TrainConfig bad = config();
  bad.checkpoint.resume = c.checkpoint.dir + "/nothing-here";
  EXPECT_THROW(run(bad, layout(1, 1, 1), spec(true), data, false), Error);
}

TEST(Resume, AsynchronousScheduleRefusesCheckpoints) {
  auto data = std::make_shared<Classes>();
  TrainConfig c = config();
  c.checkpoint.dir = fresh("async");
  PipelineConfig p = layout(2, 1, 2);
  p.schedule = ScheduleKind::kAsync1F1B;
  EXPECT_THROW(run(c, p, spec(false), data), Error);
}

// ---- non-finite steps ----------------------------------------------------------------------

// Steps (1-based) of the first kSteps whose batch holds a poisoned sample.
std::set<int64_t> poisoned_steps(const std::set<int64_t>& poisoned) {
  io::DataLoaderOptions o;
  o.batch_size = 32;
  o.shuffle = true;
  o.seed = config().seed;
  auto data = std::make_shared<Classes>();
  io::DataLoader loader(data, o);
  std::set<int64_t> steps;
  for (int64_t s = 0; s < kSteps; ++s) {
    const std::vector<int64_t> order = loader.epoch_order(s / loader.batches_per_epoch());
    const int64_t first = (s % loader.batches_per_epoch()) * 32;
    for (int64_t r = first; r < first + 32; ++r) {
      if (poisoned.count(order[r])) steps.insert(s + 1);
    }
  }
  return steps;
}

TEST(NanPolicy, SkipDropsTheUpdatesOfNonFiniteStepsOnEveryRank) {
  const std::set<int64_t> poisoned = {17, 200};
  const std::set<int64_t> bad = poisoned_steps(poisoned);
  ASSERT_GE(bad.size(), 2u);
  auto data = std::make_shared<Classes>(poisoned);
  TrainConfig c = config();
  c.nan_policy = NanPolicy::kSkip;
  for (const PipelineConfig& p : {layout(1, 1, 1), layout(2, 2, 2)}) {
    const Outcome o = run(c, p, spec(false), data);
    EXPECT_EQ(o.summary.skipped_steps, static_cast<int64_t>(bad.size()));
    EXPECT_EQ(o.summary.steps, kSteps);
    for (const auto& [name, v] : o.weights) {
      for (float x : v) ASSERT_TRUE(std::isfinite(x)) << name;
    }
  }
  // A skipped step changes nothing: stopping right after the first bad step gives the weights
  // of stopping right before it.
  const int64_t first_bad = *bad.begin();
  ASSERT_GT(first_bad, 1);
  RunControl control;
  c.control = &control;
  StopAt before(&control, first_bad - 1);
  const Outcome a = run(c, layout(1, 1, 1), spec(false), data, true, &before);
  RunControl control2;
  c.control = &control2;
  StopAt after(&control2, first_bad);
  const Outcome b = run(c, layout(1, 1, 1), spec(false), data, true, &after);
  EXPECT_EQ(b.summary.skipped_steps, 1);
  EXPECT_EQ(a.weights, b.weights);
}

TEST(NanPolicy, AbortNamesTheStepAndTheFirstLayer) {
  const std::set<int64_t> poisoned = {17};
  const int64_t step = *poisoned_steps(poisoned).begin();
  auto data = std::make_shared<Classes>(poisoned);
  for (const PipelineConfig& p : {layout(1, 1, 1), layout(2, 1, 2)}) {
    try {
      run(config(), p, spec(false), data);
      ADD_FAILURE() << "a NaN step did not stop the run";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("step " + std::to_string(step) + " "), std::string::npos) << m;
      EXPECT_NE(m.find("first in parameter fc1.weight"), std::string::npos) << m;
      EXPECT_NE(m.find("--nan-policy"), std::string::npos) << m;
    }
  }
}

// ---- loss scaling ------------------------------------------------------------------------

TEST(LossScale, ParsesOffDynamicAndPowersOfTwo) {
  EXPECT_EQ(parse_loss_scale("off").mode, LossScaleConfig::Mode::kOff);
  EXPECT_EQ(parse_loss_scale("dynamic").mode, LossScaleConfig::Mode::kDynamic);
  EXPECT_EQ(parse_loss_scale("1024").init, 1024.0);
  EXPECT_EQ(parse_loss_scale("2^10").init, 1024.0);
  EXPECT_EQ(parse_loss_scale("2^10").mode, LossScaleConfig::Mode::kStatic);
  for (const char* bad : {"1000", "0.5", "0", "-2", "abc", "2^200", "2^", ""}) {
    try {
      parse_loss_scale(bad);
      ADD_FAILURE() << "accepted --loss-scale '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--loss-scale"), std::string::npos) << e.what();
    }
  }
  LossScaleConfig c = parse_loss_scale("dynamic");
  c.window = 0;
  EXPECT_THROW(check_loss_scale(c), Error);
}

TEST(LossScale, DynamicHalvesOnOverflowAndDoublesAfterTheWindow) {
  LossScaleConfig c = parse_loss_scale("dynamic");
  c.init = 8;
  c.window = 2;
  LossScaler s(c);
  EXPECT_EQ(s.scale(), 8);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 4);
  EXPECT_FALSE(s.update(false));
  EXPECT_TRUE(s.update(false));  // two good steps in a row
  EXPECT_EQ(s.scale(), 8);
  EXPECT_FALSE(s.update(false));
  EXPECT_TRUE(s.update(true));  // an overflow resets the count
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 4);
  for (int i = 0; i < 2; ++i) s.update(true);
  EXPECT_EQ(s.scale(), 1);
  EXPECT_FALSE(s.absorbs_overflow());  // at 1 a non-finite gradient is a real one
  LossScaler fixed(parse_loss_scale("2^5"));
  EXPECT_FALSE(fixed.update(true));
  EXPECT_EQ(fixed.scale(), 32);
  EXPECT_FALSE(fixed.absorbs_overflow());
  EXPECT_EQ(LossScaler(LossScaleConfig{}).scale(), 1);
}

// Scaling the loss gradient by a power of two and the gradients back is exact in fp32: the same
// weights bit for bit, with batch norm, clipping, AdamW, pipelines and groups.
TEST(LossScale, Fp32WeightsAreBitForBitThoseWithoutScaling) {
  auto data = std::make_shared<Classes>();
  for (const PipelineConfig& p : {layout(1, 1, 1), layout(2, 2, 2), layout(3, 1, 2)}) {
    for (bool clip : {false, true}) {
      SCOPED_TRACE("stages " + std::to_string(p.stages) + " groups " + std::to_string(p.groups) +
                   (clip ? ", clipped" : ""));
      TrainConfig plain = config();
      if (clip) plain.optimizer.clip_grad_norm = 0.5;
      const Outcome reference = run(plain, p, spec(true), data);
      for (const char* mode : {"dynamic", "2^12"}) {
        TrainConfig scaled = plain;
        scaled.loss_scale = parse_loss_scale(mode);
        scaled.loss_scale.window = 3;  // the dynamic scale grows from 2^16 to 2^20
        const Outcome o = run(scaled, p, spec(true), data);
        EXPECT_EQ(o.weights, reference.weights) << mode;
        EXPECT_EQ(o.summary.overflow_steps, 0) << mode;
        EXPECT_EQ(o.summary.loss_scale, std::string(mode) == "dynamic" ? 0x1p20 : 0x1p12);
      }
    }
  }
}

// Features of magnitude 1000 and a first scale of 2^127: the scaled gradients overflow fp32.
// Every overflow is skipped on every rank, counted with the skipped steps, and halves the scale.
TEST(LossScale, OverflowsAreSkippedCountedAndHalveTheScale) {
  auto data = std::make_shared<Classes>(std::set<int64_t>{}, 1000.0f);
  TrainConfig c = config();
  c.steps = 30;
  c.loss_scale = parse_loss_scale("dynamic");
  c.loss_scale.init = 0x1p127;
  c.loss_scale.max_scale = 0x1p127;
  c.loss_scale.window = 1000;  // never grows here
  for (const PipelineConfig& p : {layout(1, 1, 1), layout(2, 2, 2)}) {
    SCOPED_TRACE("stages " + std::to_string(p.stages));
    const Outcome o = run(c, p, spec(false), data);
    EXPECT_GE(o.summary.overflow_steps, 3);
    EXPECT_LT(o.summary.overflow_steps, c.steps);
    EXPECT_EQ(o.summary.skipped_steps, o.summary.overflow_steps);
    EXPECT_EQ(o.summary.steps, c.steps);
    EXPECT_EQ(o.summary.loss_scale,
              std::ldexp(1.0, 127 - static_cast<int>(o.summary.overflow_steps)));
    for (const auto& [name, v] : o.weights) {
      for (float x : v) ASSERT_TRUE(std::isfinite(x)) << name;
    }
  }
  // Growing back (window 2) overflows again and again; a checkpoint holds the scale and the
  // count of good steps, so a resumed run skips exactly the steps the uninterrupted one does.
  c.steps = kSteps;
  c.loss_scale.init = 0x1p121;  // about where these gradients overflow
  c.loss_scale.window = 2;
  expect_exact_resume(layout(2, 2, 2), false, 5, "loss_scale", c, data);  // mid-window
}

TEST(LossScale, NonFiniteLossStillFollowsTheNanPolicy) {
  const std::set<int64_t> poisoned = {17};
  auto data = std::make_shared<Classes>(poisoned);
  TrainConfig c = config();
  c.loss_scale = parse_loss_scale("dynamic");
  try {
    run(c, layout(1, 1, 1), spec(false), data);
    ADD_FAILURE() << "a NaN loss did not stop the run";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--nan-policy"), std::string::npos) << e.what();
  }
  // Loss scaling needs every gradient unscaled by the scale it was computed with.
  PipelineConfig async = layout(2, 1, 2);
  async.schedule = ScheduleKind::kAsync1F1B;
  EXPECT_THROW(run(c, async, spec(false), std::make_shared<Classes>(), false), Error);
  PipelineConfig delayed = layout(1, 2, 2);
  delayed.grad_sync.delay = 1;
  EXPECT_THROW(run(c, delayed, spec(false), std::make_shared<Classes>(), false), Error);
}

// ---- out of memory ------------------------------------------------------------------------

// Runs `stages` stages whose rank `tight` may allocate only 1 KiB beyond its weights, and returns
// the error.
std::string out_of_memory(int stages, int tight) {
  auto data = std::make_shared<Classes>();
  TrainConfig c = config();
  c.batch_size = 64;  // micro-batches of 32 rows: a (32, 16) f32 activation is 2 KiB
  const PipelineConfig p = layout(stages, 1, 2);
  auto body = [&](Communicator* comm) {
    CpuAllocator allocator;
    ExecContext ctx(Device::cpu(), &allocator, 1);
    Trainer trainer(ctx, spec(false), data, nullptr, c, p, comm, nullptr);
    if (comm == nullptr || comm->rank() == tight) {
      allocator.set_limit(allocator.stats().current + 1024);
    }
    trainer.run();
  };
  try {
    if (stages == 1) {
      body(nullptr);
    } else {
      LocalWorld world(stages);
      run_local_ranks(world, [&](LocalCommunicator& comm) { body(&comm); });
    }
  } catch (const OutOfMemoryError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an out-of-memory error";
  return "";
}

void expect_parts(const std::string& m, const std::vector<std::string>& parts) {
  for (const std::string& part : parts) {
    EXPECT_NE(m.find(part), std::string::npos) << "'" << part << "' not in: " << m;
  }
}

TEST(OutOfMemory, NamesTheStageLayerMicroBatchAndBytes) {
  // fc1's output of the first micro-batch does not fit.
  expect_parts(out_of_memory(1, 0),
               {"Forward(mb 0) on stage 0 (step 1, 32 rows): forward of layer fc1 (linear, input "
                "(32, 12)): out of memory on cpu: cannot allocate 2.00 KiB",
                "limit"});
  // Stage 1: the buffer receiving the first micro-batch's activations does not fit.
  expect_parts(out_of_memory(2, 1),
               {"RecvAct(mb 0) on stage 1 from stage 0 (step 1, 32 rows), "
                "receive buffer: out of memory on cpu: cannot allocate 2.00 KiB"});
}

// ---- mixed precision (--precision bf16|fp16) ---------------------------------------------------

TrainConfig mixed(DType compute) {
  TrainConfig c = config();
  c.compute_dtype = compute;
  if (compute == DType::kF16) c.loss_scale = parse_loss_scale("dynamic");
  c.log_every = 1;
  return c;
}

// ||a - b|| / ||b|| over every tensor (Adam's normalized steps make single weights a poor
// measure: a gradient near zero moves its weight by about the learning rate either way).
double relative_distance(const Weights& a, const Weights& b) {
  double diff = 0.0, norm = 0.0;
  for (const auto& [name, vb] : b) {
    const auto& va = a.at(name);
    for (size_t i = 0; i < vb.size(); ++i) {
      diff += (double(va[i]) - vb[i]) * (double(va[i]) - vb[i]);
      norm += double(vb[i]) * vb[i];
    }
  }
  return std::sqrt(diff / norm);
}

// On the CPU 16 bits are emulated (f32 math on 16-bit values, rounded where the CUDA kernels
// round): the run takes the 16-bit path, with f32 master weights, and stays near the f32 run. With
// batch norm the losses only: the bias before it has no gradient but rounding noise, which AdamW
// turns into steps of the learning rate, so that bias (and the running mean) wander.
TEST(MixedPrecision, TrainsCloseToFp32OnF32MasterWeights) {
  auto data = std::make_shared<Classes>();
  for (const PipelineConfig& p : {layout(1, 1, 1), layout(2, 2, 2)}) {
    for (bool batch_norm : {false, true}) {
      testing::LossRecorder f32_losses;
      const Outcome f32 = run(mixed(DType::kF32), p, spec(batch_norm), data, true, &f32_losses);
      ASSERT_EQ(f32_losses.losses.size(), static_cast<size_t>(kSteps));
      for (DType d : {DType::kBF16, DType::kF16}) {
        SCOPED_TRACE(std::string(dtype_name(d)) + " stages " + std::to_string(p.stages) +
                     " groups " + std::to_string(p.groups) + (batch_norm ? " batch norm" : ""));
        testing::LossRecorder losses;
        const Outcome o = run(mixed(d), p, spec(batch_norm), data, true, &losses);
        ASSERT_EQ(losses.losses.size(), f32_losses.losses.size());
        double worst = 0.0;
        for (size_t i = 0; i < losses.losses.size(); ++i) {
          ASSERT_TRUE(std::isfinite(losses.losses[i])) << "step " << i + 1;
          worst = std::max(worst, std::fabs(losses.losses[i] - f32_losses.losses[i]) /
                                      std::fabs(f32_losses.losses[i]));
        }
        const double moved = relative_distance(o.weights, f32.weights);
        std::printf("%s S=%d G=%d%s: worst relative loss difference %.2e, weights %.2e apart\n",
                    dtype_name(d), p.stages, p.groups, batch_norm ? " (batch norm)" : "", worst,
                    moved);
        EXPECT_LT(worst, d == DType::kBF16 ? 1e-2 : 1e-3);
        EXPECT_GT(moved, 0.0);  // 16 bits really ran: the weights are not the f32 run's
        if (!batch_norm) EXPECT_LT(moved, d == DType::kBF16 ? 2e-2 : 1e-2);
        EXPECT_LT(losses.losses.back(), losses.losses.front());  // it trained
        EXPECT_EQ(o.summary.overflow_steps, 0);
      }
    }
  }
}

// The 16-bit path has the f32 path's structure: a pipeline runs the single process's micro-batches
// in the same order (activations cross stages in 16 bits, as they pass between layers in one
// process), and launching the groups' all-reduces early moves each layer's gradients into the f32
// masters as it finishes instead of after the whole backward: both bit for bit.
TEST(MixedPrecision, PipelinesAndEarlyAllReducesAreBitForBit) {
  auto data = std::make_shared<Classes>();
  for (DType d : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(d));
    const Outcome one = run(mixed(d), layout(1, 1, 2), spec(true), data);
    EXPECT_EQ(run(mixed(d), layout(2, 1, 2), spec(true), data).weights, one.weights);
    EXPECT_EQ(run(mixed(d), layout(3, 1, 2), spec(true), data).weights, one.weights);
    PipelineConfig late = layout(2, 2, 2);
    late.grad_sync.overlap = false;
    PipelineConfig early = layout(2, 2, 2);
    early.grad_sync.bucket_mb = 0.0005;  // several buckets, launched layer by layer
    EXPECT_EQ(run(mixed(d), early, spec(true), data).weights,
              run(mixed(d), late, spec(true), data).weights);
  }
}

// Checkpoints hold the f32 masters (and the loss scale): a resumed 16-bit run is bit for bit the
// uninterrupted one.
TEST(MixedPrecision, ResumeIsBitwiseExact) {
  expect_exact_resume(layout(2, 1, 2), true, 5, "bf16_pipeline", mixed(DType::kBF16));
  expect_exact_resume(layout(1, 1, 1), true, 7, "fp16", mixed(DType::kF16));
}

// async-1f1b: backward passes on stashed versions recompute on the 16-bit copy of that version.
// The bound is set against what a wrong weight version does in f32: the same updates with stage
// 0's forwards one version newer (one stage: every forward on the newest weights) move the
// weights several times further than 16 bits do.
TEST(MixedPrecision, AsynchronousScheduleStaysNearFp32) {
  auto data = std::make_shared<Classes>();
  PipelineConfig p = layout(2, 1, 4);
  p.schedule = ScheduleKind::kAsync1F1B;
  PipelineConfig newest = layout(1, 1, 4);
  newest.schedule = ScheduleKind::kAsync1F1B;
  TrainConfig f32 = config(), bf16 = config();
  bf16.compute_dtype = DType::kBF16;
  const Outcome reference = run(f32, p, spec(false), data);
  const Outcome o = run(bf16, p, spec(false), data);
  const double moved = relative_distance(o.weights, reference.weights);
  const double wrong =
      relative_distance(run(f32, newest, spec(false), data).weights, reference.weights);
  std::printf("async-1f1b bf16: weights %.2e apart from f32; f32 on the newest weights %.2e\n",
              moved, wrong);
  EXPECT_GT(moved, 0.0);
  // Measured 1.49e-2 (wrong version: 1.12e-1) since async-1f1b's learning rate runs over all its
  // updates; a stale 16-bit working copy gives 1.26e-1.
  EXPECT_LT(moved, 2e-2);
  EXPECT_LT(moved, wrong / 4);
}

}  // namespace
}  // namespace strata::parallel
