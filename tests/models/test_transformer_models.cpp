// GPT-2 and BERT from the registry: parameter counts equal to Hugging Face's (GPT2LMHeadModel,
// BertForMaskedLM; tied weights counted once), layer names and ties, dimension overrides, and
// short training runs of the tiny sizes on synthetic token tasks with learnable structure.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include "engine/philox.h"
#include "graph/model_spec.h"
#include "graph/optimizer.h"
#include "graph/param_store.h"
#include "graph/train_step.h"
#include "models/registry.h"

namespace strata::models {
namespace {

ModelRequest request(const std::string& name, const std::string& size, Shape input = {},
                     int64_t vocab = 0) {
  ModelRequest r;
  r.name = name;
  r.size = size;
  r.input_shape = std::move(input);
  r.num_classes = vocab;
  return r;
}

// Parameters from the built model's specs (no storage): a tied parameter counts once.
int64_t spec_params(const graph::Model& model) {
  int64_t n = 0;
  for (size_t i = 0; i < model.size(); ++i) {
    for (const graph::ParamSpec& p : model.layer(i).param_specs()) {
      if (p.tied_to.empty()) n += graph::valid_numel(p);  // padding rows excluded
    }
  }
  return n;
}

int64_t count(const ModelRequest& r) { return spec_params(*graph::build_model(model_spec(r))); }

TEST(TransformerModels, Gpt2ParameterCountsMatchHuggingFace) {
  EXPECT_EQ(count(request("gpt2", "124M")), 124439808);
  EXPECT_EQ(count(request("gpt2", "355M")), 354823168);
  EXPECT_EQ(count(request("gpt2", "774M")), 774030080);
  EXPECT_EQ(count(request("gpt2", "1558M")), 1557611200);
  EXPECT_EQ(count(request("gpt2", "")), 124439808);  // the default size
}

TEST(TransformerModels, BertParameterCountsMatchHuggingFace) {
  EXPECT_EQ(count(request("bert", "base")), 109514298);
  EXPECT_EQ(count(request("bert", "large")), 335174458);
}

std::vector<std::string> layer_names(const graph::Model& m) {
  std::vector<std::string> names;
  for (size_t i = 0; i < m.size(); ++i) names.push_back(m.layer(i).name());
  return names;
}

TEST(TransformerModels, Gpt2LayersAndTiedHead) {
  auto model = graph::build_model(model_spec(request("gpt2", "tiny", {48}, 100)));
  EXPECT_EQ(layer_names(*model),
            (std::vector<std::string>{"embed", "blocks.0", "blocks.1", "head"}));
  EXPECT_EQ(model->input_specs(), (graph::TensorSpecs{{{48}, DType::kI32}}));
  // V = 100 is padded to 128 inside the engine (-inf logits past 100; graph/transformer.h).
  EXPECT_EQ(model->output_shape(), (Shape{48, 128}));
  EXPECT_EQ(model->loss_classes(), 100);
  EXPECT_EQ(model->layer(3).param_specs().back().tied_to, "embed.wte.weight");
  graph::ParamStore store(*model, 0, model->size(), default_cpu_allocator());
  EXPECT_EQ(store.num_params(), spec_params(*model));
  EXPECT_TRUE(store.param_entries().back().alias);
  // Without a dataset: T = positions (64), V = 256.
  auto bare = graph::build_model(model_spec(request("gpt2", "tiny")));
  EXPECT_EQ(bare->output_shape(), (Shape{64, 256}));
}

TEST(TransformerModels, BertLayersAndTiedHead) {
  auto model = graph::build_model(model_spec(request("bert", "tiny", {3, 20}, 50)));
  EXPECT_EQ(layer_names(*model),
            (std::vector<std::string>{"embeddings", "layers.0", "layers.1", "mlm_head"}));
  EXPECT_EQ(model->input_specs(), (graph::TensorSpecs{{{3, 20}, DType::kI32}}));
  EXPECT_EQ(model->specs_before(1),
            (graph::TensorSpecs{{{20, 64}, DType::kF32}, {{20}, DType::kI32}}));
  EXPECT_EQ(model->output_specs(), (graph::TensorSpecs{{{20, 128}, DType::kF32}}));  // V 50 padded
  EXPECT_EQ(model->loss_classes(), 50);
  graph::ParamStore store(*model, 0, model->size(), default_cpu_allocator());
  EXPECT_EQ(store.num_params(), spec_params(*model));
  const auto& entries = store.param_entries();
  EXPECT_EQ(entries[entries.size() - 2].full_name(), "mlm_head.decoder.weight");
  EXPECT_TRUE(entries[entries.size() - 2].alias);
}

TEST(TransformerModels, DimsOverrideTheNamedSize) {
  ModelRequest r = request("gpt2", "124M", {16}, 1000);
  r.dims = {3, 48, 6, 32, 1024};
  auto gpt = graph::build_model(model_spec(r));
  EXPECT_EQ(gpt->size(), 5u);
  EXPECT_EQ(gpt->output_shape(), (Shape{16, 1024}));
  // wte + wpe + 3 blocks + ln_f with C = 48, positions 32, V 1024.
  const int64_t c = 48, block = 4 * c + 3 * c * c + 3 * c + c * c + c + 8 * c * c + 5 * c;
  EXPECT_EQ(spec_params(*gpt), 1024 * c + 32 * c + 3 * block + 2 * c);
  ModelRequest b = request("bert", "base", {3, 24}, 0);
  b.dims = {1, 32, 4, 24, 0};
  auto bert = graph::build_model(model_spec(b));
  EXPECT_EQ(bert->output_shape(), (Shape{24, 30592}));  // 30522 padded to a multiple of 128
  auto expect_error = [](const ModelRequest& bad, const std::string& text) {
    try {
      model_spec(bad);
      ADD_FAILURE() << "no error; expected one mentioning '" << text << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  expect_error(request("gpt2", "tiny", {65}), "has 64 positions; --seq-len 65 is longer");
  expect_error(request("gpt2", "tiny", {3, 64}), "(T,)");
  expect_error(request("bert", "tiny", {64}), "(3, T)");
  ModelRequest odd = request("gpt2", "tiny");
  odd.dims.heads = 5;
  expect_error(odd, "not a multiple of heads");
  ModelRequest small_vocab = request("bert", "tiny", {3, 8}, 100);
  small_vocab.dims.vocab_size = 50;
  expect_error(small_vocab, "smaller than the dataset");
}

// ---- short training runs -----------------------------------------------------------------------

struct TrainResult {
  double first_loss = 0, last_loss = 0, tokens_per_s = 0, samples_per_s = 0;
  graph::BatchMetrics eval;
};

// `steps` AdamW steps on batches from make_batch(step) -> (input, target), then an evaluation
// on a fresh batch.
template <typename MakeBatch>
TrainResult train(graph::Model& model, int64_t steps, double lr, MakeBatch make_batch) {
  // One thread: matrices this small gain nothing from a second one (and lose to its barriers).
  ExecContext ctx(Device::cpu(), nullptr, 1);
  graph::ParamStore store(model, 0, model.size(), default_cpu_allocator());
  store.initialize(1);
  graph::OptimizerConfig config;
  config.schedule.base_lr = lr;
  config.weight_decay = 0.01;
  graph::Optimizer optimizer(store, config);
  TrainResult run;
  double seconds = 0;
  int64_t tokens = 0, samples = 0;
  for (int64_t step = 0; step < steps; ++step) {
    const auto [input, target] = make_batch(step);
    graph::ForwardOptions options;
    options.step = step;
    options.sample_offset = step * input.size(0);
    const auto start = std::chrono::steady_clock::now();
    store.zero_grads();
    const graph::BatchMetrics m =
        graph::train_forward_backward(ctx, model, input, target, {}, options);
    optimizer.step(ctx, step);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    tokens += target.numel();
    samples += input.size(0);
    if (step == 0) run.first_loss = m.loss;
    run.last_loss = m.loss;
  }
  run.tokens_per_s = static_cast<double>(tokens) / seconds;
  run.samples_per_s = static_cast<double>(samples) / seconds;
  const auto [input, target] = make_batch(steps);
  run.eval = graph::evaluate_batch(ctx, model, input, target);
  return run;
}

// Next-token prediction on a fixed cycle of 12 distinct tokens entered at a random phase.
TEST(TransformerModels, Gpt2TinyLearnsARepeatingPattern) {
  constexpr int64_t kVocab = 32, kT = 32, kBatch = 16, kPeriod = 12;
  auto model = graph::build_model(model_spec(request("gpt2", "tiny", {kT}, kVocab)));
  PhiloxStream rng(5, 1);
  auto make_batch = [&](int64_t) {
    std::vector<int32_t> x, y;
    for (int64_t b = 0; b < kBatch; ++b) {
      const int64_t phase = static_cast<int64_t>(rng.next_below(kPeriod));
      for (int64_t t = 0; t < kT; ++t) {
        x.push_back(static_cast<int32_t>((5 * ((phase + t) % kPeriod) + 3) % kVocab));
        y.push_back(static_cast<int32_t>((5 * ((phase + t + 1) % kPeriod) + 3) % kVocab));
      }
    }
    return std::make_pair(Tensor::from_vector(x, {kBatch, kT}),
                          Tensor::from_vector(y, {kBatch, kT}));
  };
  const TrainResult run = train(*model, 40, 3e-3, make_batch);
  std::printf(
      "gpt2 tiny (L2 C64 H4, T %lld, V %lld): %.0f samples/s, %.0f tokens/s; loss %.3f -> %.3f\n",
      static_cast<long long>(kT), static_cast<long long>(kVocab), run.samples_per_s,
      run.tokens_per_s, run.first_loss, run.last_loss);
  EXPECT_NEAR(run.first_loss, std::log(static_cast<double>(kVocab)), 0.5);
  EXPECT_LT(run.last_loss, 0.15 * run.first_loss);
  EXPECT_GT(static_cast<double>(run.eval.top1) / static_cast<double>(run.eval.counted), 0.95);
}

// Masked copy within segments: segment 0 (token type 0) repeats one random token, segment 1
// (token type 1) another; each segment has two tokens masked, whose targets are their segment's
// token. The tail is padding filled with random other tokens that the attention mask must hide.
TEST(TransformerModels, BertTinyLearnsAMaskedCopy) {
  constexpr int64_t kVocab = 32, kT = 20, kFirst = 9, kSecond = 8, kBatch = 32;
  constexpr int32_t kMask = 1, kFirstToken = 2;
  auto model = graph::build_model(model_spec(request("bert", "tiny", {3, kT}, kVocab)));
  PhiloxStream rng(6, 1);
  auto token = [&] {
    return static_cast<int32_t>(kFirstToken + rng.next_below(kVocab - kFirstToken));
  };
  auto make_batch = [&](int64_t) {
    std::vector<int32_t> x(static_cast<size_t>(kBatch * 3 * kT));
    std::vector<int32_t> y(static_cast<size_t>(kBatch * kT), -100);
    for (int64_t b = 0; b < kBatch; ++b) {
      int32_t* ids = &x[static_cast<size_t>(b * 3 * kT)];
      int32_t* types = ids + kT;
      int32_t* attend = types + kT;
      const int32_t first = token();
      int32_t second = token();
      while (second == first) second = token();
      for (int64_t t = 0; t < kT; ++t) {
        const bool padding = t >= kFirst + kSecond;
        ids[t] = t < kFirst ? first : padding ? token() : second;
        types[t] = t >= kFirst && !padding ? 1 : 0;
        attend[t] = padding ? 0 : 1;
      }
      for (const auto& [begin, length] : {std::pair{int64_t{0}, kFirst}, {kFirst, kSecond}}) {
        for (int k = 0; k < 2; ++k) {
          const int64_t t = begin + static_cast<int64_t>(rng.next_below(length));
          y[static_cast<size_t>(b * kT + t)] = t < kFirst ? first : second;
          ids[t] = kMask;
        }
      }
    }
    return std::make_pair(Tensor::from_vector(x, {kBatch, 3, kT}),
                          Tensor::from_vector(y, {kBatch, kT}));
  };
  const TrainResult run = train(*model, 50, 1e-2, make_batch);
  const double accuracy =
      static_cast<double>(run.eval.top1) / static_cast<double>(run.eval.counted);
  std::printf("bert tiny masked copy: %.0f samples/s; loss %.3f -> %.3f, eval accuracy %.3f\n",
              run.samples_per_s, run.first_loss, run.last_loss, accuracy);
  EXPECT_LT(run.last_loss, 0.25 * run.first_loss);
  EXPECT_GT(accuracy, 0.9);
}

}  // namespace
}  // namespace strata::models
