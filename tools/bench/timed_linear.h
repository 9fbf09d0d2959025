// A linear layer of a fixed duration for benchmarks whose compute should not depend on the
// machine's cores: the forward lasts `forward` (plus `per_row` for each row of its input, a
// device's cost model: a fixed launch cost and a cost per sample) and the backward twice that,
// the layer sleeping for what its matrix product left. While it sleeps the CPU is free, as it would
// be with the compute on an accelerator, so what the benchmark measures is the schedule and the
// communication around it.
#pragma once

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "graph/layers.h"
#include "ops/matmul.h"

namespace strata::bench {

class TimedLinear final : public graph::Layer {
 public:
  TimedLinear(std::string name, int64_t in, int64_t out, std::chrono::microseconds forward,
              std::chrono::microseconds per_row = std::chrono::microseconds(0))
      : Layer(name), linear_(name, in, out, true), forward_(forward), per_row_(per_row) {}
  const char* type() const override { return "timed_linear"; }
  std::vector<graph::ParamSpec> param_specs() const override { return linear_.param_specs(); }
  Shape output_shape(const Shape& in) const override { return linear_.output_shape(in); }
  TensorList forward(ExecContext& ctx, const TensorList& in, LayerTape& tape) override {
    const auto start = std::chrono::steady_clock::now();
    tape.save(in[0]);
    TensorList out{ops::linear_forward(ctx, in[0], param(0), param(1))};
    std::this_thread::sleep_until(start + duration(in[0]));
    return out;
  }
  TensorList backward(ExecContext& ctx, const TensorList& g, LayerTape& tape) override {
    const auto start = std::chrono::steady_clock::now();
    TensorList out{ops::linear_backward(ctx, g[0], tape.at(0), param(0), grad(0), grad(1),
                                        tape.needs_input_grad)};
    std::this_thread::sleep_until(start + 2 * duration(tape.at(0)));
    return out;
  }

 private:
  std::chrono::microseconds duration(const Tensor& x) const {
    return forward_ + per_row_ * (x.dim() > 0 ? x.size(0) : 1);
  }

  graph::LinearLayer linear_;
  std::chrono::microseconds forward_;
  std::chrono::microseconds per_row_;
};

}  // namespace strata::bench
