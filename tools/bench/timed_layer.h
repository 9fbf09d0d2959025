// Any layer of a model, lasting what a device's cost model says it would: for benchmarks whose
// compute should not depend on this machine's cores (the generalization of timed_linear.h to
// every layer type: convolutions, ResNet blocks, batch norm with its running statistics).
//
// The wrapper's forward lasts forward_s.at(rows) seconds and its backward backward_s.at(rows)
// (parallel/sim/cost_model.h: a fixed cost per call and a cost per sample), times `scale`. With
// `compute` on, the wrapped layer runs for real (outputs, gradients and running statistics are the
// layer's own) and the wrapper sleeps for what it left; with `compute` off it does not run at all:
// the forward returns zeros of the output's shape and the backward zeros of the input's, so the
// gradient buffers stay as they are and the running statistics too, but they are the real buffers
// of the real sizes, which the gradient all-reduce moves. While it sleeps the CPU is free, as it
// would be with the compute on an accelerator.
#pragma once

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "graph/layer.h"
#include "graph/model.h"
#include "parallel/sim/cost_model.h"

namespace strata::bench {

class TimedLayer final : public graph::Layer {
 public:
  // Wraps layer `layer` of `owner` (a model of that one layer: the wrapped layer lives in it).
  TimedLayer(std::unique_ptr<graph::Model> owner, size_t layer, parallel::sim::Linear forward_s,
             parallel::sim::Linear backward_s, double scale, bool compute)
      : Layer(owner->layer(layer).name()),
        owner_(std::move(owner)),
        inner_(&owner_->layer(layer)),
        forward_s_(forward_s),
        backward_s_(backward_s),
        scale_(scale),
        compute_(compute) {}
  const char* type() const override { return inner_->type(); }
  std::vector<graph::ParamSpec> param_specs() const override { return inner_->param_specs(); }
  std::vector<graph::ParamSpec> buffer_specs() const override { return inner_->buffer_specs(); }
  graph::TensorSpecs output_specs(const graph::TensorSpecs& inputs) const override {
    return inner_->output_specs(inputs);
  }
  Shape output_shape(const Shape& in) const override { return inner_->output_shape(in); }
  double forward_flops(const graph::TensorSpecs& inputs) const override {
    return inner_->forward_flops(inputs);
  }

  TensorList forward(ExecContext& ctx, const TensorList& in, LayerTape& tape) override {
    const auto start = std::chrono::steady_clock::now();
    const double rows = in.empty() || in[0].dim() == 0 ? 1.0 : static_cast<double>(in[0].size(0));
    TensorList out;
    if (compute_) {
      bind_inner();
      out = inner_->forward(ctx, in, tape);
    } else {
      graph::TensorSpecs specs;
      for (const Tensor& t : in)
        specs.push_back({Shape(t.shape().begin() + 1, t.shape().end()), t.dtype()});
      for (const graph::TensorSpec& spec : inner_->output_specs(specs)) {
        Shape shape{static_cast<int64_t>(rows)};
        shape.insert(shape.end(), spec.shape.begin(), spec.shape.end());
        out.push_back(Tensor::zeros(shape, spec.dtype, &ctx.allocator()));
      }
      tape.save(in.empty() ? Tensor() : in[0]);  // its shape and dtype, for the backward
    }
    sleep_until(start, forward_s_, rows);
    return out;
  }

  TensorList backward(ExecContext& ctx, const TensorList& g, LayerTape& tape) override {
    const auto start = std::chrono::steady_clock::now();
    const double rows = g.empty() || g[0].dim() == 0 ? 1.0 : static_cast<double>(g[0].size(0));
    TensorList out;
    if (compute_) {
      bind_inner();
      out = inner_->backward(ctx, g, tape);
    } else {
      const Tensor& x = tape.at(0);
      out.push_back(tape.needs_input_grad && x.defined() && is_floating(x.dtype())
                        ? Tensor::zeros(x.shape(), x.dtype(), &ctx.allocator())
                        : Tensor());
    }
    sleep_until(start, backward_s_, rows);
    return out;
  }

 private:
  // The wrapped layer sees the views the store bound to the wrapper (the latest binding).
  void bind_inner() {
    graph::LayerParams p;
    for (size_t i = 0; i < param_specs().size(); ++i) {
      p.params.push_back(param(i));
      p.grads.push_back(grad(i));
    }
    for (size_t i = 0; i < buffer_specs().size(); ++i) p.buffers.push_back(buffer(i));
    inner_->bind(p, this);
  }
  void sleep_until(std::chrono::steady_clock::time_point start, const parallel::sim::Linear& t,
                   double rows) const {
    std::this_thread::sleep_until(start + std::chrono::duration_cast<std::chrono::nanoseconds>(
                                              std::chrono::duration<double>(scale_ * t.at(rows))));
  }

  std::unique_ptr<graph::Model> owner_;
  graph::Layer* inner_;
  parallel::sim::Linear forward_s_, backward_s_;
  double scale_;
  bool compute_;
};

}  // namespace strata::bench
