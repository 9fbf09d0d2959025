// The ends of GPT-2 and BERT: GPT-2's token + position embedding, BERT's embeddings (word,
// position, token type, layer norm, dropout), GPT-2's language-model head and BERT's
// masked-language-model head. Conventions (padded vocabulary, tied output weights, dropout
// streams, initialization) are graph/transformer.cpp's.
#include "graph/transformer.h"

#include "engine/check.h"
#include "graph/decoding.h"
#include "graph/transformer_parts.h"
#include "ops/activation.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/layer_norm.h"
#include "ops/matmul.h"
#include "ops/shape_ops.h"

namespace strata::graph {
namespace {

using namespace transformer_parts;  // NOLINT(build/namespaces): the layers' own helpers

// ---- GPT-2 token + position embedding ----------------------------------------------------------

class TokenEmbedding final : public Layer, public CachedLayer {
 public:
  TokenEmbedding(std::string name, const proto::TokenEmbeddingSpec& spec)
      : Layer(std::move(name)),
        vocab_(spec.vocab_size()),
        width_(spec.width()),
        positions_(spec.max_positions()),
        dropout_(spec.dropout()) {
    STRATA_CHECK(vocab_ > 0 && width_ > 0 && positions_ > 0)
        << "layer " << this->name()
        << ": token_embedding needs vocab_size, width and max_positions (> 0), got " << vocab_
        << ", " << width_ << ", " << positions_;
    check_probability(this->name(), "dropout", dropout_);
    padded_ = padded_vocab(this->name(), vocab_, spec.padded_vocab_size());
  }

  const char* type() const override { return "token_embedding"; }

  std::vector<ParamSpec> param_specs() const override {
    return {embedding_table("wte.weight", vocab_, padded_, width_),
            normal_weight("wpe.weight", {positions_, width_}, kPositionInitStd)};
  }

  TensorSpecs output_specs(const TensorSpecs& inputs) const override {
    STRATA_CHECK(inputs.size() == 1 && inputs[0].shape.size() == 1 &&
                 (inputs[0].dtype == DType::kI32 || inputs[0].dtype == DType::kI64))
        << label(*this) << " takes token ids (T,) of i32 or i64, got " << specs_str(inputs);
    check_length(inputs[0].shape[0]);
    return {TensorSpec{{inputs[0].shape[0], width_}, DType::kF32}};
  }

  TensorList forward(ExecContext& ctx, const TensorList& inputs, LayerTape& tape) override {
    const Tensor& ids = single_input(inputs);
    STRATA_CHECK_EQ(ids.dim(), 2) << label(*this) << " expects token ids (B, T), got "
                                  << ids.shape_str();
    const int64_t t = ids.size(1);
    check_length(t);
    // The real vocabulary's rows: an id past V is an error, never a padding row.
    const Tensor e = ops::add(ctx, ops::embedding_forward(ctx, ids, param(0).narrow(0, 0, vocab_)),
                              param(1).narrow(0, 0, t));  // (B, T, C) + (T, C)
    const Dropped out = dropout(ctx, e, dropout_, tape, 0);
    tape.save(ids);       // 0: token ids (B, T)
    tape.save(out.mask);  // 1: dropout mask (undefined when off)
    return {out.y};
  }

  // Token ids (B, T) at positions [cache.position, cache.position + T).
  TensorList forward_cached(ExecContext& ctx, const TensorList& inputs,
                            LayerCache& cache) override {
    const Tensor& ids = single_input(inputs);
    STRATA_CHECK_EQ(ids.dim(), 2) << label(*this) << " expects token ids (B, T), got "
                                  << ids.shape_str();
    const int64_t t = ids.size(1);
    STRATA_CHECK(t > 0 && cache.position + t <= positions_)
        << label(*this) << " has " << positions_ << " positions; positions " << cache.position
        << ".." << cache.position + t - 1 << " are past them";
    return {ops::add(ctx, ops::embedding_forward(ctx, ids, param(0)),
                     param(1).narrow(0, cache.position, t))};
  }

  TensorList backward(ExecContext& ctx, const TensorList& grad_outputs, LayerTape& tape) override {
    const Tensor de = dropout_grad(ctx, first_grad(*this, grad_outputs), tape.at(1), dropout_);
    const Tensor& ids = tape.at(0);
    const int64_t t = ids.size(1);
    ops::embedding_backward(ctx, de, ids, grad(0).narrow(0, 0, vocab_));
    ops::add_(ctx, grad(1).narrow(0, 0, t), ops::sum_to_shape(ctx, de, {t, width_}));
    return {Tensor()};  // token ids have no gradient
  }

 private:
  void check_length(int64_t t) const {
    STRATA_CHECK(t > 0 && t <= positions_) << label(*this) << ": sequence length " << t
                                           << " must be in [1, max_positions " << positions_ << "]";
  }

  int64_t vocab_, width_, positions_;
  double dropout_;
  int64_t padded_ = 0;
};

// ---- BERT embeddings ---------------------------------------------------------------------------

class BertEmbedding final : public Layer {
 public:
  BertEmbedding(std::string name, const proto::BertEmbeddingSpec& spec)
      : Layer(std::move(name)),
        vocab_(spec.vocab_size()),
        width_(spec.width()),
        positions_(spec.max_positions()),
        type_vocab_(spec.type_vocab_size()),
        dropout_(spec.dropout()),
        eps_(spec.eps()) {
    STRATA_CHECK(vocab_ > 0 && width_ > 0 && positions_ > 0 && type_vocab_ > 0)
        << "layer " << this->name()
        << ": bert_embedding needs vocab_size, width, max_positions and type_vocab_size (> 0), "
           "got "
        << vocab_ << ", " << width_ << ", " << positions_ << ", " << type_vocab_;
    STRATA_CHECK_GT(eps_, 0.0) << "layer " << this->name() << ": eps";
    check_probability(this->name(), "dropout", dropout_);
    padded_ = padded_vocab(this->name(), vocab_, spec.padded_vocab_size());
  }

  const char* type() const override { return "bert_embedding"; }

  std::vector<ParamSpec> param_specs() const override {
    std::vector<ParamSpec> specs{
        embedding_table("word_embeddings.weight", vocab_, padded_, width_),
        normal_weight("position_embeddings.weight", {positions_, width_}),
        normal_weight("token_type_embeddings.weight", {type_vocab_, width_})};
    add_norm(&specs, "LayerNorm", width_);
    return specs;
  }

  TensorSpecs output_specs(const TensorSpecs& inputs) const override {
    STRATA_CHECK(inputs.size() == 1 && inputs[0].shape.size() == 2 && inputs[0].shape[0] == 3 &&
                 inputs[0].dtype == DType::kI32)
        << label(*this) << " takes i32 (3, T) (ids, token types, attention mask), got "
        << specs_str(inputs);
    const int64_t t = inputs[0].shape[1];
    check_length(t);
    return {TensorSpec{{t, width_}, DType::kF32}, TensorSpec{{t}, DType::kI32}};
  }

  TensorList forward(ExecContext& ctx, const TensorList& inputs, LayerTape& tape) override {
    const Tensor& x = single_input(inputs);
    STRATA_CHECK(x.dim() == 3 && x.size(1) == 3 && x.dtype() == DType::kI32)
        << label(*this) << " expects i32 (B, 3, T) (ids, token types, attention mask), got "
        << x.str() << " " << x.shape_str();
    const int64_t b = x.size(0), t = x.size(2);
    check_length(t);
    const TensorList rows = ops::split(ctx, x, {1, 1, 1}, 1);
    const Tensor ids = rows[0].view({b, t});
    const Tensor types = rows[1].view({b, t});
    const Tensor mask = rows[2].view({b, t});
    const Tensor e =
        ops::add(ctx,
                 ops::add(ctx, ops::embedding_forward(ctx, ids, param(kWord).narrow(0, 0, vocab_)),
                          param(kPosition).narrow(0, 0, t)),
                 ops::embedding_forward(ctx, types, param(kTokenType)));  // (B, T, C)
    ops::LayerNormResult n =
        ops::layer_norm_forward(ctx, e, param(kNormWeight), param(kNormBias), eps_);
    const Dropped out = dropout(ctx, n.y, dropout_, tape, 0);
    tape.save(ids);       // 0: token ids (B, T)
    tape.save(types);     // 1: token types (B, T)
    tape.save(e);         // 2: the sum of the embeddings, the layer norm's input
    tape.save(n.mean);    // 3
    tape.save(n.rstd);    // 4
    tape.save(out.mask);  // 5: dropout mask (undefined when off)
    return {out.y, mask};
  }

  TensorList backward(ExecContext& ctx, const TensorList& grad_outputs, LayerTape& tape) override {
    const Tensor dn = dropout_grad(ctx, first_grad(*this, grad_outputs), tape.at(5), dropout_);
    const Tensor de = ops::layer_norm_backward(ctx, dn, tape.at(2), param(kNormWeight), tape.at(3),
                                               tape.at(4), grad(kNormWeight), grad(kNormBias));
    const int64_t t = de.size(1);
    ops::embedding_backward(ctx, de, tape.at(0), grad(kWord).narrow(0, 0, vocab_));
    ops::embedding_backward(ctx, de, tape.at(1), grad(kTokenType));
    ops::add_(ctx, grad(kPosition).narrow(0, 0, t), ops::sum_to_shape(ctx, de, {t, width_}));
    return {Tensor()};  // ids, types and mask have no gradient
  }

 private:
  enum ParamIndex : size_t { kWord, kPosition, kTokenType, kNormWeight, kNormBias };

  void check_length(int64_t t) const {
    STRATA_CHECK(t > 0 && t <= positions_) << label(*this) << ": sequence length " << t
                                           << " must be in [1, max_positions " << positions_ << "]";
  }

  int64_t vocab_, width_, positions_, type_vocab_;
  double dropout_, eps_;
  int64_t padded_ = 0;
};

// ---- heads -------------------------------------------------------------------------------------

// GPT-2's head: logits = ln_f(h) W^T with W (V, C), usually the token embedding.
class LmHead final : public Layer, public CachedLayer {
 public:
  LmHead(std::string name, int64_t width, const proto::LmHeadSpec& spec)
      : Layer(std::move(name)),
        vocab_(spec.vocab_size()),
        width_(width),
        eps_(spec.eps()),
        tied_to_(spec.tied_to()) {
    STRATA_CHECK(vocab_ > 0 && width_ > 0)
        << "layer " << this->name() << ": lm_head needs vocab_size (> 0) and a width, got "
        << vocab_ << " and " << width_;
    STRATA_CHECK_GT(eps_, 0.0) << "layer " << this->name() << ": eps";
    check_tied_to(this->name(), tied_to_);
    padded_ = padded_vocab(this->name(), vocab_, spec.padded_vocab_size());
  }

  const char* type() const override { return "lm_head"; }

  std::vector<ParamSpec> param_specs() const override {
    std::vector<ParamSpec> specs;
    add_norm(&specs, "ln_f", width_);
    specs.push_back(head_weight("weight", vocab_, padded_, width_, tied_to_));
    return specs;
  }

  TensorSpecs output_specs(const TensorSpecs& inputs) const override {
    check_hidden_specs(*this, inputs, width_);
    return {TensorSpec{{inputs[0].shape[0], padded_}, inputs[0].dtype}};
  }

  TensorList forward(ExecContext& ctx, const TensorList& inputs, LayerTape& tape) override {
    check_hidden(*this, inputs, width_);
    const Tensor& x = inputs[0];
    ops::LayerNormResult n = ops::layer_norm_forward(ctx, x, param(0), param(1), eps_);
    tape.save(x);                                                 // 0
    tape.save(n.mean);                                            // 1
    tape.save(n.rstd);                                            // 2
    tape.save(n.y);                                               // 3: ln_f's output
    tape.save(inputs.size() == 2 ? inputs[1] : Tensor());         // 4: the mask, if given
    return {vocab_logits(ctx, n.y, param(2), Tensor(), vocab_)};  // (B, T, Vp)
  }

  // Position-wise: the forward of the new positions.
  TensorList forward_cached(ExecContext& ctx, const TensorList& inputs, LayerCache&) override {
    LayerTape tape;
    tape.training = false;
    return forward(ctx, inputs, tape);
  }

  TensorList backward(ExecContext& ctx, const TensorList& grad_outputs, LayerTape& tape) override {
    const Tensor dn = vocab_logits_backward(ctx, first_grad(*this, grad_outputs), tape.at(3),
                                            param(2), grad(2), Tensor(), vocab_);
    const Tensor dx = ops::layer_norm_backward(ctx, dn, tape.at(0), param(0), tape.at(1),
                                               tape.at(2), grad(0), grad(1));
    if (tape.at(4).defined()) return {dx, Tensor()};
    return {dx};
  }

  double forward_flops(const TensorSpecs& inputs) const override {
    return 2.0 * static_cast<double>(inputs.at(0).shape.at(0) * width_ * padded_);
  }
  int64_t logit_classes() const override { return padded_ != vocab_ ? vocab_ : 0; }

 private:
  int64_t vocab_, width_;
  double eps_;
  std::string tied_to_;
  int64_t padded_ = 0;
};

// BERT's masked-language-model head: logits = LayerNorm(gelu(dense(h))) W^T + bias.
class MlmHead final : public Layer {
 public:
  MlmHead(std::string name, int64_t width, const proto::MlmHeadSpec& spec)
      : Layer(std::move(name)),
        vocab_(spec.vocab_size()),
        width_(width),
        eps_(spec.eps()),
        tied_to_(spec.tied_to()) {
    STRATA_CHECK(vocab_ > 0 && width_ > 0)
        << "layer " << this->name() << ": mlm_head needs vocab_size (> 0) and a width, got "
        << vocab_ << " and " << width_;
    STRATA_CHECK_GT(eps_, 0.0) << "layer " << this->name() << ": eps";
    check_tied_to(this->name(), tied_to_);
    padded_ = padded_vocab(this->name(), vocab_, spec.padded_vocab_size());
  }

  const char* type() const override { return "mlm_head"; }

  std::vector<ParamSpec> param_specs() const override {
    std::vector<ParamSpec> specs{normal_weight("transform.dense.weight", {width_, width_}),
                                 zero_bias("transform.dense.bias", width_)};
    add_norm(&specs, "transform.LayerNorm", width_);
    specs.push_back(head_weight("decoder.weight", vocab_, padded_, width_, tied_to_));
    specs.push_back(zero_bias("bias", padded_));
    if (padded_ != vocab_) specs.back().valid_rows = vocab_;
    return specs;
  }

  TensorSpecs output_specs(const TensorSpecs& inputs) const override {
    check_hidden_specs(*this, inputs, width_);
    return {TensorSpec{{inputs[0].shape[0], padded_}, inputs[0].dtype}};
  }

  TensorList forward(ExecContext& ctx, const TensorList& inputs, LayerTape& tape) override {
    check_hidden(*this, inputs, width_);
    const Tensor& x = inputs[0];
    const Tensor d = ops::linear_forward(ctx, x, param(kDenseWeight), param(kDenseBias));
    const Tensor g = ops::gelu_forward(ctx, d);
    ops::LayerNormResult n =
        ops::layer_norm_forward(ctx, g, param(kNormWeight), param(kNormBias), eps_);
    tape.save(x);                                          // 0: the dense layer's input
    tape.save(d);                                          // 1: GELU's input
    tape.save(g);                                          // 2: the layer norm's input
    tape.save(n.mean);                                     // 3
    tape.save(n.rstd);                                     // 4
    tape.save(n.y);                                        // 5: the decoder's input
    tape.save(inputs.size() == 2 ? inputs[1] : Tensor());  // 6: the mask, if given
    return {vocab_logits(ctx, n.y, param(kDecoderWeight), param(kDecoderBias), vocab_)};
  }

  TensorList backward(ExecContext& ctx, const TensorList& grad_outputs, LayerTape& tape) override {
    const Tensor dn = vocab_logits_backward(ctx, first_grad(*this, grad_outputs), tape.at(5),
                                            param(kDecoderWeight), grad(kDecoderWeight),
                                            grad(kDecoderBias), vocab_);
    const Tensor dg = ops::layer_norm_backward(ctx, dn, tape.at(2), param(kNormWeight), tape.at(3),
                                               tape.at(4), grad(kNormWeight), grad(kNormBias));
    const Tensor dd = ops::gelu_backward(ctx, dg, tape.at(1));
    const Tensor dx = ops::linear_backward(ctx, dd, tape.at(0), param(kDenseWeight),
                                           grad(kDenseWeight), grad(kDenseBias));
    if (tape.at(6).defined()) return {dx, Tensor()};
    return {dx};
  }

  double forward_flops(const TensorSpecs& inputs) const override {
    const double t = static_cast<double>(inputs.at(0).shape.at(0));
    return 2.0 * t * static_cast<double>(width_) * static_cast<double>(width_ + padded_);
  }
  int64_t logit_classes() const override { return padded_ != vocab_ ? vocab_ : 0; }

 private:
  enum ParamIndex : size_t {
    kDenseWeight,
    kDenseBias,
    kNormWeight,
    kNormBias,
    kDecoderWeight,
    kDecoderBias,
  };

  int64_t vocab_, width_;
  double eps_;
  std::string tied_to_;
  int64_t padded_ = 0;
};

}  // namespace

std::unique_ptr<Layer> make_token_embedding(const std::string& name, const TensorSpecs& inputs,
                                            const proto::TokenEmbeddingSpec& spec) {
  return std::make_unique<TokenEmbedding>(name, spec);
}

std::unique_ptr<Layer> make_bert_embedding(const std::string& name, const TensorSpecs& inputs,
                                           const proto::BertEmbeddingSpec& spec) {
  return std::make_unique<BertEmbedding>(name, spec);
}

std::unique_ptr<Layer> make_lm_head(const std::string& name, const TensorSpecs& inputs,
                                    const proto::LmHeadSpec& spec) {
  return std::make_unique<LmHead>(name, hidden_width(name, "lm_head", inputs), spec);
}

std::unique_ptr<Layer> make_mlm_head(const std::string& name, const TensorSpecs& inputs,
                                     const proto::MlmHeadSpec& spec) {
  return std::make_unique<MlmHead>(name, hidden_width(name, "mlm_head", inputs), spec);
}

}  // namespace strata::graph
