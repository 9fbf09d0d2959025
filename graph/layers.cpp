// The primitive layers. Each forward pushes exactly what its backward reads onto the tape, in a
// fixed order documented beside the push; backward pops nothing (the tape is cleared by its
// owner), so recompute can replay forward onto a fresh tape.
#include "graph/layers.h"

#include <cmath>

#include "engine/check.h"
#include "ops/activation.h"
#include "ops/batch_norm.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/layer_norm.h"
#include "ops/matmul.h"

namespace strata::graph {
namespace {

// Checks a (B, sample...) input against the per-sample shape the layer was built for.
void check_sample_shape(const Layer& layer, const Tensor& x, const Shape& sample) {
  const Shape got(x.shape().begin() + (x.dim() > 0 ? 1 : 0), x.shape().end());
  STRATA_CHECK(x.dim() == static_cast<int64_t>(sample.size()) + 1 && got == sample)
      << "layer " << layer.name() << " (" << layer.type() << ") expects (B, "
      << shape_str(sample).substr(1) << " input, got " << x.shape_str();
}

Shape with_batch(int64_t batch, const Shape& sample) {
  Shape s{batch};
  s.insert(s.end(), sample.begin(), sample.end());
  return s;
}

const Tensor& single_grad(const Layer& layer, const TensorList& grads) {
  STRATA_CHECK(grads.size() == 1 && grads[0].defined())
      << "layer " << layer.name() << " (" << layer.type() << ") backward takes one gradient, got "
      << grads.size();
  return grads[0];
}

}  // namespace

// ---- conv2d ------------------------------------------------------------------------------------

Conv2dLayer::Conv2dLayer(std::string name, const Shape& input_shape, int64_t out_channels,
                         int64_t kernel_h, int64_t kernel_w, const ops::Conv2dParams& params,
                         bool bias)
    : Layer(std::move(name)),
      input_shape_(input_shape),
      out_channels_(out_channels),
      kernel_h_(kernel_h),
      kernel_w_(kernel_w),
      params_(params),
      bias_(bias) {
  STRATA_CHECK_EQ(input_shape.size(), 3u)
      << "conv2d layer " << this->name() << " needs a (C, H, W) input, got "
      << shape_str(input_shape);
  STRATA_CHECK(out_channels > 0 && kernel_h > 0 && kernel_w > 0 && params.groups > 0)
      << "conv2d layer " << this->name() << ": out_channels, kernel and groups must be positive";
  STRATA_CHECK(input_shape[0] % params.groups == 0 && out_channels % params.groups == 0)
      << "conv2d layer " << this->name() << ": groups " << params.groups
      << " must divide in_channels " << input_shape[0] << " and out_channels " << out_channels;
  output_shape(input_shape_);  // validates the spatial sizes
}

std::vector<ParamSpec> Conv2dLayer::param_specs() const {
  const int64_t fan_in = input_shape_[0] / params_.groups * kernel_h_ * kernel_w_;
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  std::vector<ParamSpec> specs{
      {"weight",
       {out_channels_, input_shape_[0] / params_.groups, kernel_h_, kernel_w_},
       ParamInit::uniform(bound),
       true}};
  if (bias_) specs.push_back({"bias", {out_channels_}, ParamInit::uniform(bound), false});
  return specs;
}

Shape Conv2dLayer::output_shape(const Shape& input_shape) const {
  STRATA_CHECK(input_shape == input_shape_)
      << "conv2d layer " << name() << " was built for input " << shape_str(input_shape_) << ", got "
      << shape_str(input_shape);
  const int64_t oh = ops::conv2d_output_size(input_shape[1], kernel_h_, params_.stride_h,
                                             params_.pad_h, params_.dilation_h);
  const int64_t ow = ops::conv2d_output_size(input_shape[2], kernel_w_, params_.stride_w,
                                             params_.pad_w, params_.dilation_w);
  STRATA_CHECK(oh > 0 && ow > 0) << "conv2d layer " << name() << ": kernel " << kernel_h_ << "x"
                                 << kernel_w_ << " does not fit input " << shape_str(input_shape);
  return {out_channels_, oh, ow};
}

TensorList Conv2dLayer::forward(ExecContext& ctx, const TensorList& inputs, LayerTape& tape) {
  const Tensor& x = single_input(inputs);
  check_sample_shape(*this, x, input_shape_);
  tape.save(x);  // 0: x
  return {ops::conv2d_forward(ctx, x, param(0), bias_ ? param(1) : Tensor(), params_)};
}

TensorList Conv2dLayer::backward(ExecContext& ctx, const TensorList& grad_outputs,
                                 LayerTape& tape) {
  const Tensor& dy = single_grad(*this, grad_outputs);
  return {ops::conv2d_backward(ctx, dy, tape.at(0), param(0), params_, grad(0),
                               bias_ ? grad(1) : Tensor(), tape.needs_input_grad)};
}

double Conv2dLayer::forward_flops(const TensorSpecs& inputs) const {
  const Shape out = output_shape(inputs.at(0).shape);
  return 2.0 * static_cast<double>(out[0] * out[1] * out[2]) *
         static_cast<double>(input_shape_[0] / params_.groups * kernel_h_ * kernel_w_);
}

// ---- linear ------------------------------------------------------------------------------------

LinearLayer::LinearLayer(std::string name, int64_t in_features, int64_t out_features, bool bias)
    : Layer(std::move(name)), in_features_(in_features), out_features_(out_features), bias_(bias) {
  STRATA_CHECK(in_features > 0 && out_features > 0)
      << "linear layer " << this->name() << ": features must be positive, got " << in_features
      << " -> " << out_features;
}

std::vector<ParamSpec> LinearLayer::param_specs() const {
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_features_));
  std::vector<ParamSpec> specs{
      {"weight", {out_features_, in_features_}, ParamInit::uniform(bound), true}};
  if (bias_) specs.push_back({"bias", {out_features_}, ParamInit::uniform(bound), false});
  return specs;
}

Shape LinearLayer::output_shape(const Shape& input_shape) const {
  STRATA_CHECK(!input_shape.empty() && input_shape.back() == in_features_)
      << "linear layer " << name() << " expects (..., " << in_features_ << ") samples, got "
      << shape_str(input_shape);
  Shape out = input_shape;
  out.back() = out_features_;
  return out;
}

TensorList LinearLayer::forward(ExecContext& ctx, const TensorList& inputs, LayerTape& tape) {
  const Tensor& x = single_input(inputs);
  STRATA_CHECK(x.dim() >= 2 && x.size(-1) == in_features_)
      << "linear layer " << name() << " expects (B, ..., " << in_features_ << ") input, got "
      << x.shape_str();
  tape.save(x);  // 0: x
  return {ops::linear_forward(ctx, x, param(0), bias_ ? param(1) : Tensor())};
}

TensorList LinearLayer::backward(ExecContext& ctx, const TensorList& grad_outputs,
                                 LayerTape& tape) {
  const Tensor& dy = single_grad(*this, grad_outputs);
  return {ops::linear_backward(ctx, dy, tape.at(0), param(0), grad(0), bias_ ? grad(1) : Tensor(),
                               tape.needs_input_grad)};
}

double LinearLayer::forward_flops(const TensorSpecs& inputs) const {
  return 2.0 * static_cast<double>(shape_numel(inputs.at(0).shape)) *
         static_cast<double>(out_features_);
}

// ---- activations -------------------------------------------------------------------------------

TensorList ReluLayer::forward(ExecContext& ctx, const TensorList& inputs, LayerTape& tape) {
  Tensor y = ops::relu_forward(ctx, single_input(inputs));
  tape.save(y);  // 0: y (the mask of positives)
  return {y};
}

TensorList ReluLayer::backward(ExecContext& ctx, const TensorList& grad_outputs, LayerTape& tape) {
  return {ops::relu_backward(ctx, single_grad(*this, grad_outputs), tape.at(0))};
}

TensorList GeluLayer::forward(ExecContext& ctx, const TensorList& inputs, LayerTape& tape) {
  const Tensor& x = single_input(inputs);
  tape.save(x);  // 0: x
  return {ops::gelu_forward(ctx, x)};
}

TensorList GeluLayer::backward(ExecContext& ctx, const TensorList& grad_outputs, LayerTape& tape) {
  return {ops::gelu_backward(ctx, single_grad(*this, grad_outputs), tape.at(0))};
}

// ---- pooling -----------------------------------------------------------------------------------

namespace {
Shape pool_output_shape(const std::string& name, const Shape& expected, const Shape& input_shape,
                        const ops::Pool2dParams& p) {
  STRATA_CHECK(input_shape == expected)
      << "pooling layer " << name << " was built for input " << shape_str(expected) << ", got "
      << shape_str(input_shape);
  const int64_t oh =
      ops::pool2d_output_size(input_shape[1], p.kernel_h, p.stride_h, p.pad_h, p.ceil_mode);
  const int64_t ow =
      ops::pool2d_output_size(input_shape[2], p.kernel_w, p.stride_w, p.pad_w, p.ceil_mode);
  STRATA_CHECK(oh > 0 && ow > 0) << "pooling layer " << name << ": window " << p.kernel_h << "x"
                                 << p.kernel_w << " does not fit input " << shape_str(input_shape);
  return {input_shape[0], oh, ow};
}
}  // namespace

MaxPool2dLayer::MaxPool2dLayer(std::string name, const Shape& input_shape,
                               const ops::Pool2dParams& params)
    : Layer(std::move(name)), input_shape_(input_shape), params_(params) {
  STRATA_CHECK_EQ(input_shape.size(), 3u)
      << "max_pool2d layer " << this->name() << " needs a (C, H, W) input";
  output_shape(input_shape_);
}

Shape MaxPool2dLayer::output_shape(const Shape& input_shape) const {
  return pool_output_shape(name(), input_shape_, input_shape, params_);
}

TensorList MaxPool2dLayer::forward(ExecContext& ctx, const TensorList& inputs, LayerTape& tape) {
  const Tensor& x = single_input(inputs);
  check_sample_shape(*this, x, input_shape_);
  ops::MaxPool2dResult r = ops::max_pool2d_forward(ctx, x, params_);
  tape.save(r.indices);  // 0: argmax indices
  return {r.y};
}

TensorList MaxPool2dLayer::backward(ExecContext& ctx, const TensorList& grad_outputs,
                                    LayerTape& tape) {
  const Tensor& dy = single_grad(*this, grad_outputs);
  return {ops::max_pool2d_backward(ctx, dy, tape.at(0), with_batch(dy.size(0), input_shape_))};
}

AvgPool2dLayer::AvgPool2dLayer(std::string name, const Shape& input_shape,
                               const ops::Pool2dParams& params)
    : Layer(std::move(name)), input_shape_(input_shape), params_(params) {
  STRATA_CHECK_EQ(input_shape.size(), 3u)
      << "avg_pool2d layer " << this->name() << " needs a (C, H, W) input";
  output_shape(input_shape_);
}

Shape AvgPool2dLayer::output_shape(const Shape& input_shape) const {
  return pool_output_shape(name(), input_shape_, input_shape, params_);
}

TensorList AvgPool2dLayer::forward(ExecContext& ctx, const TensorList& inputs, LayerTape& tape) {
  const Tensor& x = single_input(inputs);
  check_sample_shape(*this, x, input_shape_);
  return {ops::avg_pool2d_forward(ctx, x, params_)};
}

TensorList AvgPool2dLayer::backward(ExecContext& ctx, const TensorList& grad_outputs,
                                    LayerTape& tape) {
  const Tensor& dy = single_grad(*this, grad_outputs);
  return {ops::avg_pool2d_backward(ctx, dy, with_batch(dy.size(0), input_shape_), params_)};
}

AdaptiveAvgPool2dLayer::AdaptiveAvgPool2dLayer(std::string name, const Shape& input_shape,
                                               int64_t out_h, int64_t out_w)
    : Layer(std::move(name)), input_shape_(input_shape), out_h_(out_h), out_w_(out_w) {
  STRATA_CHECK(input_shape.size() == 3u && out_h > 0 && out_w > 0)
      << "adaptive_avg_pool2d layer " << this->name()
      << " needs a (C, H, W) input and a positive output size";
}

Shape AdaptiveAvgPool2dLayer::output_shape(const Shape& input_shape) const {
  STRATA_CHECK(input_shape == input_shape_)
      << "adaptive_avg_pool2d layer " << name() << " was built for input "
      << shape_str(input_shape_) << ", got " << shape_str(input_shape);
  return {input_shape[0], out_h_, out_w_};
}

TensorList AdaptiveAvgPool2dLayer::forward(ExecContext& ctx, const TensorList& inputs,
                                           LayerTape& tape) {
  const Tensor& x = single_input(inputs);
  check_sample_shape(*this, x, input_shape_);
  return {ops::adaptive_avg_pool2d_forward(ctx, x, out_h_, out_w_)};
}

TensorList AdaptiveAvgPool2dLayer::backward(ExecContext& ctx, const TensorList& grad_outputs,
                                            LayerTape& tape) {
  const Tensor& dy = single_grad(*this, grad_outputs);
  return {ops::adaptive_avg_pool2d_backward(ctx, dy, with_batch(dy.size(0), input_shape_))};
}

// ---- normalization -----------------------------------------------------------------------------

BatchNormLayer::BatchNormLayer(std::string name, const Shape& input_shape, double momentum,
                               double eps, bool affine)
    : Layer(std::move(name)),
      input_shape_(input_shape),
      channels_(input_shape.empty() ? 0 : input_shape[0]),
      momentum_(momentum),
      eps_(eps),
      affine_(affine) {
  STRATA_CHECK(!input_shape.empty() && channels_ > 0)
      << "batch_norm layer " << this->name() << " needs a (C, ...) input, got "
      << shape_str(input_shape);
  STRATA_CHECK(momentum >= 0 && momentum <= 1 && eps > 0)
      << "batch_norm layer " << this->name() << ": momentum must be in [0, 1] and eps > 0";
}

std::vector<ParamSpec> BatchNormLayer::param_specs() const {
  if (!affine_) return {};
  return {{"weight", {channels_}, ParamInit::ones(), false},
          {"bias", {channels_}, ParamInit::zeros(), false}};
}

std::vector<ParamSpec> BatchNormLayer::buffer_specs() const {
  return {{"running_mean", {channels_}, ParamInit::zeros(), false},
          {"running_var", {channels_}, ParamInit::ones(), false}};
}

Shape BatchNormLayer::output_shape(const Shape& input_shape) const {
  STRATA_CHECK(input_shape == input_shape_)
      << "batch_norm layer " << name() << " was built for input " << shape_str(input_shape_)
      << ", got " << shape_str(input_shape);
  return input_shape;
}

TensorList BatchNormLayer::forward(ExecContext& ctx, const TensorList& inputs, LayerTape& tape) {
  const Tensor& x = single_input(inputs);
  check_sample_shape(*this, x, input_shape_);
  const Tensor gamma = affine_ ? param(0) : Tensor();
  const Tensor beta = affine_ ? param(1) : Tensor();
  tape.save(x);  // 0: x
  if (!tape.training) {
    return {ops::batch_norm_forward_eval(ctx, x, gamma, beta, buffer(0), buffer(1), eps_)};
  }
  ops::BatchNormTrainResult r =
      ops::batch_norm_forward_train(ctx, x, gamma, beta, buffer(0), buffer(1), momentum_, eps_);
  tape.save(r.save_mean);    // 1: batch mean
  tape.save(r.save_invstd);  // 2: batch 1 / std
  return {r.y};
}

TensorList BatchNormLayer::backward(ExecContext& ctx, const TensorList& grad_outputs,
                                    LayerTape& tape) {
  const Tensor& dy = single_grad(*this, grad_outputs);
  const Tensor gamma = affine_ ? param(0) : Tensor();
  const Tensor dgamma = affine_ ? grad(0) : Tensor();
  const Tensor dbeta = affine_ ? grad(1) : Tensor();
  if (tape.training) {
    return {ops::batch_norm_backward(ctx, dy, tape.at(0), gamma, tape.at(1), tape.at(2), dgamma,
                                     dbeta)};
  }
  // Evaluation mode (frozen statistics): y = gamma (x - mean) invstd + beta is affine in x.
  const Tensor& x = tape.at(0);
  Shape channel_shape(static_cast<size_t>(x.dim()), 1);
  channel_shape[1] = channels_;
  // Fresh f64 copies: to(dtype) would alias the buffers when they are already f64.
  Tensor invstd = Tensor::empty({channels_}, DType::kF64);
  Tensor neg_mean = Tensor::empty({channels_}, DType::kF64);
  invstd.copy_from(buffer(1));
  neg_mean.copy_from(buffer(0));
  double* pi = invstd.data<double>();
  double* pm = neg_mean.data<double>();
  for (int64_t c = 0; c < channels_; ++c) {
    pi[c] = 1.0 / std::sqrt(pi[c] + eps_);
    pm[c] = -pm[c];
  }
  Tensor inv = to_allocator(invstd.to(x.dtype()), ctx.allocator()).view(channel_shape);
  Tensor scale = affine_ ? ops::mul(ctx, inv, gamma.view(channel_shape)) : inv;
  if (dgamma.defined()) {
    Tensor shift = to_allocator(neg_mean.to(x.dtype()), ctx.allocator()).view(channel_shape);
    Tensor xhat = ops::mul(ctx, ops::add(ctx, x, shift), inv);
    ops::add_(ctx, dgamma,
              ops::sum_to_shape(ctx, ops::mul(ctx, dy, xhat), channel_shape).view({channels_}));
    ops::add_(ctx, dbeta, ops::sum_to_shape(ctx, dy, channel_shape).view({channels_}));
  }
  if (!tape.needs_input_grad) return {Tensor()};
  return {ops::mul(ctx, dy, scale)};
}

LayerNormLayer::LayerNormLayer(std::string name, int64_t channels, double eps, bool affine)
    : Layer(std::move(name)), channels_(channels), eps_(eps), affine_(affine) {
  STRATA_CHECK(channels > 0 && eps > 0)
      << "layer_norm layer " << this->name() << ": channels and eps must be positive";
}

std::vector<ParamSpec> LayerNormLayer::param_specs() const {
  if (!affine_) return {};
  return {{"weight", {channels_}, ParamInit::ones(), false},
          {"bias", {channels_}, ParamInit::zeros(), false}};
}

Shape LayerNormLayer::output_shape(const Shape& input_shape) const {
  STRATA_CHECK(!input_shape.empty() && input_shape.back() == channels_)
      << "layer_norm layer " << name() << " normalizes " << channels_
      << " channels, got samples of shape " << shape_str(input_shape);
  return input_shape;
}

TensorList LayerNormLayer::forward(ExecContext& ctx, const TensorList& inputs, LayerTape& tape) {
  const Tensor& x = single_input(inputs);
  ops::LayerNormResult r = ops::layer_norm_forward(ctx, x, affine_ ? param(0) : Tensor(),
                                                   affine_ ? param(1) : Tensor(), eps_);
  tape.save(x);       // 0: x
  tape.save(r.mean);  // 1: row means
  tape.save(r.rstd);  // 2: row 1 / std
  return {r.y};
}

TensorList LayerNormLayer::backward(ExecContext& ctx, const TensorList& grad_outputs,
                                    LayerTape& tape) {
  const Tensor& dy = single_grad(*this, grad_outputs);
  return {ops::layer_norm_backward(ctx, dy, tape.at(0), affine_ ? param(0) : Tensor(), tape.at(1),
                                   tape.at(2), affine_ ? grad(0) : Tensor(),
                                   affine_ ? grad(1) : Tensor())};
}

// ---- dropout and flatten -----------------------------------------------------------------------

DropoutLayer::DropoutLayer(std::string name, double p) : Layer(std::move(name)), p_(p) {
  STRATA_CHECK(p >= 0.0 && p < 1.0)
      << "dropout layer " << this->name() << ": p must be in [0, 1), got " << p;
}

TensorList DropoutLayer::forward(ExecContext& ctx, const TensorList& inputs, LayerTape& tape) {
  const Tensor& x = single_input(inputs);
  if (!tape.training || p_ == 0.0) return {x};
  ops::DropoutResult r = ops::dropout_forward(ctx, x, p_, tape.rng);
  tape.save(r.mask);  // 0: keep mask
  return {r.y};
}

TensorList DropoutLayer::backward(ExecContext& ctx, const TensorList& grad_outputs,
                                  LayerTape& tape) {
  const Tensor& dy = single_grad(*this, grad_outputs);
  if (!tape.training || p_ == 0.0) return {dy};
  return {ops::dropout_backward(ctx, dy, tape.at(0), p_)};
}

Shape FlattenLayer::output_shape(const Shape& input_shape) const {
  return {shape_numel(input_shape)};
}

TensorList FlattenLayer::forward(ExecContext& ctx, const TensorList& inputs, LayerTape& tape) {
  const Tensor& x = single_input(inputs);
  STRATA_CHECK_GE(x.dim(), 1) << "flatten layer " << name() << " needs a batch dimension";
  return {x.reshape({x.size(0), -1})};
}

TensorList FlattenLayer::backward(ExecContext& ctx, const TensorList& grad_outputs,
                                  LayerTape& tape) {
  STRATA_CHECK(tape.input_shape.size() > 0)
      << "flatten layer " << name() << ": backward before forward";
  return {single_grad(*this, grad_outputs).reshape(tape.input_shape)};
}

}  // namespace strata::graph
