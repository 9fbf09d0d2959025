// Transformer layers for GPT-2 and BERT: embeddings, the block, and the output heads.
#pragma once

#include <memory>
#include <string>

#include "graph/layer.h"
#include "io/proto/strata.pb.h"

namespace strata::graph {

// See the messages of the same names in io/proto/strata.proto for shapes and semantics.
std::unique_ptr<Layer> make_transformer_block(const std::string& name, const TensorSpecs& inputs,
                                              const proto::TransformerBlockSpec& spec);
std::unique_ptr<Layer> make_token_embedding(const std::string& name, const TensorSpecs& inputs,
                                            const proto::TokenEmbeddingSpec& spec);
std::unique_ptr<Layer> make_bert_embedding(const std::string& name, const TensorSpecs& inputs,
                                           const proto::BertEmbeddingSpec& spec);
std::unique_ptr<Layer> make_lm_head(const std::string& name, const TensorSpecs& inputs,
                                    const proto::LmHeadSpec& spec);
std::unique_ptr<Layer> make_mlm_head(const std::string& name, const TensorSpecs& inputs,
                                     const proto::MlmHeadSpec& spec);

}  // namespace strata::graph
