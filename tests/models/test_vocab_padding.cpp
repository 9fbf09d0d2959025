// The vocabulary padded inside the engine (graph/transformer.h, ModelDims::vocab_multiple): on
// the CPU a padded GPT-2 or BERT gives the unpadded model's logits, loss and gradients of the real
// vocabulary bit for bit, the padding's logits are -inf and its gradients zero, the padding is no
// parameter, and weight files keep the real vocabulary both ways.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>

#include "engine/allocator.h"
#include "graph/model.h"
#include "graph/model_spec.h"
#include "graph/param_store.h"
#include "graph/train_step.h"
#include "io/safetensors.h"
#include "models/registry.h"
#include "models/weight_files.h"
#include "testing/testing.h"

namespace strata::models {
namespace {

constexpr int64_t kVocab = 300;  // not a multiple of 128: padded to 384
constexpr int64_t kPadded = 384;
constexpr int64_t kSeq = 16;

struct Built {
  std::unique_ptr<graph::Model> model;
  std::unique_ptr<graph::ParamStore> store;
};

Built build(const std::string& name, int64_t multiple) {
  ModelRequest r;
  r.name = name;
  r.size = "tiny";
  r.input_shape = name == "bert" ? Shape{3, kSeq} : Shape{kSeq};
  r.num_classes = kVocab;
  r.dims.vocab_multiple = multiple;
  Built b;
  b.model = graph::build_model(model_spec(r));
  b.store =
      std::make_unique<graph::ParamStore>(*b.model, 0, b.model->size(), default_cpu_allocator());
  b.store->initialize(7);
  return b;
}

// Token ids below kVocab; BERT's (3, T) rows of ids, segments and a mask with some padding.
Tensor batch_input(const std::string& name) {
  if (name == "gpt2") return testing::random_ids({2, kSeq}, kVocab, 3, DType::kI32);
  Tensor x = Tensor::zeros({2, 3, kSeq}, DType::kI32);
  int32_t* p = x.data<int32_t>();
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t t = 0; t < kSeq; ++t) {
      p[(b * 3 + 0) * kSeq + t] = static_cast<int32_t>((b * 97 + t * 31) % kVocab);
      p[(b * 3 + 1) * kSeq + t] = t >= kSeq / 2 ? 1 : 0;
      p[(b * 3 + 2) * kSeq + t] = b == 1 && t >= kSeq - 3 ? 0 : 1;
    }
  }
  return x;
}
Tensor batch_target(const std::string& name) {
  Tensor t = testing::random_ids({2, kSeq}, kVocab, 4, DType::kI64);
  if (name == "bert") t.data<int64_t>()[5] = -100;  // an unmasked position: ignored
  return t;
}

double max_abs(const Tensor& t) {
  double m = 0.0;
  for (double v : t.contiguous().to_vector<double>()) m = std::max(m, std::fabs(v));
  return m;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  return ca.shape() == cb.shape() && ca.dtype() == cb.dtype() &&
         std::memcmp(ca.raw_data(), cb.raw_data(), ca.nbytes()) == 0;
}

// Parameter i of `padded` restricted to its real rows.
Tensor real_rows(const graph::ParamStore& s, size_t i, const Tensor& t) {
  const graph::ParamStore::Entry& e = s.param_entries()[i];
  return e.valid_rows > 0 ? t.narrow(0, 0, e.valid_rows) : t;
}

class VocabPadding : public ::testing::TestWithParam<std::string> {};

TEST_P(VocabPadding, RealVocabularyIsBitForBitTheUnpaddedModel) {
  const std::string name = GetParam();
  Built padded = build(name, 128), plain = build(name, 1);
  ExecContext ctx;
  // The padding: in the embedding (and the tied head), zero, not counted.
  const graph::ParamStore::Entry& table = padded.store->param_entries()[0];
  ASSERT_EQ(table.shape, (Shape{kPadded, 64}));
  EXPECT_EQ(table.valid_rows, kVocab);
  EXPECT_EQ(plain.store->param_entries()[0].shape, (Shape{kVocab, 64}));
  EXPECT_EQ(padded.store->num_params(), plain.store->num_params());
  EXPECT_EQ(padded.model->loss_classes(), kVocab);
  EXPECT_EQ(plain.model->loss_classes(), 0);
  ASSERT_EQ(padded.store->param_entries().size(), plain.store->param_entries().size());
  for (size_t i = 0; i < padded.store->param_entries().size(); ++i) {
    ASSERT_TRUE(
        same_bits(real_rows(*padded.store, i, padded.store->param(i)), plain.store->param(i)))
        << "initial " << padded.store->param_entries()[i].full_name();
  }
  EXPECT_EQ(max_abs(padded.store->param(0).narrow(0, kVocab, kPadded - kVocab)), 0.0);

  // Logits: the real columns bit for bit, -inf on the padding.
  const Tensor input = batch_input(name), target = batch_target(name);
  Tape tape_a, tape_b;
  graph::ForwardOptions eval;
  eval.training = false;
  eval.keep_tape = false;
  const Tensor logits =
      padded.model->forward(ctx, 0, padded.model->size(), {input}, tape_a, eval)[0];
  const Tensor logits_plain =
      plain.model->forward(ctx, 0, plain.model->size(), {input}, tape_b, eval)[0];
  ASSERT_EQ(logits.shape(), (Shape{2, kSeq, kPadded}));
  EXPECT_TRUE(same_bits(logits.narrow(2, 0, kVocab), logits_plain));
  for (double v : logits.narrow(2, kVocab, kPadded - kVocab).contiguous().to_vector<double>()) {
    ASSERT_EQ(v, -std::numeric_limits<double>::infinity());
  }

  // A training pass (dropout on): the loss and every gradient of the real vocabulary, bit for
  // bit; the padding's gradients are zero.
  graph::ForwardOptions train;
  train.seed = 11;
  ops::CrossEntropyOptions loss;  // num_classes from the model (train_forward_backward)
  const graph::BatchMetrics m =
      graph::train_forward_backward(ctx, *padded.model, input, target, loss, train);
  const graph::BatchMetrics m_plain =
      graph::train_forward_backward(ctx, *plain.model, input, target, loss, train);
  EXPECT_TRUE(std::isfinite(m.loss));
  EXPECT_EQ(std::memcmp(&m.loss, &m_plain.loss, sizeof(double)), 0)
      << m.loss << " vs " << m_plain.loss;
  EXPECT_EQ(m.counted, m_plain.counted);
  EXPECT_EQ(m.top1, m_plain.top1);
  EXPECT_EQ(m.top5, m_plain.top5);
  for (size_t i = 0; i < padded.store->param_entries().size(); ++i) {
    const graph::ParamStore::Entry& e = padded.store->param_entries()[i];
    EXPECT_TRUE(same_bits(real_rows(*padded.store, i, padded.store->grad(i)), plain.store->grad(i)))
        << "gradient of " << e.full_name();
    if (e.valid_rows > 0 && !e.alias) {
      EXPECT_EQ(max_abs(padded.store->grad(i).narrow(0, e.valid_rows, e.shape[0] - e.valid_rows)),
                0.0)
          << "the padding's gradient of " << e.full_name();
    }
  }
  // Evaluation: the same loss and counts.
  const graph::BatchMetrics ev = graph::evaluate_batch(ctx, *padded.model, input, target);
  const graph::BatchMetrics ev_plain = graph::evaluate_batch(ctx, *plain.model, input, target);
  EXPECT_EQ(std::memcmp(&ev.loss, &ev_plain.loss, sizeof(double)), 0);
  EXPECT_EQ(ev.top1, ev_plain.top1);
}

// Files keep the real vocabulary: a padded model writes V rows, and either model reads the
// other's file back to the same values.
TEST_P(VocabPadding, WeightFilesKeepTheRealVocabulary) {
  const std::string name = GetParam();
  Built padded = build(name, 128), plain = build(name, 1);
  for (WeightNaming naming : {WeightNaming::kHuggingFace, WeightNaming::kStrata}) {
    SCOPED_TRACE(weight_naming_name(naming));
    const std::string path = ::testing::TempDir() + "/strata_vocab_" + name + "_" +
                             weight_naming_name(naming) + ".safetensors";
    save_weights(path, *padded.model, *padded.store, naming);
    const io::SafetensorsReader file(path);
    for (const io::SafetensorsInfo& info : file.tensors()) {
      for (int64_t size : info.shape) {
        EXPECT_NE(size, kPadded) << info.name << " " << shape_str(info.shape) << " is padded";
      }
    }
    Built into_plain = build(name, 1), into_padded = build(name, 128);
    into_padded.store->param(0).fill_(0.5);  // the padding rows must come out zero again
    load_weights(path, *into_plain.model, *into_plain.store, {});
    load_weights(path, *into_padded.model, *into_padded.store, {});
    for (size_t i = 0; i < plain.store->param_entries().size(); ++i) {
      EXPECT_TRUE(same_bits(into_plain.store->param(i), plain.store->param(i)))
          << plain.store->param_entries()[i].full_name();
      EXPECT_TRUE(same_bits(into_padded.store->param(i), padded.store->param(i)))
          << padded.store->param_entries()[i].full_name();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, VocabPadding, ::testing::Values("gpt2", "bert"));

}  // namespace
}  // namespace strata::models
