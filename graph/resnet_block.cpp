// The ResNet block (He et al. 2016) as one layer, composed from the conv2d, batch-norm, ReLU and
// element-wise ops, with torchvision's structure and parameter names:
//
//   basic:      conv1 3x3(stride) bn1 relu, conv2 3x3 bn2
//   bottleneck: conv1 1x1 bn1 relu, conv2 3x3(stride) bn2 relu, conv3 1x1 bn3  (ResNet v1.5:
//               the stride is on the 3x3 convolution, as torchvision places it)
//   shortcut:   identity, or downsample.0 = conv 1x1(stride) + downsample.1 = bn when the stride
//               is not 1 or the width changes
//   output:     relu(main + shortcut)
//
// Convolutions have no bias (the batch norm's shift replaces it). A "unit" below is one conv
// followed by its batch norm; the main path is units 0..n-1 with a ReLU after each but the last,
// the projection shortcut is unit n. Forward runs the shortcut first (the branches share no state,
// so the order changes nothing), which lets the tape be one flat list in a fixed order.
//
// Training normalizes with the micro-batch's statistics and updates the running statistics in
// place (momentum 0.1, eps 1e-5: PyTorch's defaults); evaluation normalizes with the running
// statistics. Either way forward saves, per unit, the statistics it normalized with (mean and
// 1/sqrt(var + eps)), so the tape has one layout in both modes and backward never reads the
// buffers, which other micro-batches may update between this forward and its backward. The
// evaluation-mode batch norm is affine in its input, so its backward is
//   dx = dy gamma invstd,  dgamma += sum(dy xhat),  dbeta += sum(dy).
//
// Initialization: convolutions kaiming-normal with fan_out and the ReLU gain (std
// sqrt(2 / (out_channels k k))), as torchvision's ResNet; batch norm weight 1, bias 0, running mean
// 0, running variance 1. torchvision's num_batches_tracked buffer is not kept (momentum is fixed).
#include "graph/resnet_block.h"

#include <cmath>
#include <vector>

#include "engine/check.h"
#include "ops/activation.h"
#include "ops/batch_norm.h"
#include "ops/conv2d.h"
#include "ops/elementwise.h"

namespace strata::graph {
namespace {

constexpr double kBnMomentum = 0.1;
constexpr double kBnEps = 1e-5;

struct Unit {
  std::string conv;  // "conv1", "downsample.0"
  std::string bn;    // "bn1", "downsample.1"
  int64_t in_channels = 0, out_channels = 0, kernel = 1;
  ops::Conv2dParams params;
};

// Tape layout: slot 0 is the block's input x; then the projection unit (when there is one) and
// the main units in order, each owning consecutive slots from first_slot(u):
//   +0 z (the batch norm's input), +1 mean, +2 invstd,
//   +3 a (main units only: the ReLU's output, which is the next unit's input, or the block's
//      output for the last main unit).
constexpr size_t kInput = 0;
constexpr size_t kZ = 0, kMean = 1, kInvstd = 2, kRelu = 3;

class ResNetBlockLayer final : public Layer {
 public:
  ResNetBlockLayer(std::string name, const Shape& input_shape, const proto::ResNetBlockSpec& spec);
  const char* type() const override { return "resnet_block"; }
  std::vector<ParamSpec> param_specs() const override;
  std::vector<ParamSpec> buffer_specs() const override;
  Shape output_shape(const Shape& input_shape) const override;
  TensorList forward(ExecContext& ctx, const TensorList& inputs, LayerTape& tape) override;
  TensorList backward(ExecContext& ctx, const TensorList& grad_outputs, LayerTape& tape) override;
  double forward_flops(const TensorSpecs& inputs) const override;

 private:
  size_t num_units() const { return units_.size(); }
  size_t num_main() const { return projection_ ? units_.size() - 1 : units_.size(); }
  size_t first_slot(size_t u) const {
    if (u == num_main()) return 1;  // the projection
    return (projection_ ? 4 : 1) + 4 * u;
  }
  // Unit u's parameters: conv weight 3u, bn weight 3u + 1, bn bias 3u + 2; buffers: running mean
  // 2u, running var 2u + 1.
  Tensor bn_forward(ExecContext& ctx, size_t u, const Tensor& z, LayerTape& tape) const;
  Tensor bn_backward(ExecContext& ctx, size_t u, const Tensor& dy, const LayerTape& tape) const;
  Shape unit_output_shape(const Unit& unit, const Shape& in) const;

  Shape input_shape_, output_shape_;
  std::vector<Unit> units_;
  std::vector<Shape> unit_inputs_;  // per-sample input shape of each unit
  bool projection_ = false;
};

ResNetBlockLayer::ResNetBlockLayer(std::string name, const Shape& input_shape,
                                   const proto::ResNetBlockSpec& spec)
    : Layer(std::move(name)), input_shape_(input_shape) {
  const std::string& n = this->name();
  STRATA_CHECK(input_shape.size() == 3u && input_shape[0] > 0 && input_shape[1] > 0 &&
               input_shape[2] > 0)
      << "resnet_block layer " << n << " needs a positive (C, H, W) input, got "
      << shape_str(input_shape);
  STRATA_CHECK(spec.has_planes() && spec.planes() > 0)
      << "resnet_block layer " << n << ": resnet_block.planes must be set (> 0)";
  STRATA_CHECK_GT(spec.stride(), 0) << "resnet_block layer " << n << ": stride must be positive";
  STRATA_CHECK(!spec.bottleneck() || spec.expansion() > 0)
      << "resnet_block layer " << n << ": expansion must be positive, got " << spec.expansion();
  const int64_t in_c = input_shape[0];
  const int64_t planes = spec.planes();
  const int64_t stride = spec.stride();
  auto unit = [](std::string conv, std::string bn, int64_t in, int64_t out, int64_t kernel,
                 int64_t stride) {
    Unit u{std::move(conv), std::move(bn), in, out, kernel, {}};
    u.params.stride_h = u.params.stride_w = stride;
    u.params.pad_h = u.params.pad_w = kernel / 2;
    return u;
  };
  int64_t out_c = planes;
  if (spec.bottleneck()) {
    out_c = planes * spec.expansion();
    units_.push_back(unit("conv1", "bn1", in_c, planes, 1, 1));
    units_.push_back(unit("conv2", "bn2", planes, planes, 3, stride));
    units_.push_back(unit("conv3", "bn3", planes, out_c, 1, 1));
  } else {
    units_.push_back(unit("conv1", "bn1", in_c, planes, 3, stride));
    units_.push_back(unit("conv2", "bn2", planes, planes, 3, 1));
  }
  projection_ = stride != 1 || in_c != out_c;
  if (projection_) units_.push_back(unit("downsample.0", "downsample.1", in_c, out_c, 1, stride));
  Shape s = input_shape_;
  for (size_t u = 0; u < num_main(); ++u) {
    unit_inputs_.push_back(s);
    s = unit_output_shape(units_[u], s);
  }
  output_shape_ = s;
  if (projection_) {
    unit_inputs_.push_back(input_shape_);
    STRATA_CHECK(unit_output_shape(units_.back(), input_shape_) == output_shape_)
        << "resnet_block layer " << n << ": shortcut and main path disagree";
  }
}

Shape ResNetBlockLayer::unit_output_shape(const Unit& unit, const Shape& in) const {
  const ops::Conv2dParams& p = unit.params;
  const int64_t oh = ops::conv2d_output_size(in[1], unit.kernel, p.stride_h, p.pad_h, 1);
  const int64_t ow = ops::conv2d_output_size(in[2], unit.kernel, p.stride_w, p.pad_w, 1);
  STRATA_CHECK(oh > 0 && ow > 0) << "resnet_block layer " << name() << ": " << unit.conv
                                 << " does not fit input " << shape_str(in);
  return {unit.out_channels, oh, ow};
}

std::vector<ParamSpec> ResNetBlockLayer::param_specs() const {
  std::vector<ParamSpec> specs;
  for (const Unit& u : units_) {
    const double fan_out = static_cast<double>(u.out_channels * u.kernel * u.kernel);
    specs.push_back({u.conv + ".weight",
                     {u.out_channels, u.in_channels, u.kernel, u.kernel},
                     ParamInit::normal(std::sqrt(2.0 / fan_out)),
                     true,
                     ""});
    specs.push_back({u.bn + ".weight", {u.out_channels}, ParamInit::ones(), false, ""});
    specs.push_back({u.bn + ".bias", {u.out_channels}, ParamInit::zeros(), false, ""});
  }
  return specs;
}

std::vector<ParamSpec> ResNetBlockLayer::buffer_specs() const {
  std::vector<ParamSpec> specs;
  for (const Unit& u : units_) {
    specs.push_back({u.bn + ".running_mean", {u.out_channels}, ParamInit::zeros(), false, ""});
    specs.push_back({u.bn + ".running_var", {u.out_channels}, ParamInit::ones(), false, ""});
  }
  return specs;
}

Shape ResNetBlockLayer::output_shape(const Shape& input_shape) const {
  STRATA_CHECK(input_shape == input_shape_)
      << "resnet_block layer " << name() << " was built for input " << shape_str(input_shape_)
      << ", got " << shape_str(input_shape);
  return output_shape_;
}

double ResNetBlockLayer::forward_flops(const TensorSpecs& inputs) const {
  output_shape(inputs.at(0).shape);
  double flops = 0.0;
  for (size_t u = 0; u < num_units(); ++u) {
    const Shape out = unit_output_shape(units_[u], unit_inputs_[u]);
    flops += 2.0 * static_cast<double>(shape_numel(out)) *
             static_cast<double>(units_[u].in_channels * units_[u].kernel * units_[u].kernel);
  }
  return flops;
}

Tensor ResNetBlockLayer::bn_forward(ExecContext& ctx, size_t u, const Tensor& z,
                                    LayerTape& tape) const {
  const Tensor& gamma = param(3 * u + 1);
  const Tensor& beta = param(3 * u + 2);
  const Tensor& running_mean = buffer(2 * u);
  const Tensor& running_var = buffer(2 * u + 1);
  tape.save(z);  // z
  if (tape.training) {
    ops::BatchNormTrainResult r = ops::batch_norm_forward_train(ctx, z, gamma, beta, running_mean,
                                                                running_var, kBnMomentum, kBnEps);
    tape.save(r.save_mean);    // mean (batch)
    tape.save(r.save_invstd);  // invstd (batch)
    return r.y;
  }
  // The running statistics as of this forward, on the host for the (C,) square roots.
  Tensor mean = to_allocator(running_mean, default_cpu_allocator()).to(DType::kF64);
  Tensor invstd = to_allocator(running_var, default_cpu_allocator()).to(DType::kF64);
  double* pi = invstd.data<double>();
  for (int64_t c = 0; c < invstd.numel(); ++c) pi[c] = 1.0 / std::sqrt(pi[c] + kBnEps);
  tape.save(to_allocator(mean.to(z.dtype()), ctx.allocator()));    // mean (running)
  tape.save(to_allocator(invstd.to(z.dtype()), ctx.allocator()));  // invstd (running)
  return ops::batch_norm_forward_eval(ctx, z, gamma, beta, running_mean, running_var, kBnEps);
}

Tensor ResNetBlockLayer::bn_backward(ExecContext& ctx, size_t u, const Tensor& dy,
                                     const LayerTape& tape) const {
  const Tensor& z = tape.at(first_slot(u) + kZ);
  const Tensor& mean = tape.at(first_slot(u) + kMean);
  const Tensor& invstd = tape.at(first_slot(u) + kInvstd);
  const Tensor& gamma = param(3 * u + 1);
  const Tensor& dgamma = grad(3 * u + 1);
  const Tensor& dbeta = grad(3 * u + 2);
  if (tape.training)
    return ops::batch_norm_backward(ctx, dy, z, gamma, mean, invstd, dgamma, dbeta);
  const int64_t channels = units_[u].out_channels;
  const Shape channel_shape{1, channels, 1, 1};
  const Tensor inv = invstd.view(channel_shape);
  const Tensor xhat =
      ops::mul(ctx, ops::add(ctx, z, ops::scale(ctx, mean, -1.0).view(channel_shape)), inv);
  ops::add_(ctx, dgamma,
            ops::sum_to_shape(ctx, ops::mul(ctx, dy, xhat), channel_shape).view({channels}));
  ops::add_(ctx, dbeta, ops::sum_to_shape(ctx, dy, channel_shape).view({channels}));
  return ops::mul(ctx, dy, ops::mul(ctx, inv, gamma.view(channel_shape)));
}

TensorList ResNetBlockLayer::forward(ExecContext& ctx, const TensorList& inputs, LayerTape& tape) {
  const Tensor& x = single_input(inputs);
  const Shape got(x.shape().begin() + (x.dim() > 0 ? 1 : 0), x.shape().end());
  STRATA_CHECK(x.dim() == 4 && got == input_shape_)
      << "layer " << name() << " (resnet_block) expects (B, " << shape_str(input_shape_).substr(1)
      << " input, got " << x.shape_str();
  tape.save(x);  // slot 0: x
  Tensor shortcut = x;
  if (projection_) {
    const size_t p = num_main();
    const Tensor z = ops::conv2d_forward(ctx, x, param(3 * p), Tensor(), units_[p].params);
    shortcut = bn_forward(ctx, p, z, tape);
  }
  Tensor a = x;
  for (size_t u = 0; u < num_main(); ++u) {
    const Tensor z = ops::conv2d_forward(ctx, a, param(3 * u), Tensor(), units_[u].params);
    a = bn_forward(ctx, u, z, tape);
    if (u + 1 == num_main()) a = ops::add(ctx, a, shortcut);
    a = ops::relu_forward(ctx, a);
    tape.save(a);  // a: the ReLU's output
  }
  return {a};
}

TensorList ResNetBlockLayer::backward(ExecContext& ctx, const TensorList& grad_outputs,
                                      LayerTape& tape) {
  STRATA_CHECK(grad_outputs.size() == 1 && grad_outputs[0].defined())
      << "layer " << name() << " (resnet_block) backward takes one gradient, got "
      << grad_outputs.size();
  const size_t n = num_main();
  const size_t expected = first_slot(n - 1) + kRelu + 1;
  STRATA_CHECK_EQ(tape.saved.size(), expected)
      << "layer " << name() << " (resnet_block): backward needs the tape of its forward";
  const Tensor& x = tape.at(kInput);
  // d(main + shortcut): the gradient of the sum reaches both branches unchanged.
  const Tensor ds = ops::relu_backward(ctx, grad_outputs[0], tape.at(first_slot(n - 1) + kRelu));
  Tensor dx_shortcut = ds;
  if (projection_) {
    const Tensor dz = bn_backward(ctx, n, ds, tape);
    dx_shortcut = ops::conv2d_backward(ctx, dz, x, param(3 * n), units_[n].params, grad(3 * n),
                                       Tensor(), tape.needs_input_grad);
  }
  Tensor g = ds;
  for (size_t u = n; u-- > 0;) {
    if (u + 1 < n) g = ops::relu_backward(ctx, g, tape.at(first_slot(u) + kRelu));
    const Tensor dz = bn_backward(ctx, u, g, tape);
    const Tensor& input = u == 0 ? x : tape.at(first_slot(u - 1) + kRelu);
    const bool need_dx = u > 0 || tape.needs_input_grad;
    g = ops::conv2d_backward(ctx, dz, input, param(3 * u), units_[u].params, grad(3 * u), Tensor(),
                             need_dx);
  }
  if (!tape.needs_input_grad) return {Tensor()};
  return {ops::add(ctx, g, dx_shortcut)};
}

}  // namespace

std::unique_ptr<Layer> make_resnet_block(const std::string& name, const Shape& input_shape,
                                         const proto::ResNetBlockSpec& spec) {
  return std::make_unique<ResNetBlockLayer>(name, input_shape, spec);
}

}  // namespace strata::graph
