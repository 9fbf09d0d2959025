// GPT-2 (Radford et al. 2019) as an ordered list of layers: "embed" (token + position embedding),
// "blocks.0" ... "blocks.{L-1}" (pre-norm, causal), "head" (ln_f and the output projection tied
// to embed.wte.weight). With V = 50257 and 1024 positions the parameter counts equal Hugging
// Face's GPT2LMHeadModel (124,439,808 for 124M; the tied projection counted once). Inside the
// engine V is padded to a multiple of dims.vocab_multiple (128: 50257 -> 50304, llm.c's Vp) for
// the GPU; the padding is not counted, not exported, and masked out of the loss
// (graph/transformer.h).
//
// Dimensions: a named size, then ModelDims overrides (layers, width, heads, positions, vocab).
// V is the dataset's vocabulary (request.num_classes) when it has one, else GPT-2's 50257 (256
// for tiny). The sequence length T is the dataset's sample length when given, else the number of
// positions. Dropout 0.1 on the embedding, the attention output and both residual branches, as
// GPT-2's config (embd_pdrop, attn_pdrop, resid_pdrop) at every size.
#include "engine/check.h"
#include "models/families.h"

namespace strata::models {
namespace {

struct Gpt2Dims {
  int64_t layers, width, heads, positions, vocab;
};

constexpr double kDropout = 0.1;
constexpr double kEps = 1e-5;

Gpt2Dims named_dims(const std::string& size) {
  if (size == "124M") return {12, 768, 12, 1024, 50257};
  if (size == "355M") return {24, 1024, 16, 1024, 50257};
  if (size == "774M") return {36, 1280, 20, 1024, 50257};
  if (size == "1558M") return {48, 1600, 25, 1024, 50257};
  if (size == "tiny") return {2, 64, 4, 64, 256};
  STRATA_THROW() << "model gpt2 has no size '" << size
                 << "' (valid: 124M, 355M, 774M, 1558M, tiny)";
}

}  // namespace

proto::ModelSpec gpt2_spec(const ModelRequest& request) {
  Gpt2Dims d = named_dims(request.size);
  const ModelDims& o = request.dims;
  if (request.num_classes > 0) d.vocab = request.num_classes;
  if (o.layers > 0) d.layers = o.layers;
  if (o.width > 0) d.width = o.width;
  if (o.heads > 0) d.heads = o.heads;
  if (o.seq_len > 0) d.positions = o.seq_len;
  if (o.vocab_size > 0) {
    STRATA_CHECK(request.num_classes <= 0 || o.vocab_size >= request.num_classes)
        << "model gpt2: dims.vocab_size " << o.vocab_size << " is smaller than the dataset's "
        << request.num_classes << " tokens";
    d.vocab = o.vocab_size;
  }
  STRATA_CHECK(d.width % d.heads == 0)
      << "model gpt2: width " << d.width << " is not a multiple of heads " << d.heads;
  int64_t seq = d.positions;
  if (!request.input_shape.empty()) {
    STRATA_CHECK_EQ(request.input_shape.size(), 1u)
        << "model gpt2 needs token samples (T,), got " << shape_str(request.input_shape);
    seq = request.input_shape[0];
    STRATA_CHECK(seq > 0 && seq <= d.positions)
        << "model gpt2 " << request.size << " has " << d.positions << " positions; --seq-len "
        << seq << " is longer (use --seq-len " << d.positions << " or less, or a larger --size)";
  }

  proto::ModelSpec spec;
  spec.set_name("gpt2-" + request.size);
  spec.set_num_classes(d.vocab);
  spec.mutable_input()->add_shape(seq);
  spec.mutable_input()->set_dtype("i32");

  proto::LayerSpec* embed = spec.add_layer();
  embed->set_name("embed");
  embed->set_type("token_embedding");
  proto::TokenEmbeddingSpec* e = embed->mutable_token_embedding();
  e->set_vocab_size(d.vocab);
  const int64_t padded = padded_vocab_size(d.vocab, o.vocab_multiple);
  if (padded != d.vocab) e->set_padded_vocab_size(padded);
  e->set_width(d.width);
  e->set_max_positions(d.positions);
  e->set_dropout(kDropout);

  for (int64_t i = 0; i < d.layers; ++i) {
    proto::LayerSpec* block = spec.add_layer();
    block->set_name("blocks." + std::to_string(i));
    block->set_type("transformer_block");
    proto::TransformerBlockSpec* b = block->mutable_transformer_block();
    b->set_heads(d.heads);
    b->set_mlp_hidden(4 * d.width);
    b->set_dropout(kDropout);
    b->set_attention_dropout(kDropout);
    b->set_pre_norm(true);
    b->set_causal(true);
    b->set_eps(kEps);
  }

  proto::LayerSpec* head = spec.add_layer();
  head->set_name("head");
  head->set_type("lm_head");
  head->mutable_lm_head()->set_vocab_size(d.vocab);
  if (padded != d.vocab) head->mutable_lm_head()->set_padded_vocab_size(padded);
  head->mutable_lm_head()->set_tied_to("embed.wte.weight");
  head->mutable_lm_head()->set_eps(kEps);
  return spec;
}

}  // namespace strata::models
