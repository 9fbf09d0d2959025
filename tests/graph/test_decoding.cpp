// Incremental decoding: the logits of a key/value-cached GPT-2 equal those of the uncached forward
// of the whole sequence, at every position, however the sequence is cut into calls; and the
// sampler keeps to temperature, top-k and top-p.
#include "graph/decoding.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "engine/allocator.h"
#include "graph/model.h"
#include "graph/model_spec.h"
#include "graph/param_store.h"
#include "models/generation.h"
#include "models/registry.h"

namespace strata::graph {
namespace {

struct TinyGpt2 {
  std::unique_ptr<Model> model;
  std::unique_ptr<ParamStore> store;
};

// 3 blocks, width 32, 4 heads, 24 positions, vocabulary 61; random weights.
TinyGpt2 tiny_gpt2() {
  models::ModelRequest r;
  r.name = "gpt2";
  r.size = "tiny";
  r.dims = {3, 32, 4, 24, 61};
  TinyGpt2 m;
  m.model = build_model(models::model_spec(r));
  m.store = std::make_unique<ParamStore>(*m.model, 0, m.model->size(), default_cpu_allocator());
  m.store->initialize(7);
  // Larger weights than GPT-2's 0.02 so that the logits differ visibly between positions.
  float* p = m.store->params().data<float>();
  for (int64_t i = 0; i < m.store->params().numel(); ++i) p[i] *= 8.0f;
  return m;
}

Tensor uncached_logits(ExecContext& ctx, Model& model, const Tensor& ids) {
  Tape tape;
  ForwardOptions o;
  o.training = false;
  o.keep_tape = false;
  return model.forward(ctx, 0, model.size(), {ids}, tape, o)[0];
}

// ids (B, T) of distinct-looking tokens.
Tensor sequence(int64_t b, int64_t t) {
  std::vector<int32_t> v;
  for (int64_t i = 0; i < b * t; ++i) v.push_back(static_cast<int32_t>((i * 37 + 11) % 61));
  return Tensor::from_vector<int32_t>(v, {b, t});
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  const std::vector<float> x = a.to_vector<float>(), y = b.to_vector<float>();
  double d = 0;
  for (size_t i = 0; i < x.size(); ++i) d = std::max(d, std::fabs(double(x[i]) - y[i]));
  return d;
}

TEST(Decoding, CachedLogitsEqualUncachedAtEveryPosition) {
  ExecContext ctx(Device::cpu(), nullptr, 1);
  TinyGpt2 m = tiny_gpt2();
  const int64_t b = 2, t = 20;
  const Tensor ids = sequence(b, t);
  // (B, T, Vp): the vocabulary of 61 padded to 128 inside the engine, -inf logits there.
  const Tensor padded = uncached_logits(ctx, *m.model, ids);
  ASSERT_EQ(padded.shape(), (Shape{b, t, 128}));
  const Tensor full = padded.narrow(2, 0, 61).contiguous();
  double scale = 0;
  for (float v : full.to_vector<float>()) scale = std::max(scale, std::fabs(double(v)));
  ASSERT_GT(scale, 0.5);
  // A prompt of 7 positions, then 3, then one position at a time.
  for (const std::vector<int64_t>& cuts : {std::vector<int64_t>{7, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
                                           std::vector<int64_t>(20, 1), std::vector<int64_t>{20}}) {
    Decoder decoder(*m.model, 0, m.model->size());
    int64_t at = 0;
    for (int64_t n : cuts) {
      const Tensor logits = decoder.forward(ctx, {ids.narrow(1, at, n).contiguous()})[0];
      ASSERT_EQ(logits.shape(), (Shape{b, n, 128}));
      const Tensor out = logits.narrow(2, 0, 61).contiguous();
      EXPECT_LT(max_abs_diff(out, full.narrow(1, at, n).contiguous()), 1e-5 * scale)
          << "positions " << at << ".." << at + n - 1;
      at += n;
      EXPECT_EQ(decoder.position(), at);
    }
    // The first layer cannot go past its positions.
    if (at == 20) {
      EXPECT_NO_THROW(decoder.forward(ctx, {sequence(b, 4)}));
      EXPECT_THROW(decoder.forward(ctx, {sequence(b, 1)}), Error);
    }
  }
  // The logits really depend on the prefix (so the cache is read): position 5 of a sequence
  // differs from the same token at position 5 after another prefix.
  Decoder other(*m.model, 0, m.model->size());
  std::vector<int32_t> v = ids.to_vector<int32_t>();
  for (int i = 0; i < 5; ++i) v[i] = (v[i] + 1) % 61;
  const Tensor changed =
      Tensor::from_vector<int32_t>(std::vector<int32_t>(v.begin(), v.begin() + 6), {1, 6});
  const Tensor out = other.forward(ctx, {changed})[0];
  EXPECT_GT(max_abs_diff(out.narrow(2, 0, 61).narrow(1, 5, 1).contiguous(),
                         full.narrow(0, 0, 1).narrow(1, 5, 1).contiguous()),
            1e-3 * scale);
}

TEST(Decoding, GenerateMatchesGreedyUncachedDecoding) {
  ExecContext ctx(Device::cpu(), nullptr, 1);
  TinyGpt2 m = tiny_gpt2();
  Decoder decoder(*m.model, 0, m.model->size());
  models::SamplingOptions greedy;
  greedy.temperature = 0;
  std::vector<int32_t> streamed;
  const std::vector<int32_t> prompt = {3, 14, 15};
  const std::vector<int32_t> out =
      models::generate(ctx, decoder, prompt, 12, greedy, [&](int32_t id) {
        streamed.push_back(id);
        return true;
      });
  EXPECT_EQ(out, streamed);
  ASSERT_EQ(out.size(), 12u);
  std::vector<int32_t> ids = prompt;
  for (int i = 0; i < 12; ++i) {
    const Tensor logits = uncached_logits(
        ctx, *m.model, Tensor::from_vector<int32_t>(ids, {1, static_cast<int64_t>(ids.size())}));
    const Tensor last = logits.select(1, logits.size(1) - 1).contiguous();
    ids.push_back(models::sample_token(last.data<float>(), last.numel(), greedy, i));
    EXPECT_EQ(ids.back(), out[static_cast<size_t>(i)]) << "token " << i;
  }
}

TEST(Decoding, LayersWithoutACachedPathAreNamed) {
  proto::ModelSpec spec = models::model_spec("mlp", "tiny", {1, 28, 28}, 10);
  std::unique_ptr<Model> mlp = build_model(spec);
  try {
    Decoder d(*mlp, 0, mlp->size());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("cannot decode token by token"), std::string::npos) << e.what();
  }
}

TEST(Sampling, TemperatureTopKAndTopP) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.9f, -1.0f, 0.5f, 2.0f};
  models::SamplingOptions o;
  o.temperature = 0;
  EXPECT_EQ(models::sample_token(logits.data(), 6, o, 0), 1);
  o.temperature = 1;
  o.top_k = 1;
  for (int i = 0; i < 20; ++i) EXPECT_EQ(models::sample_token(logits.data(), 6, o, i), 1);
  o.top_k = 2;
  std::set<int32_t> seen;
  for (int i = 0; i < 200; ++i) seen.insert(models::sample_token(logits.data(), 6, o, i));
  EXPECT_EQ(seen, (std::set<int32_t>{1, 2}));
  o.top_k = 0;
  o.top_p = 0.01;  // only the most likely token holds that much
  for (int i = 0; i < 20; ++i) EXPECT_EQ(models::sample_token(logits.data(), 6, o, i), 1);
  o.top_p = 1;
  o.vocab_limit = 3;  // ids 0..2 only
  seen.clear();
  for (int i = 0; i < 300; ++i) seen.insert(models::sample_token(logits.data(), 6, o, i));
  EXPECT_EQ(seen, (std::set<int32_t>{0, 1, 2}));
  // Frequencies follow the softmax: token 1 vs token 0 at T = 1 is e^2 ~ 7.4 times as likely.
  o.vocab_limit = 0;
  o.seed = 5;
  int ones = 0, zeros = 0;
  for (int i = 0; i < 4000; ++i) {
    const int32_t t = models::sample_token(logits.data(), 6, o, i);
    ones += t == 1;
    zeros += t == 0;
  }
  EXPECT_NEAR(static_cast<double>(ones) / zeros, std::exp(2.0), 2.0);
  // The same (seed, index) draws the same token.
  EXPECT_EQ(models::sample_token(logits.data(), 6, o, 17),
            models::sample_token(logits.data(), 6, o, 17));
  o.temperature = -1;
  EXPECT_THROW(models::check_sampling(o), Error);
  o.temperature = 1;
  o.top_p = 0;
  EXPECT_THROW(models::check_sampling(o), Error);
}

}  // namespace
}  // namespace strata::graph
