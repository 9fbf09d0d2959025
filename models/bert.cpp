// BERT (Devlin et al. 2019) with its masked-language-model head, as an ordered list of layers:
// "embeddings" (word + position + token type, LayerNorm), "layers.0" ... "layers.{L-1}"
// (post-norm, bidirectional, key padding mask), "mlm_head" (dense, GELU, LayerNorm, decoder tied
// to embeddings.word_embeddings.weight, own bias). With V = 30522 the parameter counts equal
// Hugging Face's BertForMaskedLM (no pooler): 109,514,298 for base, 335,174,458 for large. V is
// padded inside the engine to a multiple of dims.vocab_multiple (128: 30522 -> 30592), as for
// GPT-2 (graph/transformer.h); the padding is not counted, not exported, masked out of the loss.
//
// Input: i32 (3, T): token ids, token types, attention mask (1 attend, 0 padding). T is the
// dataset's sample length when given, else the number of positions. Dimensions: a named size,
// then ModelDims overrides; the MLP is 4 x width as in every BERT size; V is the dataset's
// vocabulary when it has one, else 30522 (256 for tiny). Dropout 0.1 on the embeddings, the
// attention output and both residual branches (hidden_dropout_prob, attention_probs_dropout_prob).
// The GELU is the tanh form (Hugging Face's BERT uses erf).
#include "engine/check.h"
#include "models/families.h"

namespace strata::models {
namespace {

struct BertDims {
  int64_t layers, width, heads, positions, vocab;
};

constexpr double kDropout = 0.1;
constexpr double kEps = 1e-12;
constexpr int64_t kTypeVocab = 2;

BertDims named_dims(const std::string& size) {
  if (size == "base") return {12, 768, 12, 512, 30522};
  if (size == "large") return {24, 1024, 16, 512, 30522};
  if (size == "tiny") return {2, 64, 4, 64, 256};
  STRATA_THROW() << "model bert has no size '" << size << "' (valid: base, large, tiny)";
}

}  // namespace

proto::ModelSpec bert_spec(const ModelRequest& request) {
  BertDims d = named_dims(request.size);
  const ModelDims& o = request.dims;
  if (request.num_classes > 0) d.vocab = request.num_classes;
  if (o.layers > 0) d.layers = o.layers;
  if (o.width > 0) d.width = o.width;
  if (o.heads > 0) d.heads = o.heads;
  if (o.seq_len > 0) d.positions = o.seq_len;
  if (o.vocab_size > 0) {
    STRATA_CHECK(request.num_classes <= 0 || o.vocab_size >= request.num_classes)
        << "model bert: dims.vocab_size " << o.vocab_size << " is smaller than the dataset's "
        << request.num_classes << " tokens";
    d.vocab = o.vocab_size;
  }
  STRATA_CHECK(d.width % d.heads == 0)
      << "model bert: width " << d.width << " is not a multiple of heads " << d.heads;
  int64_t seq = d.positions;
  if (!request.input_shape.empty()) {
    STRATA_CHECK(request.input_shape.size() == 2u && request.input_shape[0] == 3)
        << "model bert needs samples (3, T) of ids, token types and attention mask, got "
        << shape_str(request.input_shape);
    seq = request.input_shape[1];
    STRATA_CHECK(seq > 0 && seq <= d.positions)
        << "model bert " << request.size << " has " << d.positions << " positions; --seq-len "
        << seq << " is longer (use --seq-len " << d.positions << " or less, or a larger --size)";
  }

  proto::ModelSpec spec;
  spec.set_name("bert-" + request.size);
  spec.set_num_classes(d.vocab);
  spec.mutable_input()->add_shape(3);
  spec.mutable_input()->add_shape(seq);
  spec.mutable_input()->set_dtype("i32");

  proto::LayerSpec* embed = spec.add_layer();
  embed->set_name("embeddings");
  embed->set_type("bert_embedding");
  proto::BertEmbeddingSpec* e = embed->mutable_bert_embedding();
  e->set_vocab_size(d.vocab);
  const int64_t padded = padded_vocab_size(d.vocab, o.vocab_multiple);
  if (padded != d.vocab) e->set_padded_vocab_size(padded);
  e->set_width(d.width);
  e->set_max_positions(d.positions);
  e->set_type_vocab_size(kTypeVocab);
  e->set_dropout(kDropout);
  e->set_eps(kEps);

  for (int64_t i = 0; i < d.layers; ++i) {
    proto::LayerSpec* layer = spec.add_layer();
    layer->set_name("layers." + std::to_string(i));
    layer->set_type("transformer_block");
    proto::TransformerBlockSpec* b = layer->mutable_transformer_block();
    b->set_heads(d.heads);
    b->set_mlp_hidden(4 * d.width);
    b->set_dropout(kDropout);
    b->set_attention_dropout(kDropout);
    b->set_pre_norm(false);
    b->set_causal(false);
    b->set_eps(kEps);
  }

  proto::LayerSpec* head = spec.add_layer();
  head->set_name("mlm_head");
  head->set_type("mlm_head");
  head->mutable_mlm_head()->set_vocab_size(d.vocab);
  if (padded != d.vocab) head->mutable_mlm_head()->set_padded_vocab_size(padded);
  head->mutable_mlm_head()->set_tied_to("embeddings.word_embeddings.weight");
  head->mutable_mlm_head()->set_eps(kEps);
  return spec;
}

}  // namespace strata::models
