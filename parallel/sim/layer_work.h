// What one layer of a model costs, from its shapes alone: the work of its forward pass by op class
// (for a device's cost model, cost_model.h) and the memory its tape keeps for backward (for the
// per-stage memory model, memory.h). All figures are per sample of a micro-batch.
//
// Work (forward; backward is counted from it in cost_model.h):
//   matmul     the products of linear, conv2d, resnet_block, the transformer's projections and
//              the LM/MLM heads: Layer::forward_flops less the attention products.
//   attention  transformer_block's scores and probs x v over every (query, key) pair: 4 T^2 C.
//   memory     bytes read and written by the memory-bound kernels (norms, activations, dropout,
//              residual adds, head permutes, embedding gathers, softmax/loss), counted per layer
//              type below; a layer without products moves its inputs and outputs once each.
//
// Memory. A layer's forward leaves three kinds of storage on its tape (LayerTape):
//   own           tensors it allocated and keeps (masks, statistics, intermediate results),
//   its input     when the tape keeps it (linear, conv2d: x), and
//   its output    when the tape keeps it (relu keeps y).
// A stage keeps, per micro-batch in flight, the union of these: a layer's output counts once
// whether it keeps it itself or the next layer keeps it as its input (memory.h). The figures come
// from one of two places:
//   probe     layers that run on the CPU cheaply (everything but the transformer family): the layer
//             is built alone with its own ParamStore and run forward on 1 and 2 samples, and the
//             storages on its tape are compared with its input's and output's (by data pointer):
//             what the allocator holds, without a model of the layer's code.
//   formula   transformer_block, token_embedding, bert_embedding, lm_head and mlm_head, whose
//             sizes (GPT-2 1558M, 20B) are too large to run: the tensors graph/transformer.cpp
//             puts on the tape, counted from (T, C, H, mlp hidden, vocab) at the compute dtype,
//             with f32 statistics, u8 dropout masks and, on the CPU only, the (H, T, T) attention
//             probabilities (the fused CUDA kernel keeps only the log-sum-exp). Checked against the
//             probe on tiny sizes (tests/parallel/test_sim_memory.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/dtype.h"
#include "io/proto/strata.pb.h"

namespace strata::graph {
class Model;
}  // namespace strata::graph

namespace strata::parallel::sim {

// fixed + per_sample x rows: a quantity of a micro-batch of `rows` samples.
struct Linear {
  double fixed = 0.0;
  double per_sample = 0.0;
  double at(double rows) const { return fixed + per_sample * rows; }
};

struct LayerWork {
  std::string name;
  std::string type;
  // Forward work per sample.
  double matmul_flops = 0.0;
  double attention_flops = 0.0;
  double memory_bytes = 0.0;
  int kernels = 1;  // forward kernel launches (backward: twice)
  // Sizes.
  double input_bytes = 0.0;   // per sample, what the layer receives (its first input)
  double output_bytes = 0.0;  // per sample, what it returns (and a stage ending here sends)
  double param_bytes = 0.0;   // its parameters in f32 (a tied parameter included)
  double tied_bytes = 0.0;    // of those, tied to a parameter of layer tied_owner
  int64_t tied_owner = -1;
  // The tape (see the file comment).
  Linear own_saved;  // bytes
  bool saves_input = false;
  bool saves_output = false;
  // Transient bytes: during the forward, beyond its input, output and tape; during the backward,
  // beyond its tape, output gradient and input gradient (temporaries of the layer's kernels).
  Linear forward_workspace;
  Linear backward_workspace;
  std::string memory_source;  // "probe" or "formula"
};

struct WorkOptions {
  DType compute = DType::kF32;  // activations' dtype (--precision)
  bool attention_probs = true;  // the CPU keeps (H, T, T) probabilities; CUDA does not
  bool probe = true;            // false: formulas only (unknown types: input/output rule)
  bool training = true;         // dropout masks exist (train mode)
};

// Every layer of `model`; `spec` (the ModelSpec it was built from) gives what the layers do not
// expose (heads, dropout rates); it may be null for a model without transformer-family layers
// (a model built in C++). Throws strata::Error when the spec does not describe the model, or
// when a transformer-family layer has none.
std::vector<LayerWork> model_work(const graph::Model& model, const proto::ModelSpec* spec,
                                  const WorkOptions& options);

// The probe alone, for one layer (tests compare it with the formulas).
LayerWork probe_layer(const graph::Model& model, size_t layer, DType compute);

}  // namespace strata::parallel::sim
