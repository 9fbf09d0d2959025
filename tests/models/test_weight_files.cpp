// Weights exchange: tiny GPT-2, BERT, ResNet and VGG exported under Hugging Face / torchvision
// names (and Strata's) and imported into a fresh model give bitwise identical outputs; the names,
// layouts (GPT-2's transposed Conv1D weights, BERT's split query/key/value) and counters are the
// references'; a file that does not fit the model is rejected naming the file and the tensor; a
// pipeline stage loads only its own layers.
#include "models/weight_files.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>

#include "engine/allocator.h"
#include "engine/check.h"
#include "graph/model_spec.h"
#include "io/safetensors.h"
#include "models/registry.h"
#include "testing/testing.h"

namespace strata::models {
namespace {

// Per process: ctest runs each test of this file as a process of its own, two at a time, and
// the WeightFileErrors fixture of each writes the same file names.
std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "/strata_weights_" + std::to_string(::getpid()) + "_" + name +
         ".safetensors";
}

struct Built {
  std::unique_ptr<graph::Model> model;
  std::unique_ptr<graph::ParamStore> store;
};

// The model of `spec` with layers [begin, end) (end 0: all) in a CPU store initialized from
// `seed`.
Built build(const proto::ModelSpec& spec, uint64_t seed, size_t begin = 0, size_t end = 0) {
  Built b;
  b.model = graph::build_model(spec);
  b.store = std::make_unique<graph::ParamStore>(*b.model, begin, end == 0 ? b.model->size() : end,
                                                default_cpu_allocator());
  b.store->initialize(seed);
  return b;
}

// Random values in every parameter and buffer (running variances positive), so that no tensor
// keeps an initialization (zeros, ones) under which a wrong mapping would go unnoticed.
void randomize(const graph::ParamStore& store, uint64_t seed) {
  for (size_t i = 0; i < store.param_entries().size(); ++i) {
    if (store.param_entries()[i].alias) continue;
    const Tensor p = store.param(i);
    p.copy_from(testing::random_tensor(p.shape(), seed + i, -0.5, 0.5));
  }
  for (size_t i = 0; i < store.buffer_entries().size(); ++i) {
    const Tensor b = store.buffer(i);
    const bool var = store.buffer_entries()[i].name.find("running_var") != std::string::npos;
    b.copy_from(
        testing::random_tensor(b.shape(), seed + 1000 + i, var ? 0.5 : -0.5, var ? 2 : 0.5));
  }
}

Tensor eval_output(graph::Model& model, const Tensor& input) {
  ExecContext ctx(Device::cpu(), nullptr, 1);
  graph::ForwardOptions options;
  options.training = false;
  options.keep_tape = false;
  Tape tape;
  return model.forward(ctx, 0, model.size(), {input}, tape, options)[0].contiguous();
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  const Tensor ac = a.contiguous(), bc = b.contiguous();
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(ac.raw_data(), bc.raw_data(), ac.nbytes()) == 0;
}

// The store's view of Strata's parameter or buffer `full_name`.
Tensor find_tensor(const graph::ParamStore& store, const std::string& full_name) {
  for (size_t i = 0; i < store.param_entries().size(); ++i) {
    if (store.param_entries()[i].full_name() == full_name) return store.param(i);
  }
  for (size_t i = 0; i < store.buffer_entries().size(); ++i) {
    if (store.buffer_entries()[i].full_name() == full_name) return store.buffer(i);
  }
  ADD_FAILURE() << "no " << full_name;
  return Tensor();
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Exports `spec`'s model with random weights under `naming`, imports it into a fresh model
// (another seed) and compares outputs on `input` bitwise; returns the file.
std::string round_trip(const proto::ModelSpec& spec, const Tensor& input, WeightNaming naming,
                       const std::string& name) {
  Built a = build(spec, 1);
  randomize(*a.store, 100);
  const std::string path = temp_path(name);
  save_weights(path, *a.model, *a.store, naming);
  Built b = build(spec, 2);
  const Tensor expected = eval_output(*a.model, input);
  EXPECT_FALSE(bitwise_equal(eval_output(*b.model, input), expected)) << "a vacuous comparison";
  const WeightsReadReport report = load_weights(path, *b.model, *b.store);
  EXPECT_EQ(report.naming, naming);
  EXPECT_TRUE(report.converted.empty());
  EXPECT_TRUE(bitwise_equal(eval_output(*b.model, input), expected)) << name;
  EXPECT_TRUE(bitwise_equal(b.store->params(), a.store->params())) << name;
  EXPECT_TRUE(bitwise_equal(b.store->buffers(), a.store->buffers())) << name;
  return path;
}

proto::ModelSpec gpt2_tiny(int64_t vocab = 0) {
  ModelRequest r;
  r.name = "gpt2";
  r.size = "tiny";
  r.input_shape = {16};
  r.num_classes = vocab;
  return model_spec(r);
}

proto::ModelSpec bert_tiny() {
  ModelRequest r;
  r.name = "bert";
  r.size = "tiny";
  r.input_shape = {3, 16};
  return model_spec(r);
}

Tensor gpt2_input() { return testing::random_ids({2, 16}, 256, 5, DType::kI32); }

Tensor bert_input() {
  Tensor x = Tensor::zeros({2, 3, 16}, DType::kI32);
  const Tensor ids = testing::random_ids({2, 16}, 256, 6, DType::kI32);
  int32_t* p = x.data<int32_t>();
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t t = 0; t < 16; ++t) {
      p[(b * 3 + 0) * 16 + t] = ids.data<int32_t>()[b * 16 + t];
      p[(b * 3 + 1) * 16 + t] = t >= 8 ? 1 : 0;             // second segment
      p[(b * 3 + 2) * 16 + t] = b == 1 && t >= 12 ? 0 : 1;  // padding at the end of sample 1
    }
  }
  return x;
}

TEST(WeightFiles, Gpt2HuggingFaceRoundTripIsBitwise) {
  const std::string path =
      round_trip(gpt2_tiny(), gpt2_input(), WeightNaming::kHuggingFace, "gpt2_hf");
  const io::SafetensorsReader file(path);
  EXPECT_EQ(file.metadata().at("format"), "pt");
  EXPECT_EQ(file.metadata().at(kWeightsNamingKey), "hf");
  EXPECT_EQ(file.tensors().size(), 2u + 2 * 12 + 2);  // wte, wpe, 12 per block, ln_f
  EXPECT_EQ(file.find("lm_head.weight"), nullptr);    // tied to wte
  EXPECT_EQ(file.find("transformer.wte.weight")->shape, (Shape{256, 64}));
  EXPECT_EQ(file.find("transformer.wpe.weight")->shape, (Shape{64, 64}));
  EXPECT_EQ(file.find("transformer.h.1.attn.c_attn.weight")->shape, (Shape{64, 192}));
  EXPECT_EQ(file.find("transformer.h.1.attn.c_attn.bias")->shape, (Shape{192}));
  EXPECT_EQ(file.find("transformer.h.0.mlp.c_fc.weight")->shape, (Shape{64, 256}));
  EXPECT_EQ(file.find("transformer.h.0.mlp.c_proj.weight")->shape, (Shape{256, 64}));
  EXPECT_NE(file.find("transformer.h.0.ln_2.bias"), nullptr);
  EXPECT_NE(file.find("transformer.ln_f.weight"), nullptr);
  // Conv1D layout: the file holds the transpose of Strata's (out, in) weight.
  Built a = build(gpt2_tiny(), 1);
  load_weights(path, *a.model, *a.store);
  EXPECT_TRUE(bitwise_equal(file.read("transformer.h.1.attn.c_attn.weight"),
                            find_tensor(*a.store, "blocks.1.attn.c_attn.weight").transpose(0, 1)));
  EXPECT_TRUE(bitwise_equal(file.read("transformer.h.0.mlp.c_proj.weight"),
                            find_tensor(*a.store, "blocks.0.mlp.c_proj.weight").transpose(0, 1)));
}

TEST(WeightFiles, BertHuggingFaceRoundTripIsBitwise) {
  const std::string path =
      round_trip(bert_tiny(), bert_input(), WeightNaming::kHuggingFace, "bert_hf");
  const io::SafetensorsReader file(path);
  // 5 embedding tensors, 16 per layer (query, key, value split), 5 of the head; no decoder.
  EXPECT_EQ(file.tensors().size(), 5u + 2 * 16 + 5);
  EXPECT_EQ(file.find("cls.predictions.decoder.weight"), nullptr);
  for (const char* n :
       {"bert.embeddings.word_embeddings.weight", "bert.embeddings.position_embeddings.weight",
        "bert.embeddings.token_type_embeddings.weight", "bert.embeddings.LayerNorm.bias",
        "bert.encoder.layer.1.attention.output.dense.weight",
        "bert.encoder.layer.1.attention.output.LayerNorm.weight",
        "bert.encoder.layer.0.intermediate.dense.bias", "bert.encoder.layer.0.output.dense.weight",
        "bert.encoder.layer.0.output.LayerNorm.bias", "cls.predictions.transform.dense.weight",
        "cls.predictions.transform.LayerNorm.weight", "cls.predictions.bias"}) {
    EXPECT_NE(file.find(n), nullptr) << n;
  }
  EXPECT_EQ(file.find("bert.encoder.layer.0.intermediate.dense.weight")->shape, (Shape{256, 64}));
  // query, key, value are the three row blocks of Strata's fused c_attn.
  Built a = build(bert_tiny(), 1);
  load_weights(path, *a.model, *a.store);
  const Tensor w = find_tensor(*a.store, "layers.1.attn.c_attn.weight");
  const Tensor bias = find_tensor(*a.store, "layers.1.attn.c_attn.bias");
  const char* parts[] = {"query", "key", "value"};
  for (int k = 0; k < 3; ++k) {
    const std::string prefix = std::string("bert.encoder.layer.1.attention.self.") + parts[k];
    EXPECT_TRUE(bitwise_equal(file.read(prefix + ".weight"), w.narrow(0, 64 * k, 64))) << prefix;
    EXPECT_TRUE(bitwise_equal(file.read(prefix + ".bias"), bias.narrow(0, 64 * k, 64))) << prefix;
  }
}

TEST(WeightFiles, ResNetTorchvisionRoundTripKeepsRunningStatistics) {
  const proto::ModelSpec spec = model_spec("resnet", "tiny", {3, 16, 16}, 10);
  const Tensor input = testing::random_tensor({2, 3, 16, 16}, 7, -1, 1, DType::kF32);
  const std::string path = round_trip(spec, input, WeightNaming::kHuggingFace, "resnet_hf");
  const io::SafetensorsReader file(path);
  for (const char* n :
       {"conv1.weight", "bn1.weight", "bn1.running_mean", "bn1.running_var",
        "layer1.0.conv2.weight", "layer1.0.bn2.running_var", "layer2.0.downsample.0.weight",
        "layer2.0.downsample.1.running_mean", "fc.weight", "fc.bias"}) {
    EXPECT_NE(file.find(n), nullptr) << n;
  }
  for (const char* n : {"bn1.num_batches_tracked", "layer1.0.bn1.num_batches_tracked",
                        "layer2.0.downsample.1.num_batches_tracked"}) {
    ASSERT_NE(file.find(n), nullptr) << n;
    EXPECT_EQ(file.find(n)->dtype, "I64");
    EXPECT_EQ(file.find(n)->shape, Shape{});
  }
  EXPECT_EQ(file.find("conv1.weight")->shape, (Shape{8, 3, 3, 3}));  // the small-image stem
}

TEST(WeightFiles, VggWithBatchNormRoundTripUsesTorchvisionIndices) {
  const proto::ModelSpec spec = model_spec("vgg", "tiny-bn", {3, 8, 8}, 10);
  const Tensor input = testing::random_tensor({2, 3, 8, 8}, 8, -1, 1, DType::kF32);
  const std::string path = round_trip(spec, input, WeightNaming::kHuggingFace, "vgg_hf");
  const io::SafetensorsReader file(path);
  // conv 0, bn 1, relu 2, pool 3, conv 4, bn 5, ...
  for (const char* n :
       {"features.0.weight", "features.0.bias", "features.1.running_mean",
        "features.1.num_batches_tracked", "features.4.weight", "features.5.running_var",
        "classifier.0.weight", "classifier.3.bias", "classifier.6.weight"}) {
    EXPECT_NE(file.find(n), nullptr) << n;
  }
}

TEST(WeightFiles, StrataNamesRoundTripAndAreDetected) {
  const std::string path = round_trip(gpt2_tiny(), gpt2_input(), WeightNaming::kStrata, "strata");
  const io::SafetensorsReader file(path);
  EXPECT_EQ(file.find("embed.wte.weight")->shape, (Shape{256, 64}));
  EXPECT_EQ(file.find("blocks.0.attn.c_attn.weight")->shape, (Shape{192, 64}));
  EXPECT_EQ(file.find("head.weight"), nullptr);  // tied to embed.wte.weight
  EXPECT_NE(file.find("head.ln_f.weight"), nullptr);

  // Without the metadata, the naming is found from the names.
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const io::SafetensorsInfo& t : file.tensors())
    tensors.emplace_back(t.name, file.read(t.name));
  const std::string bare = temp_path("strata_bare");
  io::write_safetensors(bare, tensors);
  Built b = build(gpt2_tiny(), 3);
  EXPECT_EQ(load_weights(bare, *b.model, *b.store).naming, WeightNaming::kStrata);
  // Forcing the other naming finds nothing it needs.
  WeightsReadOptions hf;
  hf.naming = WeightNaming::kHuggingFace;
  const std::string e = error_of([&] { load_weights(bare, *b.model, *b.store, hf); });
  EXPECT_NE(e.find("needs tensor 'transformer.wte.weight' (Strata's embed.wte.weight)"),
            std::string::npos)
      << e;
}

using TensorPairs = std::vector<std::pair<std::string, Tensor>>;

// A copy of file `from` with `edit` applied to its name -> tensor list, without metadata.
std::string edited(const std::string& from, const std::string& name,
                   const std::function<void(TensorPairs*)>& edit) {
  const io::SafetensorsReader file(from);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const io::SafetensorsInfo& t : file.tensors())
    tensors.emplace_back(t.name, file.read(t.name));
  edit(&tensors);
  const std::string path = temp_path(name);
  io::write_safetensors(path, tensors);
  return path;
}

Tensor& tensor_named(TensorPairs* tensors, const std::string& n) {
  for (auto& [name, t] : *tensors) {
    if (name == n) return t;
  }
  STRATA_THROW() << "no " << n;
}

class WeightFileErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    Built a = build(gpt2_tiny(), 1);
    randomize(*a.store, 200);
    good_ = temp_path("errors_good");
    save_weights(good_, *a.model, *a.store, WeightNaming::kHuggingFace);
    b_ = build(gpt2_tiny(), 2);
  }
  std::string load_error(const std::string& path, const WeightsReadOptions& options = {}) {
    return error_of([&] { load_weights(path, *b_.model, *b_.store, options); });
  }
  std::string good_;
  Built b_;
};

#define EXPECT_HAS(message, part) \
  EXPECT_NE((message).find(part), std::string::npos) << "no '" << (part) << "' in " << (message)

TEST_F(WeightFileErrors, MissingTensorIsNamed) {
  const std::string path = edited(good_, "missing", [](TensorPairs* t) {
    t->erase(std::find_if(t->begin(), t->end(),
                          [](const auto& p) { return p.first == "transformer.h.1.ln_2.bias"; }));
  });
  const std::string e = load_error(path);
  EXPECT_HAS(e, path);
  EXPECT_HAS(e, "needs tensor 'transformer.h.1.ln_2.bias' (Strata's blocks.1.ln_2.bias)");
  EXPECT_HAS(e, "1 of the model's 28 tensors are missing");
}

TEST_F(WeightFileErrors, ExtraTensorIsNamedUnlessIgnored) {
  const std::string path = edited(good_, "extra", [](TensorPairs* t) {
    t->emplace_back("transformer.h.7.attn.c_attn.weight", Tensor::zeros({64, 192}));
  });
  const std::string e = load_error(path);
  EXPECT_HAS(e, path);
  EXPECT_HAS(e, "tensor 'transformer.h.7.attn.c_attn.weight' has no place in model gpt2-tiny");
  WeightsReadOptions ignore;
  ignore.ignore_extra = true;
  const WeightsReadReport r = load_weights(path, *b_.model, *b_.store, ignore);
  EXPECT_EQ(r.extra, std::vector<std::string>{"transformer.h.7.attn.c_attn.weight"});
}

TEST_F(WeightFileErrors, ShapeMismatchIsNamed) {
  // The model of another vocabulary.
  Built other = build(gpt2_tiny(300), 2);
  const std::string e = error_of([&] { load_weights(good_, *other.model, *other.store); });
  EXPECT_HAS(e, good_);
  EXPECT_HAS(e,
             "tensor 'transformer.wte.weight' has shape (256, 64), but model gpt2-tiny "
             "expects (300, 64) (Strata's embed.wte.weight)");
  // A weight in Strata's layout where HF's Conv1D layout belongs.
  const std::string path = edited(good_, "transposed", [](TensorPairs* t) {
    Tensor& w = tensor_named(t, "transformer.h.0.mlp.c_fc.weight");
    w = w.transpose(0, 1).contiguous();
  });
  const std::string f = load_error(path);
  EXPECT_HAS(f, "tensor 'transformer.h.0.mlp.c_fc.weight' has shape (256, 64)");
  EXPECT_HAS(f, "transposed");
}

TEST_F(WeightFileErrors, DtypeMismatchIsNamed) {
  const std::string path = edited(good_, "dtype", [](TensorPairs* t) {
    Tensor& w = tensor_named(t, "transformer.ln_f.weight");
    w = w.to(DType::kI32);
  });
  const std::string e = load_error(path);
  EXPECT_HAS(e, path);
  EXPECT_HAS(e, "tensor 'transformer.ln_f.weight' has dtype I32");
  EXPECT_HAS(e, "floating-point");
}

TEST_F(WeightFileErrors, HalfPrecisionIsConverted) {
  const std::string path = edited(good_, "bf16", [](TensorPairs* t) {
    for (auto& [name, w] : *t) w = w.to(DType::kBF16);
  });
  const WeightsReadReport r = load_weights(path, *b_.model, *b_.store);
  EXPECT_EQ(r.converted.size(), 28u);
  const io::SafetensorsReader file(path);
  EXPECT_TRUE(bitwise_equal(find_tensor(*b_.store, "blocks.0.attn.c_proj.bias"),
                            file.read("transformer.h.0.attn.c_proj.bias").to(DType::kF32)));
}

TEST_F(WeightFileErrors, HubNamesWithoutPrefixAndTiedCopiesAreAccepted) {
  Built a = build(gpt2_tiny(), 9);
  load_weights(good_, *a.model, *a.store);
  // GPT2Model files (as on the hub) leave out "transformer."; some keep lm_head.weight and the
  // causal-mask buffers.
  const std::string path = edited(good_, "hub", [](TensorPairs* t) {
    for (auto& [name, w] : *t) name = name.substr(std::string("transformer.").size());
    t->emplace_back("lm_head.weight", tensor_named(t, "wte.weight").clone());
    t->emplace_back("h.0.attn.bias", Tensor::full({1, 1, 16, 16}, 1.0));
  });
  const WeightsReadReport r = load_weights(path, *b_.model, *b_.store);
  EXPECT_TRUE(bitwise_equal(b_.store->params(), a.store->params()));
  EXPECT_EQ(r.ignored.size(), 2u);
  const std::string differs = edited(path, "hub_differs", [](TensorPairs* t) {
    tensor_named(t, "lm_head.weight").data<float>()[5] += 1.0f;
  });
  const std::string e = load_error(differs);
  EXPECT_HAS(e, "tensor 'lm_head.weight' differs from 'transformer.wte.weight'");
}

TEST_F(WeightFileErrors, AStageLoadsOnlyItsLayers) {
  Built full = build(gpt2_tiny(), 9);
  load_weights(good_, *full.model, *full.store);
  // Layers blocks.1 and head: the head's weight is a copy of the embedding, which this stage lacks.
  Built stage = build(gpt2_tiny(), 4, 2);
  const WeightsReadReport r = load_weights(good_, *stage.model, *stage.store);
  EXPECT_EQ(r.tensors_loaded, 12 + 2 + 1);  // blocks.1, ln_f, wte for the tied copy
  for (const graph::ParamStore::Entry& e : stage.store->param_entries()) {
    EXPECT_TRUE(bitwise_equal(find_tensor(*stage.store, e.full_name()),
                              find_tensor(*full.store, e.full_name())))
        << e.full_name();
  }
  EXPECT_TRUE(bitwise_equal(find_tensor(*stage.store, "head.weight"),
                            find_tensor(*full.store, "embed.wte.weight")));
  // The whole file is still checked: a flaw in another stage's tensor fails this stage too.
  const std::string path = edited(good_, "stage_missing", [](TensorPairs* t) {
    t->erase(std::find_if(t->begin(), t->end(),
                          [](const auto& p) { return p.first == "transformer.wpe.weight"; }));
  });
  const std::string e = error_of([&] { load_weights(path, *stage.model, *stage.store); });
  EXPECT_HAS(e, "transformer.wpe.weight");
}

TEST(WeightFiles, SavingAStageIsAnError) {
  Built stage = build(gpt2_tiny(), 4, 1);
  const std::string e = error_of([&] {
    save_weights(temp_path("stage"), *stage.model, *stage.store, WeightNaming::kHuggingFace);
  });
  EXPECT_HAS(e, "holds layers [1, 4)");
}

}  // namespace
}  // namespace strata::models
