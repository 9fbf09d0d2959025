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
#include "graph/transformer_parts.h"
#include "ops/activation.h"
#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/layer_norm.h"
#include "ops/matmul.h"
#include "ops/shape_ops.h"

namespace strata::graph {
namespace {

using namespace transformer_parts;  // NOLINT(build/namespaces): the layers' own helpers

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

}  // namespace

std::unique_ptr<Layer> make_transformer_block(const std::string& name, const TensorSpecs& inputs,
                                              const proto::TransformerBlockSpec& spec) {
  return std::make_unique<TransformerBlock>(name, hidden_width(name, "transformer_block", inputs),
                                            spec);
}

}  // namespace strata::graph
