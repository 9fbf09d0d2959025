// Shared by the grouped data-parallel tests (local threads and MPI): a learnable synthetic data
// set, small models, and a trainer run that returns every group's weights and buffers.
#pragma once

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "graph/model_spec.h"
#include "io/dataset.h"
#include "parallel/comm/local_comm.h"
#include "parallel/pipeline_testing.h"
#include "parallel/trainer.h"
#include "testing/testing.h"

namespace strata::parallel::grouped {

using testing::LinearClasses;  // parallel/pipeline_testing.h

// Eight layers (five linear with parameters) over `features` inputs and 5 classes; `width`
// hidden units.
inline proto::ModelSpec mlp_spec(int width = 16, int features = 12) {
  const std::string w = std::to_string(width);
  return graph::parse_model_spec(R"(
    name: "mlp"
    input { shape: [)" + std::to_string(features) +
                                     R"(] }
    layer { name: "fc1" type: "linear" linear { out_features: )" +
                                     w + R"( } }
    layer { name: "relu1" type: "relu" }
    layer { name: "fc2" type: "linear" linear { out_features: )" +
                                     w + R"( } }
    layer { name: "relu2" type: "relu" }
    layer { name: "fc3" type: "linear" linear { out_features: )" +
                                     w + R"( } }
    layer { name: "relu3" type: "relu" }
    layer { name: "fc4" type: "linear" linear { out_features: )" +
                                     w + R"( } }
    layer { name: "fc5" type: "linear" linear { out_features: 5 } }
  )",
                                 "mlp");
}

// Weights ("layer.param") and buffers ("layer.buffer:running_mean") of every group.
using Values = std::map<std::string, std::vector<float>>;
struct RunResult {
  std::map<int, Values> groups;
  Values weights() const { return groups.at(0); }
};

inline std::vector<std::pair<size_t, size_t>> even_partition(size_t layers, int stages) {
  std::vector<std::pair<size_t, size_t>> p;
  for (int s = 0; s < stages; ++s) p.push_back({layers * s / stages, layers * (s + 1) / stages});
  return p;
}

inline TrainConfig train_config(int64_t steps, int64_t batch = 32) {
  TrainConfig c;
  c.steps = steps;
  c.batch_size = batch;
  c.seed = 7;
  c.num_workers = 0;
  c.optimizer.kind = graph::OptimizerKind::kSgd;
  c.optimizer.momentum = 0.9;
  c.optimizer.schedule.base_lr = 0.05;
  return c;
}

inline PipelineConfig layout(int groups, int stages, int64_t micro_batches, size_t layers = 8,
                             ScheduleKind kind = ScheduleKind::k1F1B) {
  PipelineConfig p;
  p.stages = stages;
  p.groups = groups;
  p.micro_batches = micro_batches;
  p.schedule = kind;
  p.partition = even_partition(layers, stages);
  return p;
}

// Trains on one rank of `world` (null: the single process) and adds its stage's values to `run`.
inline void train_rank(const proto::ModelSpec& spec, std::shared_ptr<const io::Dataset> data,
                       const TrainConfig& config, const PipelineConfig& pipeline,
                       Communicator* world, RunResult* run, std::mutex* mutex) {
  ExecContext ctx(Device::cpu(), nullptr, 1);
  Trainer trainer(ctx, spec, std::move(data), nullptr, config, pipeline, world, nullptr);
  trainer.run();
  std::lock_guard<std::mutex> lock(*mutex);
  Values& v = run->groups[trainer.group()];
  const graph::ParamStore& store = trainer.store();
  for (size_t i = 0; i < store.param_entries().size(); ++i) {
    v[store.param_entries()[i].full_name()] = store.param(i).to_vector<float>();
  }
  for (size_t i = 0; i < store.buffer_entries().size(); ++i) {
    v[store.buffer_entries()[i].full_name() + ":buffer"] = store.buffer(i).to_vector<float>();
  }
}

// Every rank as a thread of this process.
inline RunResult train_local(const proto::ModelSpec& spec, const PipelineConfig& pipeline,
                             const TrainConfig& config, int64_t features = 12) {
  auto data = std::make_shared<LinearClasses>(512, features, 5);
  RunResult run;
  std::mutex mutex;
  const int n = pipeline.stages * pipeline.groups;
  if (n == 1) {
    train_rank(spec, data, config, pipeline, nullptr, &run, &mutex);
  } else {
    LocalWorld world(n);
    run_local_ranks(world, [&](LocalCommunicator& comm) {
      train_rank(spec, data, config, pipeline, &comm, &run, &mutex);
    });
  }
  return run;
}

// Max |a - b| over the entries of `a` (all of which `b` must have), within `tolerance`.
inline ::testing::AssertionResult same_values(const Values& a, const Values& b, double tolerance) {
  if (a.size() != b.size()) {
    return ::testing::AssertionFailure() << a.size() << " vs " << b.size() << " tensors";
  }
  double worst = 0;
  std::string where;
  for (const auto& [name, va] : a) {
    const auto it = b.find(name);
    if (it == b.end()) return ::testing::AssertionFailure() << name << " missing";
    if (it->second.size() != va.size()) return ::testing::AssertionFailure() << name << " size";
    for (size_t i = 0; i < va.size(); ++i) {
      const double d = std::fabs(static_cast<double>(va[i]) - it->second[i]);
      if (!(d <= worst)) worst = d, where = name + "[" + std::to_string(i) + "]";
    }
  }
  if (worst <= tolerance) return ::testing::AssertionSuccess() << "max |diff| " << worst;
  return ::testing::AssertionFailure() << "max |diff| " << worst << " at " << where;
}

// Only the entries whose name does not end in ":buffer".
inline Values params_only(const Values& v) {
  Values out;
  for (const auto& [name, x] : v) {
    if (name.size() < 7 || name.compare(name.size() - 7, 7, ":buffer") != 0) out[name] = x;
  }
  return out;
}

}  // namespace strata::parallel::grouped
