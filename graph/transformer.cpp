// PLACEHOLDER: replaced by the real implementation.
#include "graph/transformer.h"
#include "engine/check.h"

namespace strata::graph {
#define STRATA_PLACEHOLDER(fn, spec)                                                           \
  std::unique_ptr<Layer> fn(const std::string& name, const TensorSpecs&, const proto::spec&) { \
    STRATA_THROW() << "layer " << name << ": " #fn " not implemented yet";                     \
  }
STRATA_PLACEHOLDER(make_transformer_block, TransformerBlockSpec)
STRATA_PLACEHOLDER(make_token_embedding, TokenEmbeddingSpec)
STRATA_PLACEHOLDER(make_bert_embedding, BertEmbeddingSpec)
STRATA_PLACEHOLDER(make_lm_head, LmHeadSpec)
STRATA_PLACEHOLDER(make_mlm_head, MlmHeadSpec)
}  // namespace strata::graph
