// Incremental decoding (see the header). The cache grows by concatenation: appending T positions
// copies the S cached ones into a new contiguous (B, H, S + T, D) tensor, which the attention op
// needs contiguous. That copy is O(S) per token, the same order as the attention read itself; the
// projections and the MLP, which dominate at GPT-2's widths, run on the new positions only.
#include "graph/decoding.h"

#include "engine/check.h"
#include "ops/attention.h"
#include "ops/shape_ops.h"

namespace strata::graph {

Tensor attend_cached(ExecContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                     LayerCache& cache) {
  STRATA_CHECK(q.dim() == 4 && k.shape() == q.shape() && v.shape() == q.shape())
      << "attend_cached: q, k, v must be (B, H, T, D) alike, got " << q.shape_str() << ", "
      << k.shape_str() << ", " << v.shape_str();
  if (cache.key.defined()) {
    STRATA_CHECK(cache.key.size(0) == q.size(0) && cache.key.size(1) == q.size(1) &&
                 cache.key.size(3) == q.size(3))
        << "attend_cached: the cache holds " << cache.key.shape_str() << ", the new positions are "
        << q.shape_str();
    cache.key = ops::concat(ctx, {cache.key, k}, 2);
    cache.value = ops::concat(ctx, {cache.value, v}, 2);
  } else {
    cache.key = k;
    cache.value = v;
  }
  // Causal with S > T keys: query i sees keys up to (S - T) + i, its own position.
  ops::AttentionOptions options;
  options.causal = true;
  return ops::attention_forward(ctx, q, cache.key, cache.value, Tensor(), options).out;
}

Decoder::Decoder(Model& model, size_t begin, size_t end) {
  STRATA_CHECK(begin < end && end <= model.size())
      << "Decoder: layers [" << begin << ", " << end << ") of a model of " << model.size();
  for (size_t i = begin; i < end; ++i) {
    auto* cached = dynamic_cast<CachedLayer*>(&model.layer(i));
    STRATA_CHECK(cached != nullptr)
        << "layer " << model.layer(i).name() << " (" << model.layer(i).type() << ") of model "
        << model.name()
        << " cannot decode token by token (a key/value cache needs GPT-2's layers: "
           "token_embedding, causal pre-norm transformer_block, lm_head)";
    layers_.push_back(cached);
  }
  caches_.resize(layers_.size());
}

TensorList Decoder::forward(ExecContext& ctx, const TensorList& inputs) {
  STRATA_CHECK(!inputs.empty() && inputs[0].defined() && inputs[0].dim() >= 2)
      << "Decoder: the first input must be (B, T, ...), got "
      << (inputs.empty() || !inputs[0].defined() ? std::string("nothing") : inputs[0].shape_str());
  const int64_t t = inputs[0].size(1);
  TensorList x = inputs;
  for (size_t i = 0; i < layers_.size(); ++i) x = layers_[i]->forward_cached(ctx, x, caches_[i]);
  for (LayerCache& c : caches_) c.position += t;
  return x;
}

void Decoder::reset() {
  for (LayerCache& c : caches_) c = LayerCache{};
}

}  // namespace strata::graph
