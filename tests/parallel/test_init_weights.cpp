// TrainConfig::init_weights: the Trainer starts from a safetensors file instead of the seed, and
// in a pipeline each stage takes its own layers from it (the head's tied copy of GPT-2's token
// embedding from the embedding's tensor on another stage).
#include <gtest/gtest.h>

#include <map>
#include <mutex>

#include "engine/allocator.h"
#include "graph/model_spec.h"
#include "models/registry.h"
#include "models/weight_files.h"
#include "parallel/comm/local_comm.h"
#include "parallel/trainer.h"
#include "testing/testing.h"

namespace strata::parallel {
namespace {

// Next-token prediction on a cycle of 12 tokens (the values do not matter here).
class CycleTokens final : public io::Dataset {
 public:
  std::string name() const override { return "cycle-tokens"; }
  int64_t size() const override { return 64; }
  io::SampleSpec input_spec() const override { return {{16}, DType::kI32}; }
  io::SampleSpec target_spec() const override { return {{16}, DType::kI64}; }
  int64_t num_classes() const override { return 32; }
  void get(int64_t i, void* input, void* target) const override {
    for (int64_t t = 0; t < 16; ++t) {
      static_cast<int32_t*>(input)[t] = static_cast<int32_t>((i + t) % 12);
      static_cast<int64_t*>(target)[t] = (i + t + 1) % 12;
    }
  }
};

proto::ModelSpec gpt2(int64_t vocab) {
  models::ModelRequest r;
  r.name = "gpt2";
  r.size = "tiny";
  r.input_shape = {16};
  r.num_classes = vocab;
  r.dims.seq_len = 16;
  return models::model_spec(r);
}

using Weights = std::map<std::string, std::vector<float>>;

// Random weights for `spec`, saved under Hugging Face's names; returns them by Strata name.
Weights write_random_weights(const proto::ModelSpec& spec, const std::string& path) {
  auto model = graph::build_model(spec);
  graph::ParamStore store(*model, 0, model->size(), default_cpu_allocator());
  for (size_t i = 0; i < store.param_entries().size(); ++i) {
    const graph::ParamStore::Entry& e = store.param_entries()[i];
    if (e.alias) continue;
    store.param(i).copy_from(testing::random_tensor(store.param(i).shape(), 50 + i));
    // A padded vocabulary's padding rows are in no file: zero, as a load leaves them.
    if (e.valid_numel() < e.numel) {
      store.param(i).narrow(0, e.valid_rows, e.shape[0] - e.valid_rows).zero_();
    }
  }
  models::save_weights(path, *model, store, models::WeightNaming::kHuggingFace);
  Weights w;
  for (size_t i = 0; i < store.param_entries().size(); ++i) {
    w[store.param_entries()[i].full_name()] = store.param(i).to_vector<float>();
  }
  return w;
}

// Every stage's parameters right after the Trainer was built, by Strata name.
Weights initial_weights(const proto::ModelSpec& spec, const std::string& path, int stages) {
  auto data = std::make_shared<CycleTokens>();
  TrainConfig config;
  config.batch_size = 8;
  config.num_workers = 0;
  config.seed = 3;
  config.init_weights = path;
  PipelineConfig pipeline;
  pipeline.stages = stages;
  if (stages == 2) pipeline.partition = {{0, 2}, {2, static_cast<size_t>(spec.layer_size())}};
  Weights weights;
  std::mutex mutex;
  auto body = [&](Communicator* world) {
    ExecContext ctx(Device::cpu(), nullptr, 1);
    Trainer trainer(ctx, spec, data, nullptr, config, pipeline, world, nullptr);
    std::lock_guard<std::mutex> lock(mutex);
    const auto& entries = trainer.store().param_entries();
    for (size_t i = 0; i < entries.size(); ++i) {
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

TEST(InitWeights, EveryStageStartsFromTheFile) {
  const proto::ModelSpec spec = gpt2(32);
  const std::string path = ::testing::TempDir() + "/strata_init_weights.safetensors";
  const Weights expected = write_random_weights(spec, path);
  for (int stages : {1, 2}) {
    const Weights got = initial_weights(spec, path, stages);
    EXPECT_EQ(got.size(), expected.size()) << stages << " stages";
    for (const auto& [name, values] : expected) {
      ASSERT_TRUE(got.count(name)) << name;
      EXPECT_EQ(got.at(name), values) << name << " with " << stages << " stages";
    }
  }
  EXPECT_EQ(expected.at("head.weight"), expected.at("embed.wte.weight"));
}

TEST(InitWeights, AFileOfAnotherModelFailsNamingTheTensor) {
  const std::string path = ::testing::TempDir() + "/strata_init_weights_other.safetensors";
  write_random_weights(gpt2(32), path);
  try {
    initial_weights(gpt2(40), path, 1);
    FAIL() << "loaded a file of another vocabulary";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(path), std::string::npos) << m;
    EXPECT_NE(m.find("tensor 'transformer.wte.weight' has shape (32, 64)"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace strata::parallel
