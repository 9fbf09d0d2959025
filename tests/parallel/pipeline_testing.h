// Fixtures shared by the pipeline tests (local threads in test_pipeline.cpp, MPI ranks in
// test_pipeline_mpi.cpp, the CUDA runs of test_cuda_training.cpp and test_cuda_pipeline_mpi.cpp):
// a learnable synthetic data set, an eight-layer MLP to cut into up to four stages, a tiny GPT-2
// on synthetic tokens, the training configuration they run, and weight comparison.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "graph/model_spec.h"
#include "graph/param_store.h"
#include "io/dataset.h"
#include "io/text_datasets.h"
#include "models/registry.h"
#include "parallel/trainer.h"
#include "testing/testing.h"

namespace strata::parallel::testing {

// A learnable synthetic classification set: the class is the argmax of a fixed linear map.
class LinearClasses final : public io::Dataset {
 public:
  LinearClasses(int64_t n, int64_t features, int64_t classes)
      : n_(n),
        features_(features),
        classes_(classes),
        x_(strata::testing::random_tensor({n, features}, 11, -1, 1, DType::kF32)),
        w_(strata::testing::random_tensor({classes, features}, 12, -1, 1, DType::kF64)) {}
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
inline proto::ModelSpec mlp_spec() {
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

inline std::vector<std::pair<size_t, size_t>> even_partition(size_t layers, int stages) {
  std::vector<std::pair<size_t, size_t>> p;
  for (int s = 0; s < stages; ++s) p.push_back({layers * s / stages, layers * (s + 1) / stages});
  return p;
}

inline TrainConfig train_config(int64_t steps) {
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

// The MLP cut evenly into S stages, G groups, M micro-batches.
inline PipelineConfig layout(int stages, int groups, int64_t micro_batches, ScheduleKind kind) {
  PipelineConfig p;
  p.stages = stages;
  p.groups = groups;
  p.micro_batches = micro_batches;
  p.schedule = kind;
  p.partition = even_partition(8, stages);
  return p;
}

using Weights = std::map<std::string, std::vector<float>>;  // by "layer.param"

// The parameters of a store (tied copies under their own names as well).
inline Weights store_weights(const graph::ParamStore& store) {
  Weights w;
  const auto& entries = store.param_entries();
  for (size_t i = 0; i < entries.size(); ++i)
    w[entries[i].full_name()] = store.param(i).to_vector<float>();
  return w;
}

// The same parameter set, every element within `tolerance` (0: bit for bit).
inline ::testing::AssertionResult same_weights(const Weights& a, const Weights& b,
                                               double tolerance) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "different parameter sets";
  double worst = 0;
  std::string where;
  for (const auto& [name, va] : a) {
    const auto it = b.find(name);
    if (it == b.end()) return ::testing::AssertionFailure() << name << " missing";
    if (it->second.size() != va.size()) return ::testing::AssertionFailure() << name << " sizes";
    for (size_t i = 0; i < va.size(); ++i) {
      const double d = std::fabs(va[i] - it->second[i]);
      if (!(d <= worst)) worst = d, where = name + "[" + std::to_string(i) + "]";
    }
  }
  if (worst <= tolerance) return ::testing::AssertionSuccess() << "max |diff| " << worst;
  return ::testing::AssertionFailure()
         << "max |diff| " << worst << " at " << where << " (tolerance " << tolerance << ")";
}

// The part of `all` that `part` names (a stage's share of the whole model's weights).
inline Weights restrict_to(const Weights& all, const Weights& part) {
  Weights out;
  for (const auto& [name, v] : part) {
    const auto it = all.find(name);
    if (it != all.end()) out[name] = it->second;
  }
  return out;
}

// A tiny GPT-2 on synthetic tokens (sequences of 32 over a vocabulary of 512).
struct TinyGpt2 {
  static constexpr int64_t kSeqLen = 32, kVocab = 512;
  std::shared_ptr<const io::Dataset> data = std::make_shared<io::LanguageModelDataset>(
      io::make_synthetic_token_source("synthetic/train", 64 * kSeqLen + 1, kVocab, 7), kSeqLen,
      kVocab);
  proto::ModelSpec spec = models::model_spec("gpt2", "tiny", {kSeqLen}, kVocab);
};

// Records the loss of every step (rank 0 only; log_every must be 1 so that each record is one
// step's loss).
class LossRecorder final : public TrainObserver {
 public:
  void on_step(const StepRecord& r) override { losses.push_back(r.loss); }
  void on_migration(const MigrationRecord&) override { ++migrations; }
  std::vector<double> losses;
  int migrations = 0;  // layer moves the run made
};

}  // namespace strata::parallel::testing
