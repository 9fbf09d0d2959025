// Helpers shared by the transformer layers of graph/transformer.cpp (the block) and
// graph/transformer_ends.cpp (embeddings and heads): parameter specs, the padded vocabulary,
// dropout on a layer's sub-streams, and the checks of their inputs. Internal to graph/.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/tape.h"
#include "engine/tensor.h"
#include "graph/layer.h"

namespace strata::graph::transformer_parts {

inline constexpr uint64_t kSubStreamBase = uint64_t{1} << 32;
inline constexpr double kInitStd = 0.02;
inline constexpr double kPositionInitStd = 0.01;  // GPT-2's wpe

std::string label(const Layer& layer);  // "layer h.0 (transformer_block)"

// ---- parameter specs ----
ParamSpec normal_weight(const std::string& name, const Shape& shape, double std = kInitStd);
ParamSpec zero_bias(const std::string& name, int64_t n);
// A layer norm's scale and shift: "<prefix>.weight", "<prefix>.bias".
void add_norm(std::vector<ParamSpec>* specs, const std::string& prefix, int64_t channels);
// tied_to must name the owner's parameter in full ("embed.wte.weight").
void check_tied_to(const std::string& layer, const std::string& tied_to);
// The output projection (vocab, C) of a head, tied to `tied_to` when not empty.
ParamSpec head_weight(const std::string& name, int64_t vocab, int64_t padded, int64_t width,
                      const std::string& tied_to);
// The padded vocabulary of a spec: padded_vocab_size when set (it must not be smaller), else V.
int64_t padded_vocab(const std::string& layer, int64_t vocab, int64_t padded);
// The embedding table's spec, (Vp, C) with the padding rows marked.
ParamSpec embedding_table(const std::string& name, int64_t vocab, int64_t padded, int64_t width);
// Logits over the (padded) vocabulary and their backward.
Tensor vocab_logits(ExecContext& ctx, const Tensor& h, const Tensor& weight, const Tensor& bias,
                    int64_t vocab);
Tensor vocab_logits_backward(ExecContext& ctx, const Tensor& dlogits, const Tensor& h,
                             const Tensor& weight, const Tensor& dweight, const Tensor& dbias,
                             int64_t vocab);

// ---- dropout with sub-streams ----
RngOffsets sub_stream(const RngOffsets& rng, uint64_t k);
struct Dropped {
  Tensor y;
  Tensor mask;  // undefined when the dropout is the identity
};
// The identity in evaluation and for p == 0; else inverted dropout on sub-stream k.
Dropped dropout(ExecContext& ctx, const Tensor& x, double p, const LayerTape& tape, uint64_t k);
Tensor dropout_grad(ExecContext& ctx, const Tensor& dy, const Tensor& mask, double p);
void check_probability(const std::string& layer, const char* what, double p);

// ---- input checks ----
// A hidden-state spec (T, C) of a float dtype, and an optional key padding mask (T,).
void check_hidden_specs(const Layer& layer, const TensorSpecs& inputs, int64_t width);
// The batch forms: hidden (B, T, C) and, when given, mask (B, T).
void check_hidden(const Layer& layer, const TensorList& inputs, int64_t width);
const Tensor& first_grad(const Layer& layer, const TensorList& grads);
// The width C of the hidden states (T, C) a block or head is built on.
int64_t hidden_width(const std::string& name, const char* type, const TensorSpecs& inputs);

}  // namespace strata::graph::transformer_parts
