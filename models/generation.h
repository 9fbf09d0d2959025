// Text generation from a causal language model (GPT-2): the next-token sampler and the loop that
// feeds a graph::Decoder (key/value cache) one sampled token at a time.
//
//   models::SamplingOptions s;  s.temperature = 0.8;  s.top_k = 40;
//   models::generate(ctx, decoder, prompt_ids, 100, s, [&](int32_t id) { print(id); return true;
//   });
//
// Sampling (applied in this order, as Hugging Face's generate does):
//   temperature  logits / T; T == 0 is greedy (the argmax, lowest id on ties)
//   top_k        keep the k most likely tokens (0: all)
//   top_p        keep the most likely tokens whose probabilities sum to at least p (nucleus
//                sampling; 1: all); the most likely token always stays
// then one draw from the renormalized distribution, with a uniform number from Philox keyed by
// (seed, index of the token): a seed gives the same text on every run and device.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "engine/exec_context.h"
#include "graph/decoding.h"

namespace strata::models {

struct SamplingOptions {
  double temperature = 1.0;
  int64_t top_k = 0;
  double top_p = 1.0;
  uint64_t seed = 0;
  // > 0: sample among the first vocab_limit ids only (a vocabulary padded past the tokenizer's).
  int64_t vocab_limit = 0;
};

// Throws naming the flag (--temperature, --top-k, --top-p) when a value is out of range.
void check_sampling(const SamplingOptions& options);

// The token drawn from `logits` (V values) as the token number `index` of a generation.
int32_t sample_token(const float* logits, int64_t vocab, const SamplingOptions& options,
                     int64_t index);

// Decodes `prompt` (at least one token) and then `max_tokens` sampled tokens, one position each,
// calling `on_token` with every new id as soon as it is drawn; it returns false to stop early.
// Batch of one. Returns the generated ids (not the prompt).
std::vector<int32_t> generate(ExecContext& ctx, graph::Decoder& decoder,
                              const std::vector<int32_t>& prompt, int64_t max_tokens,
                              const SamplingOptions& options,
                              const std::function<bool(int32_t)>& on_token);

}  // namespace strata::models
