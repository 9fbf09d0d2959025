// Model FLOPs of a training step: the count that achieved TFLOP/s and MFU are reported in (the
// work the model needs, not what a particular implementation executes; recomputation and
// framework overheads do not count).
//
// Transformers (any model with transformer_block layers: GPT-2, BERT), per token:
//   6 N + 12 L C T
// the PaLM / llm.c count (Chowdhury et al. 2022, App. B; karpathy/llm.c gpt2_estimate_mfu): 6 N
// for the weight products, forward (2 N) and backward (4 N), and 12 L C T for the attention
// products (QK^T and PV) over the full T x T score matrix, forward and backward. N is ALL
// trainable parameters with a tied parameter counted once, as llm.c does: GPT-2's token embedding
// is also its output projection, so leaving the embeddings out (Kaplan's non-embedding N) would
// miss the LM-head product, 31% of GPT-2 124M's weight FLOPs. llm.c counts the attention term as
// 6 L C T (the causal half); this counts the full 12 L C T for causal models too.
//
// Everything else (CNNs, MLPs), per sample: 3 x the forward FLOPs, the forward counted from the
// shapes of the conv2d and linear products (also those inside resnet_block layers) as 2 x MACs;
// backward is two products of the forward's size (input and weight gradients). Normalization,
// activations and pooling are left out, as in torchvision's GFLOPS column (which counts MACs).
#pragma once

#include <cstdint>
#include <string>

#include "graph/model.h"

namespace strata::models {

struct ParamCounts {
  int64_t total = 0;      // trainable parameters, a tied parameter counted once
  int64_t embedding = 0;  // of those, in token_embedding / bert_embedding layers
};
ParamCounts count_params(const graph::Model& model);

// Forward FLOPs of one sample: conv2d and linear products (2 x MACs), from the layer shapes.
double forward_flops_per_sample(const graph::Model& model);

struct TrainingFlops {
  bool transformer = false;
  int64_t layers = 0;     // transformer blocks L
  int64_t width = 0;      // C
  int64_t seq_len = 0;    // T (tokens per sample)
  ParamCounts params;     // N = params.total
  double per_token = 0;   // transformers: 6 N + 12 L C T; 0 otherwise
  double per_sample = 0;  // per_token x T, or 3 x forward_flops_per_sample
  std::string formula;    // the formula in words, for reports
};
// The model FLOPs of one training step per sample (forward, backward; the optimizer update is
// not counted).
TrainingFlops training_flops(const graph::Model& model);

}  // namespace strata::models
