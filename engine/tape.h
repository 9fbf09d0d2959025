// The Tape: what a micro-batch's forward leaves for its backward.
//
// Each layer of a stage gets one LayerTape per micro-batch. The layer pushes the tensors its
// backward needs (inputs, masks, normalization statistics) onto `saved`, and everything that
// decides randomness and weights is recorded beside them, so that
//   - swap can move `saved` to host memory and back before backward,
//   - recompute can drop `saved` and re-run forward with the same RNG offsets,
//   - weight stashing can check which weight version a micro-batch saw in forward.
// Nothing a backward needs is hidden in a closure or a member of the layer.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/tensor.h"

namespace strata {

// Everything that makes a layer's forward random is a function of these (see philox.h).
struct RngOffsets {
  uint64_t seed = 0;          // the run's seed
  uint64_t stream = 0;        // the layer's index in the model
  int64_t step = 0;           // optimizer step
  int64_t sample_offset = 0;  // global index of the micro-batch's first sample
};

struct LayerTape {
  std::vector<Tensor> saved;  // in the order forward pushed them
  RngOffsets rng;
  uint64_t weight_version = 0;  // optimizer steps applied to the weights used in forward
  bool training = true;         // dropout on, batch statistics for batch norm
  // False for the first layer of a model, whose input (the data) needs no gradient: backward
  // may then skip the input gradient and return an undefined tensor.
  bool needs_input_grad = true;
  Shape input_shape;  // shape of the layer's first input in forward, set by the caller

  void save(const Tensor& t) { saved.push_back(t); }
  const Tensor& at(size_t i) const {
    STRATA_CHECK_LT(i, saved.size()) << "tape holds " << saved.size() << " saved tensors";
    return saved[i];
  }
  // Bytes the saved tensors refer to (views of one storage counted once per view).
  size_t saved_bytes() const {
    size_t n = 0;
    for (const Tensor& t : saved) n += t.defined() ? t.nbytes() : 0;
    return n;
  }
  void clear() { saved.clear(); }
};

// One micro-batch's tapes for the layers of a stage, in forward order.
struct Tape {
  std::vector<LayerTape> layers;
  void clear() { layers.clear(); }
};

}  // namespace strata
