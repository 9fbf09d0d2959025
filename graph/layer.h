// The Layer contract: the unit of the graph, of profiling, of partitioning and of migration.
//
//   forward(ctx, inputs, tape)        -> outputs      records what backward needs on `tape`
//   backward(ctx, grad_outputs, tape) -> grad_inputs  accumulates (+=) parameter gradients,
//                                                     returns (overwrites) input gradients
//
// A layer owns no memory of its own: its parameters, gradients and buffers (running statistics)
// are views into the flat buffers of a ParamStore, bound with bind(). What backward needs from
// forward is on the LayerTape and nowhere else, so swap, recompute and weight stashing can act on
// it. A layer has a stable name ("blocks.3.attn", "conv1") used by checkpoints and plans.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/exec_context.h"
#include "engine/tape.h"
#include "engine/tensor.h"

namespace strata::graph {

// How a parameter or buffer starts. Values are drawn from Philox keyed by the run's seed and the
// hash of "layer.param", so a weight is the same whichever stage or rank builds it.
struct ParamInit {
  enum class Kind { kZeros, kOnes, kUniform, kNormal };
  Kind kind = Kind::kZeros;
  double scale = 0.0;  // uniform: values in [-scale, scale); normal: standard deviation

  static ParamInit zeros() { return {Kind::kZeros, 0.0}; }
  static ParamInit ones() { return {Kind::kOnes, 0.0}; }
  static ParamInit uniform(double bound) { return {Kind::kUniform, bound}; }
  static ParamInit normal(double std) { return {Kind::kNormal, std}; }
};

struct ParamSpec {
  std::string name;  // "weight", "bias", "running_mean"
  Shape shape;
  ParamInit init;
  bool weight_decay = true;  // false for biases and normalization scales/shifts
  // Full name ("wte.weight") of a parameter of an earlier layer that this one *is* (GPT-2's
  // output projection is the token embedding). A ParamStore holding both gives them one storage;
  // a store holding only this layer keeps a copy initialized like the owner, whose gradient the
  // pipeline all-reduces with the owner's. Shapes must match. Empty: not tied.
  std::string tied_to;
  // Rows of dimension 0 that hold values (0: all). The rows past them are padding (a vocabulary
  // padded for the GPU, graph/transformer.h): zero from initialization on, never counted as
  // parameters, never exported or imported (models/weight_files.h moves rows [0, valid_rows)).
  int64_t valid_rows = 0;
};

// The elements of a parameter that hold values (the padding rows left out, see valid_rows).
inline int64_t valid_numel(const ParamSpec& p) {
  const int64_t n = shape_numel(p.shape);
  return p.valid_rows > 0 && !p.shape.empty() ? n / p.shape[0] * p.valid_rows : n;
}

// One tensor flowing between layers, per sample (no batch dimension).
struct TensorSpec {
  Shape shape;
  DType dtype = DType::kF32;
  bool operator==(const TensorSpec& o) const { return shape == o.shape && dtype == o.dtype; }
};
using TensorSpecs = std::vector<TensorSpec>;
std::string specs_str(const TensorSpecs& specs);  // "f32 (3, 32, 32), i32 (128,)"

// The views a ParamStore hands to a layer, in the order of its specs.
struct LayerParams {
  TensorList params;   // param_specs() order
  TensorList grads;    // same shapes as params
  TensorList buffers;  // buffer_specs() order (not trained: running statistics)
};

class Layer {
 public:
  explicit Layer(std::string name) : name_(std::move(name)) {}
  virtual ~Layer() = default;
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  const std::string& name() const { return name_; }
  virtual const char* type() const = 0;  // "conv2d", "linear", ...

  virtual std::vector<ParamSpec> param_specs() const { return {}; }
  virtual std::vector<ParamSpec> buffer_specs() const { return {}; }

  // The per-sample specs of the outputs for those of the inputs. Throws strata::Error naming the
  // layer when the inputs do not fit. The default serves layers of one input and one output of
  // the input's dtype through output_shape().
  virtual TensorSpecs output_specs(const TensorSpecs& inputs) const;
  // The per-sample output shape of a one-input layer (see output_specs).
  virtual Shape output_shape(const Shape& input_shape) const;

  virtual TensorList forward(ExecContext& ctx, const TensorList& inputs, LayerTape& tape) = 0;
  virtual TensorList backward(ExecContext& ctx, const TensorList& grad_outputs,
                              LayerTape& tape) = 0;

  // Called by ParamStore; checks counts and shapes against the specs. `owner` is the store
  // binding the views (the latest binding wins).
  void bind(LayerParams params, const void* owner = nullptr);
  // Drops the views if `owner` bound them last: a store that goes releases its memory, even
  // while the model lives on (the views would otherwise outlive the store's allocator).
  void unbind(const void* owner);
  bool bound() const { return bound_; }

  // Forward FLOPs of one sample (multiply-adds count 2), for throughput reporting; 0 if unknown.
  virtual double forward_flops(const TensorSpecs& inputs) const { return 0.0; }

  // A head whose logits are padded (a vocabulary padded for the GPU, graph/transformer.h): how
  // many of their columns are classes, which a loss must count (CrossEntropyOptions::num_classes);
  // 0 otherwise (every column is one).
  virtual int64_t logit_classes() const { return 0; }

 protected:
  const Tensor& param(size_t i) const;
  const Tensor& grad(size_t i) const;
  const Tensor& buffer(size_t i) const;
  // The single input of a one-input layer (checked).
  const Tensor& single_input(const TensorList& inputs) const;

 private:
  std::string name_;
  LayerParams params_;
  bool bound_ = false;
  const void* owner_ = nullptr;
};

}  // namespace strata::graph
