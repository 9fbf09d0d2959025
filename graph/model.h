// Model: an ordered list of named layers, the unit that pipeline stages are cut from.
//
// The model knows the per-sample shape flowing into every layer (checked as layers are added),
// and runs any contiguous range of its layers forward and backward over a Tape. Layers are
// numbered from 0; layer i's RNG stream is i, so a dropout mask does not depend on which stage
// runs the layer.
#pragma once

#include <cstdint>
#include <functional>
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
  // The per-sample specs of the model's inputs (a model of several inputs, such as BERT's ids,
  // segments and mask, takes them as one TensorList).
  Model(std::string name, TensorSpecs inputs);
  // A model of one input: one sample of `input_shape`, without the batch dimension.
  Model(std::string name, Shape input_shape, DType input_dtype = DType::kF32);

  // Appends a layer that takes the current outputs; throws if the name is taken or the layer
  // does not accept them. Returns the layer.
  Layer& add(std::unique_ptr<Layer> layer);

  const std::string& name() const { return name_; }
  size_t size() const { return layers_.size(); }
  Layer& layer(size_t i);
  const Layer& layer(size_t i) const;
  std::optional<size_t> find(const std::string& layer_name) const;
  // The layer holding the parameter of this full name ("layer.param.name"), if any.
  std::optional<size_t> find_param_layer(const std::string& full_name) const;
  // Every tied parameter, in layer order: the layer that uses it and the layer that owns the
  // parameter it is tied to (add() checked that one exists).
  struct TiedParam {
    size_t user = 0, owner = 0;  // layer indices
    std::string name;            // the user's parameter, "layer.param"
    std::string tied_to;         // the owner's, "layer.param"
  };
  std::vector<TiedParam> tied_params() const;
  // Per-sample specs of the tensors entering layer i (i == size(): the model's outputs).
  const TensorSpecs& specs_before(size_t i) const;
  const TensorSpecs& input_specs() const { return specs_.front(); }
  const TensorSpecs& output_specs() const { return specs_.back(); }
  // The first tensor's shape and dtype, for models of one input and one output.
  const Shape& shape_before(size_t i) const { return specs_before(i).at(0).shape; }
  const Shape& input_shape() const { return specs_.front().at(0).shape; }
  DType input_dtype() const { return specs_.front().at(0).dtype; }
  const Shape& output_shape() const { return specs_.back().at(0).shape; }
  // The classes a loss on the model's logits counts: the last layer's logit_classes() (a padded
  // vocabulary's V), 0 when every column is a class. For CrossEntropyOptions::num_classes.
  int64_t loss_classes() const { return layers_.empty() ? 0 : layers_.back()->logit_classes(); }
  // Forward FLOPs of one sample through layers [begin, end) (conv and linear layers).
  double forward_flops(size_t begin, size_t end) const;

  // Runs layers [begin, end) forward. `tape` gets one LayerTape per layer.
  TensorList forward(ExecContext& ctx, size_t begin, size_t end, const TensorList& inputs,
                     Tape& tape, const ForwardOptions& options, LayerProfiler* profiler = nullptr);
  // Runs layers [begin, end) backward from the gradients of the range's outputs, consuming the
  // tape. Returns the gradients of the range's inputs (undefined for the model's data input).
  // `after_layer(i)`, when given, runs once layer i's backward is done (its parameter gradients
  // final for this pass): the hook that launches gradient all-reduces early.
  TensorList backward(ExecContext& ctx, size_t begin, size_t end, const TensorList& grad_outputs,
                      Tape& tape, LayerProfiler* profiler = nullptr,
                      const std::function<void(size_t)>& after_layer = nullptr);

  // One layer of the walks above: forward of layer i, its tape set up as forward() sets it
  // (RNG offsets, mode, weight version, input shape), and the backward that consumes the tape.
  // A stage runtime that keeps, swaps or recomputes each layer's tape runs layers one at a time.
  TensorList forward_layer(ExecContext& ctx, size_t i, const TensorList& inputs, LayerTape& tape,
                           const ForwardOptions& options, LayerProfiler* profiler = nullptr);
  TensorList backward_layer(ExecContext& ctx, size_t i, const TensorList& grad_outputs,
                            LayerTape& tape, LayerProfiler* profiler = nullptr);

  // One line per layer: index, name, type, output shape, parameter count.
  std::string summary() const;

 private:
  void check_range(size_t begin, size_t end) const;

  std::string name_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<TensorSpecs> specs_;  // specs_[i]: into layer i; specs_.back(): the outputs
};

}  // namespace strata::graph
