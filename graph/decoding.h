// Incremental decoding with a key/value cache (`strata generate`, `strata train --sample-every`).
//
// A causal model's logits at position t depend on positions 0..t only, so generating token t + 1
// needs, besides what was computed for the earlier positions, only the new position's work: each
// attention layer keeps the keys and values of the positions it has seen (its LayerCache) and
// attends the new query to them. Every projection, norm and MLP then costs one position per new
// token instead of the whole prefix; attention itself reads the S cached positions (O(S) per
// token, as it must). Decoding runs in evaluation mode (no dropout) and keeps no tape.
//
//   graph::Decoder decoder(model, 0, model.size());
//   TensorList out = decoder.forward(ctx, {prompt_ids});   // (B, T) -> logits (B, T, V)
//   out = decoder.forward(ctx, {next_ids});                // (B, 1) at position T
//
// The logits of a prefix decoded in any number of calls equal those of one uncached forward of
// the whole sequence (tests/graph/test_decoding.cpp), up to the order of floating-point sums.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/exec_context.h"
#include "engine/tensor.h"
#include "graph/model.h"

namespace strata::graph {

// What one layer keeps between calls.
struct LayerCache {
  int64_t position = 0;  // positions decoded before this call: the first new token's position
  Tensor key, value;     // attention layers: (B, H, position, D), undefined before the first call
};

// A layer that can run on new positions given its cache. Layers that can are GPT-2's
// (token_embedding, causal pre-norm transformer_block, lm_head).
class CachedLayer {
 public:
  virtual ~CachedLayer() = default;
  // The layer's outputs for positions [cache.position, cache.position + T) of `inputs` (their
  // dimension 1 is T); attention layers append the new keys and values to the cache. The
  // position itself is advanced by the Decoder.
  virtual TensorList forward_cached(ExecContext& ctx, const TensorList& inputs,
                                    LayerCache& cache) = 0;
};

// Appends k, v (B, H, T, D) to the cache and attends q (B, H, T, D) causally to every cached
// position: query i (position cache.position + i) sees keys 0 .. cache.position + i.
Tensor attend_cached(ExecContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                     LayerCache& cache);

// Layers [begin, end) of a model run position by position, each with its cache.
class Decoder {
 public:
  // Throws naming the first layer that cannot decode incrementally.
  Decoder(Model& model, size_t begin, size_t end);
  // Runs the new positions through the layers and advances every cache by their count T
  // (dimension 1 of the first input). The embedding throws when the positions pass its
  // max_positions.
  TensorList forward(ExecContext& ctx, const TensorList& inputs);
  int64_t position() const { return caches_.empty() ? 0 : caches_[0].position; }
  // Forgets every cached position.
  void reset();

 private:
  std::vector<CachedLayer*> layers_;
  std::vector<LayerCache> caches_;
};

}  // namespace strata::graph
