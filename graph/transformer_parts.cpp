// Helpers shared by the transformer layers (graph/transformer_parts.h).
#include "graph/transformer_parts.h"

#include "engine/check.h"
#include "ops/dropout.h"
#include "ops/linear_padded.h"
#include "ops/matmul.h"

namespace strata::graph::transformer_parts {

std::string label(const Layer& layer) {
  return "layer " + layer.name() + " (" + layer.type() + ")";
}

// ---- parameter specs ---------------------------------------------------------------------------

ParamSpec normal_weight(const std::string& name, const Shape& shape, double std) {
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

// The width C of the hidden states (T, C) a block or head is built on.
int64_t hidden_width(const std::string& name, const char* type, const TensorSpecs& inputs) {
  STRATA_CHECK(!inputs.empty() && inputs[0].shape.size() == 2)
      << "layer " << name << " (" << type << ") takes hidden states (T, C), got "
      << specs_str(inputs);
  return inputs[0].shape[1];
}

}  // namespace strata::graph::transformer_parts
