// Model: an ordered list of named layers, the unit that pipeline stages are cut from.
//
// The model knows the per-sample shape flowing into every layer (checked as layers are added),
// and runs any contiguous range of its layers forward and backward over a Tape. Layers are
// numbered from 0; layer i's RNG stream is i, so a dropout mask does not depend on which stage
// runs the layer.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/exec_context.h"
#include "engine/tape.h"
#include "graph/layer.h"

namespace strata::graph {

class LayerProfiler;

struct ForwardOptions {
  bool training = true;
  uint64_t seed = 0;
  int64_t step = 0;
  int64_t sample_offset = 0;  // global index of the micro-batch's first sample
  uint64_t weight_version = 0;
  bool keep_tape = true;  // false: drop each layer's saved tensors (no backward follows)
};

class Model {
 public:
  // input_shape: one sample, without the batch dimension.
  Model(std::string name, Shape input_shape, DType input_dtype = DType::kF32);

  // Appends a layer that takes the current output shape; throws if the name is taken or the
  // layer does not accept that shape. Returns the layer.
  Layer& add(std::unique_ptr<Layer> layer);

  const std::string& name() const { return name_; }
  size_t size() const { return layers_.size(); }
  Layer& layer(size_t i);
  const Layer& layer(size_t i) const;
  std::optional<size_t> find(const std::string& layer_name) const;
  DType input_dtype() const { return input_dtype_; }
  const Shape& input_shape() const { return shapes_.front(); }
  // Per-sample shape entering layer i (i == size() gives the model's output shape).
  const Shape& shape_before(size_t i) const;
  const Shape& output_shape() const { return shapes_.back(); }
  // Forward FLOPs of one sample through layers [begin, end) (conv and linear layers).
  double forward_flops(size_t begin, size_t end) const;

  // Runs layers [begin, end) forward. `tape` gets one LayerTape per layer.
  TensorList forward(ExecContext& ctx, size_t begin, size_t end, const TensorList& inputs,
                     Tape& tape, const ForwardOptions& options, LayerProfiler* profiler = nullptr);
  // Runs layers [begin, end) backward from the gradients of the range's outputs, consuming the
  // tape. Returns the gradients of the range's inputs (undefined for the model's data input).
  TensorList backward(ExecContext& ctx, size_t begin, size_t end, const TensorList& grad_outputs,
                      Tape& tape, LayerProfiler* profiler = nullptr);

  // One line per layer: index, name, type, output shape, parameter count.
  std::string summary() const;

 private:
  void check_range(size_t begin, size_t end) const;

  std::string name_;
  DType input_dtype_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<Shape> shapes_;  // shapes_[i]: into layer i; shapes_.back(): the output
};

}  // namespace strata::graph
