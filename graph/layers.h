// The primitive layers: each wraps one op (or a fixed pair) and states its parameters.
//
// Shapes in constructors and output_shape() are per sample (no batch dimension); forward takes
// (B, ...) tensors. Parameter initialization follows PyTorch's defaults so that results are
// comparable: convolution and linear weights and biases uniform in +-1/sqrt(fan_in), norm scales
// 1 and shifts 0.
#pragma once

#include <cstdint>
#include <string>

#include "graph/layer.h"
#include "ops/conv2d.h"
#include "ops/pooling.h"

namespace strata::graph {

class Conv2dLayer final : public Layer {
 public:
  // input_shape: (C, H, W); weight (out_channels, C / groups, kernel_h, kernel_w).
  Conv2dLayer(std::string name, const Shape& input_shape, int64_t out_channels, int64_t kernel_h,
              int64_t kernel_w, const ops::Conv2dParams& params, bool bias);
  const char* type() const override { return "conv2d"; }
  std::vector<ParamSpec> param_specs() const override;
  Shape output_shape(const Shape& input_shape) const override;
  TensorList forward(ExecContext& ctx, const TensorList& inputs, LayerTape& tape) override;
  TensorList backward(ExecContext& ctx, const TensorList& grad_outputs, LayerTape& tape) override;
  double forward_flops(const TensorSpecs& inputs) const override;

 private:
  Shape input_shape_;
  int64_t out_channels_, kernel_h_, kernel_w_;
  ops::Conv2dParams params_;
  bool bias_;
};

class LinearLayer final : public Layer {
 public:
  // Applies to the last dimension: (..., in_features) -> (..., out_features).
  LinearLayer(std::string name, int64_t in_features, int64_t out_features, bool bias);
  const char* type() const override { return "linear"; }
  std::vector<ParamSpec> param_specs() const override;
  Shape output_shape(const Shape& input_shape) const override;
  TensorList forward(ExecContext& ctx, const TensorList& inputs, LayerTape& tape) override;
  TensorList backward(ExecContext& ctx, const TensorList& grad_outputs, LayerTape& tape) override;
  double forward_flops(const TensorSpecs& inputs) const override;

 private:
  int64_t in_features_, out_features_;
  bool bias_;
};

class ReluLayer final : public Layer {
 public:
  explicit ReluLayer(std::string name) : Layer(std::move(name)) {}
  const char* type() const override { return "relu"; }
  Shape output_shape(const Shape& input_shape) const override { return input_shape; }
  TensorList forward(ExecContext& ctx, const TensorList& inputs, LayerTape& tape) override;
  TensorList backward(ExecContext& ctx, const TensorList& grad_outputs, LayerTape& tape) override;
};

class GeluLayer final : public Layer {
 public:
  explicit GeluLayer(std::string name) : Layer(std::move(name)) {}
  const char* type() const override { return "gelu"; }
  Shape output_shape(const Shape& input_shape) const override { return input_shape; }
  TensorList forward(ExecContext& ctx, const TensorList& inputs, LayerTape& tape) override;
  TensorList backward(ExecContext& ctx, const TensorList& grad_outputs, LayerTape& tape) override;
};

class MaxPool2dLayer final : public Layer {
 public:
  MaxPool2dLayer(std::string name, const Shape& input_shape, const ops::Pool2dParams& params);
  const char* type() const override { return "max_pool2d"; }
  Shape output_shape(const Shape& input_shape) const override;
  TensorList forward(ExecContext& ctx, const TensorList& inputs, LayerTape& tape) override;
  TensorList backward(ExecContext& ctx, const TensorList& grad_outputs, LayerTape& tape) override;

 private:
  Shape input_shape_;
  ops::Pool2dParams params_;
};

class AvgPool2dLayer final : public Layer {
 public:
  AvgPool2dLayer(std::string name, const Shape& input_shape, const ops::Pool2dParams& params);
  const char* type() const override { return "avg_pool2d"; }
  Shape output_shape(const Shape& input_shape) const override;
  TensorList forward(ExecContext& ctx, const TensorList& inputs, LayerTape& tape) override;
  TensorList backward(ExecContext& ctx, const TensorList& grad_outputs, LayerTape& tape) override;

 private:
  Shape input_shape_;
  ops::Pool2dParams params_;
};

class AdaptiveAvgPool2dLayer final : public Layer {
 public:
  AdaptiveAvgPool2dLayer(std::string name, const Shape& input_shape, int64_t out_h, int64_t out_w);
  const char* type() const override { return "adaptive_avg_pool2d"; }
  Shape output_shape(const Shape& input_shape) const override;
  TensorList forward(ExecContext& ctx, const TensorList& inputs, LayerTape& tape) override;
  TensorList backward(ExecContext& ctx, const TensorList& grad_outputs, LayerTape& tape) override;

 private:
  Shape input_shape_;
  int64_t out_h_, out_w_;
};

// Per-channel batch normalization over (B, C, ...): batch statistics in training (the
// micro-batch's, inside a pipeline), running statistics in evaluation.
class BatchNormLayer final : public Layer {
 public:
  BatchNormLayer(std::string name, const Shape& input_shape, double momentum, double eps,
                 bool affine);
  const char* type() const override { return "batch_norm"; }
  std::vector<ParamSpec> param_specs() const override;
  std::vector<ParamSpec> buffer_specs() const override;  // running_mean, running_var
  Shape output_shape(const Shape& input_shape) const override;
  TensorList forward(ExecContext& ctx, const TensorList& inputs, LayerTape& tape) override;
  TensorList backward(ExecContext& ctx, const TensorList& grad_outputs, LayerTape& tape) override;

 private:
  Shape input_shape_;
  int64_t channels_;
  double momentum_, eps_;
  bool affine_;
};

class LayerNormLayer final : public Layer {
 public:
  LayerNormLayer(std::string name, int64_t channels, double eps, bool affine);
  const char* type() const override { return "layer_norm"; }
  std::vector<ParamSpec> param_specs() const override;
  Shape output_shape(const Shape& input_shape) const override;
  TensorList forward(ExecContext& ctx, const TensorList& inputs, LayerTape& tape) override;
  TensorList backward(ExecContext& ctx, const TensorList& grad_outputs, LayerTape& tape) override;

 private:
  int64_t channels_;
  double eps_;
  bool affine_;
};

// Inverted dropout in training (masks keyed by the tape's RNG offsets); identity in evaluation.
class DropoutLayer final : public Layer {
 public:
  DropoutLayer(std::string name, double p);
  const char* type() const override { return "dropout"; }
  Shape output_shape(const Shape& input_shape) const override { return input_shape; }
  TensorList forward(ExecContext& ctx, const TensorList& inputs, LayerTape& tape) override;
  TensorList backward(ExecContext& ctx, const TensorList& grad_outputs, LayerTape& tape) override;

 private:
  double p_;
};

// (B, d1, d2, ...) -> (B, d1 * d2 * ...): a view, no copy.
class FlattenLayer final : public Layer {
 public:
  explicit FlattenLayer(std::string name) : Layer(std::move(name)) {}
  const char* type() const override { return "flatten"; }
  Shape output_shape(const Shape& input_shape) const override;
  TensorList forward(ExecContext& ctx, const TensorList& inputs, LayerTape& tape) override;
  TensorList backward(ExecContext& ctx, const TensorList& grad_outputs, LayerTape& tape) override;
};

}  // namespace strata::graph
