// Transformer layers for GPT-2 and BERT, each composed from the ops (linear, attention, layer
// norm, GELU, dropout, embedding, permute/concat, broadcasting add) with its own backward.
//
// Block (hidden (B, T, C), optional key padding mask (B, T)):
//   pre-norm (GPT-2):  x2 = x + attn(ln_1(x));          y = x2 + mlp(ln_2(x2))
//   post-norm (BERT):  x2 = ln_1(x + attn(x));          y = ln_2(x2 + mlp(x2))
//   attn(h) = drop_r(c_proj(drop_a(merge(attention(split(c_attn(h)))))))
//   mlp(h)  = drop_r(c_proj(gelu(c_fc(h))))      c_fc and gelu fused (ops::linear_gelu_forward)
// c_attn is one fused linear C -> 3C whose output (B, T, 3C) reads as (B, T, 3, H, D): q, k, v
// are permuted copies (B, H, T, D) of its three slices, and backward concatenates their gradients
// back into that layout. The attention op keeps no dropout of its own, so the attention dropout
// drop_a acts on the attention output (the merged heads, before c_proj), not on the attention
// probabilities as in Hugging Face's GPT-2 and BERT; at p = 0 (and in evaluation) they agree.
// GELU is the tanh form for both models (BERT's reference uses the erf form; the two differ by
// under 1e-3 in value).
//
// Saved state: every tensor a backward reads is on the LayerTape, in fixed slots (an enum per
// layer; a slot a mode does not use stays undefined, e.g. dropout masks in evaluation), so swap
// and recompute see everything. The attention op's probabilities (B, H, T, T) are the largest
// (on the CPU; the fused CUDA kernel keeps only the log-sum-exp per query instead).
//
// Randomness: dropout k of a layer (k < 16) draws from Philox stream
//   kSubStreamBase + 16 * layer_stream + k
// with the layer's seed, step and sample offset, so every dropout inside a layer has its own
// masks, masks stay independent of the micro-batch split (ops/dropout.h), and the streams never
// meet those of one-op layers, which are the layer indices themselves (< 2^32).
//
// Initialization follows GPT-2 and BERT: linear weights and embeddings normal(0.02) (GPT-2's
// position embedding normal(0.01)), biases 0, layer norms 1 and 0. GPT-2 scales its residual
// projections (the two c_proj) to normal(0.02 / sqrt(2 L)); a block does not know L, so here they
// are normal(0.02) like the other linears. Biases and layer-norm parameters are not decayed.
//
// Parameter names follow Hugging Face's where they map one to one: GPT-2's ln_1, attn.c_attn,
// attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj (BERT's blocks use the same names; a converter maps
// them to BERT's query/key/value/...), BERT's word_embeddings, position_embeddings,
// token_type_embeddings, LayerNorm. Linear weights are (out, in): c_attn.weight is (3C, C), the
// transpose of GPT-2's Conv1D (C, 3C).
//
// Padded vocabulary (padded_vocab_size > vocab_size, set by the gpt2 and bert builders to the
// next multiple of 128, llm.c's Vp): the token embedding and the head's weight (and bias) have
// Vp rows, of which rows V.. are padding (ParamSpec::valid_rows: zero, never exported, not
// counted). The embeddings look up and accumulate into the first V rows only; a head's logits
// are (..., Vp) with -inf on the padding (ops/linear_padded.h: bit for bit the unpadded logits on
// the CPU, the whole tile-friendly product on CUDA), and the loss leaves the padding out
// (CrossEntropyOptions::num_classes = V). So an unpadded model and a padded one train alike.
//
// Tied output weights: a head's weight names the embedding it is (ParamSpec::tied_to). In one
// ParamStore it is a view of the embedding's storage, so the embedding's scatter-add and the
// head's linear backward both accumulate into one gradient; across stores it is a copy
// initialized like the owner (the same normal(0.02)).
#include "graph/transformer.h"

#include "engine/check.h"
#include "graph/decoding.h"
#include "ops/activation.h"
#include "ops/attention.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/layer_norm.h"
#include "ops/linear_padded.h"
#include "ops/matmul.h"
#include "ops/shape_ops.h"

namespace strata::graph {
namespace {

constexpr uint64_t kSubStreamBase = uint64_t{1} << 32;
constexpr double kInitStd = 0.02;
constexpr double kPositionInitStd = 0.01;  // GPT-2's wpe

std::string label(const Layer& layer) {
  return "layer " + layer.name() + " (" + layer.type() + ")";
}

// ---- parameter specs ---------------------------------------------------------------------------

ParamSpec normal_weight(const std::string& name, const Shape& shape, double std = kInitStd) {
  return {name, shape, ParamInit::normal(std), true, ""};
}
ParamSpec zero_bias(const std::string& name, int64_t n) {
  return {name, {n}, ParamInit::zeros(), false, ""};
}
// A layer norm's scale and shift: "<prefix>.weight", "<prefix>.bias".
void add_norm(std::vector<ParamSpec>* specs, const std::string& prefix, int64_t channels) {
  specs->push_back({prefix + ".weight", {channels}, ParamInit::ones(), false, ""});
  specs->push_back({prefix + ".bias", {channels}, ParamInit::zeros(), false, ""});
}
// tied_to must name the owner in full ("embed.wte.weight"): a ParamStore that finds no parameter
// of that name treats the owner as another store's and keeps a copy, so a short name ("embed.wte")
// would silently untie the weights.
void check_tied_to(const std::string& layer, const std::string& tied_to) {
  const std::string suffix = ".weight";
  STRATA_CHECK(tied_to.empty() ||
               (tied_to.size() > suffix.size() &&
                tied_to.compare(tied_to.size() - suffix.size(), suffix.size(), suffix) == 0))
      << "layer " << layer << ": tied_to '" << tied_to
      << "' must name the embedding's parameter in full (layer.param, e.g. embed.wte.weight)";
}
// The output projection (vocab, C) of a head: tied to `tied_to` when not empty. Its own
// initialization equals the embeddings', so an untied weight and a tied copy start alike.
ParamSpec head_weight(const std::string& name, int64_t vocab, int64_t padded, int64_t width,
                      const std::string& tied_to) {
  ParamSpec spec = normal_weight(name, {padded, width});
  spec.tied_to = tied_to;
  if (padded != vocab) spec.valid_rows = vocab;
  return spec;
}

// The padded vocabulary of a spec: padded_vocab_size when set (it must not be smaller), else V.
int64_t padded_vocab(const std::string& layer, int64_t vocab, int64_t padded) {
  if (padded == 0) return vocab;
  STRATA_CHECK(padded >= vocab) << "layer " << layer << ": padded_vocab_size " << padded
                                << " is smaller than vocab_size " << vocab;
  return padded;
}

// The embedding table's spec, (Vp, C) with the padding rows marked.
ParamSpec embedding_table(const std::string& name, int64_t vocab, int64_t padded, int64_t width) {
  ParamSpec spec = normal_weight(name, {padded, width});
  if (padded != vocab) spec.valid_rows = vocab;
  return spec;
}

// Logits over the (padded) vocabulary and their backward: the plain linear layer without padding.
Tensor vocab_logits(ExecContext& ctx, const Tensor& h, const Tensor& weight, const Tensor& bias,
                    int64_t vocab) {
  if (weight.size(0) == vocab) return ops::linear_forward(ctx, h, weight, bias);
  return ops::linear_padded_forward(ctx, h, weight, bias, vocab);
}
Tensor vocab_logits_backward(ExecContext& ctx, const Tensor& dlogits, const Tensor& h,
                             const Tensor& weight, const Tensor& dweight, const Tensor& dbias,
                             int64_t vocab) {
  if (weight.size(0) == vocab) {
    return ops::linear_backward(ctx, dlogits, h, weight, dweight, dbias);
  }
  return ops::linear_padded_backward(ctx, dlogits, h, weight, dweight, dbias, vocab);
}

// ---- dropout with sub-streams -----------------------------------------------------------------

RngOffsets sub_stream(const RngOffsets& rng, uint64_t k) {
  RngOffsets r = rng;
  r.stream = kSubStreamBase + 16 * rng.stream + k;
  return r;
}

struct Dropped {
  Tensor y;
  Tensor mask;  // undefined when the dropout is the identity
};

// The identity in evaluation and for p == 0; else inverted dropout on sub-stream k.
Dropped dropout(ExecContext& ctx, const Tensor& x, double p, const LayerTape& tape, uint64_t k) {
  if (!tape.training || p == 0.0) return {x, Tensor()};
  ops::DropoutResult r = ops::dropout_forward(ctx, x, p, sub_stream(tape.rng, k));
  return {r.y, r.mask};
}

Tensor dropout_grad(ExecContext& ctx, const Tensor& dy, const Tensor& mask, double p) {
  return mask.defined() ? ops::dropout_backward(ctx, dy, mask, p) : dy;
}

void check_probability(const std::string& layer, const char* what, double p) {
  STRATA_CHECK(p >= 0.0 && p < 1.0)
      << "layer " << layer << ": " << what << " must be in [0, 1), got " << p;
}

// ---- input checks ------------------------------------------------------------------------------

// A hidden-state spec (T, C) of a float dtype, and an optional key padding mask (T,) of an
// integer dtype, as blocks and heads take them.
void check_hidden_specs(const Layer& layer, const TensorSpecs& inputs, int64_t width) {
  STRATA_CHECK(inputs.size() == 1 || inputs.size() == 2)
      << label(layer) << " takes (hidden) or (hidden, mask), got " << specs_str(inputs);
  const TensorSpec& h = inputs[0];
  STRATA_CHECK(h.shape.size() == 2 && h.shape[1] == width && is_floating(h.dtype))
      << label(layer) << " expects hidden states (T, " << width << ") of a float dtype, got "
      << specs_str({h});
  if (inputs.size() == 2) {
    const TensorSpec& m = inputs[1];
    STRATA_CHECK(m.shape == Shape{h.shape[0]} && !is_floating(m.dtype))
        << label(layer) << " expects a key padding mask (" << h.shape[0]
        << ",) of an integer dtype beside the hidden states, got " << specs_str({m});
  }
}

// The batch forms: hidden (B, T, C) and, when given, mask (B, T).
void check_hidden(const Layer& layer, const TensorList& inputs, int64_t width) {
  STRATA_CHECK((inputs.size() == 1 || inputs.size() == 2) && inputs[0].defined())
      << label(layer) << " takes (hidden) or (hidden, mask), got " << inputs.size() << " inputs";
  const Tensor& x = inputs[0];
  STRATA_CHECK(x.dim() == 3 && x.size(2) == width)
      << label(layer) << " expects hidden states (B, T, " << width << "), got " << x.shape_str();
  if (inputs.size() == 2) {
    STRATA_CHECK(inputs[1].defined() && inputs[1].shape() == (Shape{x.size(0), x.size(1)}))
        << label(layer) << " expects a key padding mask (B, T) = (" << x.size(0) << ", "
        << x.size(1) << "), got " << (inputs[1].defined() ? inputs[1].shape_str() : "none");
  }
}

const Tensor& first_grad(const Layer& layer, const TensorList& grads) {
  STRATA_CHECK(!grads.empty() && grads[0].defined())
      << label(layer) << " backward needs the gradient of its first output";
  return grads[0];
}

// ---- transformer block -------------------------------------------------------------------------

class TransformerBlock final : public Layer, public CachedLayer {
 public:
  TransformerBlock(std::string name, int64_t width, const proto::TransformerBlockSpec& spec)
      : Layer(std::move(name)),
        width_(width),
        heads_(spec.heads()),
        mlp_hidden_(spec.has_mlp_hidden() ? spec.mlp_hidden() : 4 * width),
        dropout_(spec.dropout()),
        attention_dropout_(spec.attention_dropout()),
        eps_(spec.eps()),
        pre_norm_(spec.pre_norm()),
        causal_(spec.causal()) {
    STRATA_CHECK(heads_ > 0 && width_ > 0 && width_ % heads_ == 0)
        << "layer " << this->name() << ": width " << width_
        << " must be a positive multiple of transformer_block.heads (" << heads_ << ")";
    STRATA_CHECK_GT(mlp_hidden_, 0) << "layer " << this->name() << ": mlp_hidden";
    STRATA_CHECK_GT(eps_, 0.0) << "layer " << this->name() << ": eps";
    check_probability(this->name(), "dropout", dropout_);
    check_probability(this->name(), "attention_dropout", attention_dropout_);
  }

  const char* type() const override { return "transformer_block"; }

  std::vector<ParamSpec> param_specs() const override {
    const int64_t c = width_;
    std::vector<ParamSpec> specs;
    add_norm(&specs, "ln_1", c);
    specs.push_back(normal_weight("attn.c_attn.weight", {3 * c, c}));
    specs.push_back(zero_bias("attn.c_attn.bias", 3 * c));
    specs.push_back(normal_weight("attn.c_proj.weight", {c, c}));
    specs.push_back(zero_bias("attn.c_proj.bias", c));
    add_norm(&specs, "ln_2", c);
    specs.push_back(normal_weight("mlp.c_fc.weight", {mlp_hidden_, c}));
    specs.push_back(zero_bias("mlp.c_fc.bias", mlp_hidden_));
    specs.push_back(normal_weight("mlp.c_proj.weight", {c, mlp_hidden_}));
    specs.push_back(zero_bias("mlp.c_proj.bias", c));
    return specs;
  }

  TensorSpecs output_specs(const TensorSpecs& inputs) const override {
    check_hidden_specs(*this, inputs, width_);
    return inputs;
  }

  TensorList forward(ExecContext& ctx, const TensorList& inputs, LayerTape& tape) override {
    check_hidden(*this, inputs, width_);
    const Tensor& x = inputs[0];
    const Tensor mask = inputs.size() == 2 ? inputs[1] : Tensor();
    tape.saved.assign(kNumSaved, Tensor());
    Tensor y;
    if (pre_norm_) {
      const Tensor x2 = ops::add(ctx, x, attention(ctx, norm(ctx, x, 0, tape), mask, tape));
      y = ops::add(ctx, x2, mlp(ctx, norm(ctx, x2, 1, tape), tape));
    } else {
      const Tensor x2 = norm(ctx, ops::add(ctx, x, attention(ctx, x, mask, tape)), 0, tape);
      y = norm(ctx, ops::add(ctx, x2, mlp(ctx, x2, tape)), 1, tape);
    }
    if (!mask.defined()) return {y};
    return {y, mask};
  }

  // GPT-2's block on new positions (graph/decoding.h): the pre-norm forward with the attention
  // over the cached keys and values, in evaluation mode.
  TensorList forward_cached(ExecContext& ctx, const TensorList& inputs,
                            LayerCache& cache) override {
    check_hidden(*this, inputs, width_);
    STRATA_CHECK(pre_norm_ && causal_ && inputs.size() == 1)
        << label(*this) << ": decoding token by token needs a causal pre-norm block (GPT-2's) "
        << "without a padding mask";
    LayerTape tape;  // evaluation: no dropout; the saved tensors are dropped with it
    tape.training = false;
    tape.saved.assign(kNumSaved, Tensor());
    const Tensor& x = inputs[0];
    Tensor q, k, v;
    project_qkv(ctx, norm(ctx, x, 0, tape), &q, &k, &v);
    const Tensor a = ops::linear_forward(ctx, merge_heads(ctx, attend_cached(ctx, q, k, v, cache)),
                                         param(kAttnProjWeight), param(kAttnProjBias));
    const Tensor x2 = ops::add(ctx, x, a);
    return {ops::add(ctx, x2, mlp(ctx, norm(ctx, x2, 1, tape), tape))};
  }

  TensorList backward(ExecContext& ctx, const TensorList& grad_outputs, LayerTape& tape) override {
    STRATA_CHECK_EQ(tape.saved.size(), static_cast<size_t>(kNumSaved))
        << label(*this) << ": backward without its forward's tape";
    const Tensor& dy = first_grad(*this, grad_outputs);
    Tensor dx;
    if (pre_norm_) {
      const Tensor dx2 =
          ops::add(ctx, dy, norm_backward(ctx, mlp_backward(ctx, dy, tape), 1, tape));
      dx = ops::add(ctx, dx2, norm_backward(ctx, attention_backward(ctx, dx2, tape), 0, tape));
    } else {
      const Tensor ds2 = norm_backward(ctx, dy, 1, tape);
      const Tensor dx2 = ops::add(ctx, ds2, mlp_backward(ctx, ds2, tape));
      const Tensor ds1 = norm_backward(ctx, dx2, 0, tape);
      dx = ops::add(ctx, ds1, attention_backward(ctx, ds1, tape));
    }
    TensorList grads(grad_outputs.size());  // the mask, when there is one, gets no gradient
    grads[0] = dx;
    return grads;
  }

  double forward_flops(const TensorSpecs& inputs) const override {
    const double t = static_cast<double>(inputs.at(0).shape.at(0));
    const double c = static_cast<double>(width_);
    const double linears = 2.0 * t * c * (3 * c + c + 2 * static_cast<double>(mlp_hidden_));
    return linears + 4.0 * t * t * c;  // scores and probs @ v, over every (query, key) pair
  }

 private:
  enum ParamIndex : size_t {
    kLn1Weight,
    kLn1Bias,
    kQkvWeight,
    kQkvBias,
    kAttnProjWeight,
    kAttnProjBias,
    kLn2Weight,
    kLn2Bias,
    kFcWeight,
    kFcBias,
    kMlpProjWeight,
    kMlpProjBias,
  };
  // Tape slots. Layer norm i saves its input, mean and 1/std at kLn1In + 3 i (pre-norm: x and
  // x2; post-norm: the residual sums). The sublayers save their inputs (pre-norm: the norms'
  // outputs; post-norm: x and x2).
  enum Saved : size_t {
    kLn1In,
    kLn1Mean,
    kLn1Rstd,
    kLn2In,
    kLn2Mean,
    kLn2Rstd,
    kAttnIn,        // (B, T, C) input of c_attn
    kQ,             // (B, H, T, D)
    kK,             // (B, H, T, D)
    kV,             // (B, H, T, D)
    kAttnOut,       // (B, H, T, D) the attention op's output
    kProbs,         // (B, H, T, T) on the CPU; undefined from the fused CUDA kernel
    kLse,           // (B, H, T) log-sum-exp per query
    kAttnMask,      // (B, T) key padding mask (a view of the input), or undefined
    kAttnDropMask,  // (B, T, C) u8 on the merged heads
    kMerged,        // (B, T, C) input of attn.c_proj (after the attention dropout)
    kAttnOutMask,   // (B, T, C) u8 on attn.c_proj's output
    kMlpIn,         // (B, T, C) input of c_fc
    kFcOut,         // (B, T, mlp_hidden) input of GELU
    kGeluOut,       // (B, T, mlp_hidden) input of mlp.c_proj
    kMlpOutMask,    // (B, T, C) u8 on mlp.c_proj's output
    kNumSaved,
  };
  // Dropout sub-streams.
  enum Stream : uint64_t { kAttnDropStream, kAttnOutStream, kMlpOutStream };

  int64_t head_dim() const { return width_ / heads_; }
  // The weight of layer norm i (its bias follows).
  static size_t norm_param(size_t i) { return i == 0 ? kLn1Weight : kLn2Weight; }
  ops::AttentionOptions attention_options() const {
    ops::AttentionOptions o;
    o.causal = causal_;
    return o;
  }

  Tensor norm(ExecContext& ctx, const Tensor& x, size_t i, LayerTape& tape) const {
    ops::LayerNormResult r =
        ops::layer_norm_forward(ctx, x, param(norm_param(i)), param(norm_param(i) + 1), eps_);
    tape.saved[kLn1In + 3 * i] = x;
    tape.saved[kLn1Mean + 3 * i] = r.mean;
    tape.saved[kLn1Rstd + 3 * i] = r.rstd;
    return r.y;
  }

  Tensor norm_backward(ExecContext& ctx, const Tensor& dy, size_t i, const LayerTape& tape) const {
    return ops::layer_norm_backward(ctx, dy, tape.at(kLn1In + 3 * i), param(norm_param(i)),
                                    tape.at(kLn1Mean + 3 * i), tape.at(kLn1Rstd + 3 * i),
                                    grad(norm_param(i)), grad(norm_param(i) + 1));
  }

  // (B, H, T, D) <-> (B, T, C).
  Tensor merge_heads(ExecContext& ctx, const Tensor& t) const {
    return ops::permute_copy(ctx, t, {0, 2, 1, 3}).view({t.size(0), t.size(2), width_});
  }
  Tensor split_heads(ExecContext& ctx, const Tensor& t) const {
    return ops::permute_copy(ctx, t.view({t.size(0), t.size(1), heads_, head_dim()}), {0, 2, 1, 3});
  }

  // q, k, v (B, H, T, D) from c_attn(h).
  void project_qkv(ExecContext& ctx, const Tensor& h, Tensor* q, Tensor* k, Tensor* v) const {
    const int64_t b = h.size(0), t = h.size(1);
    const Tensor qkv = ops::linear_forward(ctx, h, param(kQkvWeight), param(kQkvBias));
    const Tensor parts = qkv.view({b, t, 3, heads_, head_dim()});  // (B, T, 3, H, D)
    *q = ops::permute_copy(ctx, parts.select(2, 0), {0, 2, 1, 3});
    *k = ops::permute_copy(ctx, parts.select(2, 1), {0, 2, 1, 3});
    *v = ops::permute_copy(ctx, parts.select(2, 2), {0, 2, 1, 3});
  }

  Tensor attention(ExecContext& ctx, const Tensor& h, const Tensor& mask, LayerTape& tape) const {
    Tensor q, k, v;
    project_qkv(ctx, h, &q, &k, &v);
    ops::AttentionResult r = ops::attention_forward(ctx, q, k, v, mask, attention_options());
    const Dropped merged =
        dropout(ctx, merge_heads(ctx, r.out), attention_dropout_, tape, kAttnDropStream);
    const Tensor a =
        ops::linear_forward(ctx, merged.y, param(kAttnProjWeight), param(kAttnProjBias));
    const Dropped out = dropout(ctx, a, dropout_, tape, kAttnOutStream);
    tape.saved[kAttnIn] = h;
    tape.saved[kQ] = q;
    tape.saved[kK] = k;
    tape.saved[kV] = v;
    tape.saved[kAttnOut] = r.out;
    tape.saved[kProbs] = r.probs;
    tape.saved[kLse] = r.lse;
    tape.saved[kAttnMask] = mask;
    tape.saved[kAttnDropMask] = merged.mask;
    tape.saved[kMerged] = merged.y;
    tape.saved[kAttnOutMask] = out.mask;
    return out.y;
  }

  // The gradient of attention()'s input h; accumulates c_attn's and attn.c_proj's gradients.
  Tensor attention_backward(ExecContext& ctx, const Tensor& dout, const LayerTape& tape) const {
    const Tensor da = dropout_grad(ctx, dout, tape.at(kAttnOutMask), dropout_);
    const Tensor dmerged =
        dropout_grad(ctx,
                     ops::linear_backward(ctx, da, tape.at(kMerged), param(kAttnProjWeight),
                                          grad(kAttnProjWeight), grad(kAttnProjBias)),
                     tape.at(kAttnDropMask), attention_dropout_);
    ops::AttentionResult saved;
    saved.out = tape.at(kAttnOut);
    saved.probs = tape.at(kProbs);
    saved.lse = tape.at(kLse);
    ops::AttentionGrads g =
        ops::attention_backward(ctx, split_heads(ctx, dmerged), tape.at(kQ), tape.at(kK),
                                tape.at(kV), saved, tape.at(kAttnMask), attention_options());
    // (B, T, C) pieces side by side are the (B, T, 3, H, D) layout of c_attn's output.
    const Tensor dqkv = ops::concat(
        ctx, {merge_heads(ctx, g.dq), merge_heads(ctx, g.dk), merge_heads(ctx, g.dv)}, -1);
    return ops::linear_backward(ctx, dqkv, tape.at(kAttnIn), param(kQkvWeight), grad(kQkvWeight),
                                grad(kQkvBias));
  }

  Tensor mlp(ExecContext& ctx, const Tensor& h, LayerTape& tape) const {
    // c_fc and GELU in one op (on CUDA one cuBLASLt product with the GELU_AUX_BIAS epilogue,
    // which also writes GELU's input for the backward).
    const ops::LinearGeluResult fc =
        ops::linear_gelu_forward(ctx, h, param(kFcWeight), param(kFcBias));
    const Tensor& f = fc.pre;
    const Tensor& g = fc.y;
    const Tensor m = ops::linear_forward(ctx, g, param(kMlpProjWeight), param(kMlpProjBias));
    const Dropped out = dropout(ctx, m, dropout_, tape, kMlpOutStream);
    tape.saved[kMlpIn] = h;
    tape.saved[kFcOut] = f;
    tape.saved[kGeluOut] = g;
    tape.saved[kMlpOutMask] = out.mask;
    return out.y;
  }

  Tensor mlp_backward(ExecContext& ctx, const Tensor& dout, const LayerTape& tape) const {
    const Tensor dm = dropout_grad(ctx, dout, tape.at(kMlpOutMask), dropout_);
    const Tensor dg = ops::linear_backward(ctx, dm, tape.at(kGeluOut), param(kMlpProjWeight),
                                           grad(kMlpProjWeight), grad(kMlpProjBias));
    const Tensor df = ops::gelu_backward(ctx, dg, tape.at(kFcOut));
    return ops::linear_backward(ctx, df, tape.at(kMlpIn), param(kFcWeight), grad(kFcWeight),
                                grad(kFcBias));
  }

  int64_t width_, heads_, mlp_hidden_;
  double dropout_, attention_dropout_, eps_;
  bool pre_norm_, causal_;
};

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

// The width C of the hidden states (T, C) a block or head is built on.
int64_t hidden_width(const std::string& name, const char* type, const TensorSpecs& inputs) {
  STRATA_CHECK(!inputs.empty() && inputs[0].shape.size() == 2)
      << "layer " << name << " (" << type << ") takes hidden states (T, C), got "
      << specs_str(inputs);
  return inputs[0].shape[1];
}

}  // namespace

std::unique_ptr<Layer> make_transformer_block(const std::string& name, const TensorSpecs& inputs,
                                              const proto::TransformerBlockSpec& spec) {
  return std::make_unique<TransformerBlock>(name, hidden_width(name, "transformer_block", inputs),
                                            spec);
}

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
