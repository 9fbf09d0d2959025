// Model bookkeeping and the forward/backward walk over a range of layers.
#include "graph/model.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>

#include "engine/allocator.h"
#include "engine/check.h"
#include "graph/profiler.h"

namespace strata::graph {

Model::Model(std::string name, TensorSpecs inputs)
    : name_(std::move(name)), specs_{std::move(inputs)} {
  STRATA_CHECK(!specs_.front().empty()) << "model " << name_ << " needs at least one input";
}

Model::Model(std::string name, Shape input_shape, DType input_dtype)
    : Model(std::move(name), TensorSpecs{TensorSpec{std::move(input_shape), input_dtype}}) {}

Layer& Model::add(std::unique_ptr<Layer> layer) {
  STRATA_CHECK(layer != nullptr) << "model " << name_ << ": null layer";
  STRATA_CHECK(!layer->name().empty()) << "model " << name_ << ": layer " << layers_.size() << " ("
                                       << layer->type() << ") has no name";
  STRATA_CHECK(!find(layer->name()).has_value())
      << "model " << name_ << ": layer name '" << layer->name() << "' is used twice";
  // A tied parameter must name a parameter of an earlier layer, of the same shape.
  for (const ParamSpec& p : layer->param_specs()) {
    if (p.tied_to.empty()) continue;
    bool found = false;
    for (const auto& earlier : layers_) {
      for (const ParamSpec& q : earlier->param_specs()) {
        if (earlier->name() + "." + q.name != p.tied_to) continue;
        STRATA_CHECK(q.shape == p.shape && q.tied_to.empty())
            << "model " << name_ << ": " << layer->name() << "." << p.name << " "
            << shape_str(p.shape) << " is tied to " << p.tied_to << " " << shape_str(q.shape)
            << (q.tied_to.empty() ? "" : ", itself tied");
        found = true;
      }
    }
    STRATA_CHECK(found) << "model " << name_ << ": " << layer->name() << "." << p.name
                        << " is tied to '" << p.tied_to
                        << "', which is no parameter of an earlier layer";
  }
  specs_.push_back(layer->output_specs(specs_.back()));
  layers_.push_back(std::move(layer));
  return *layers_.back();
}

Layer& Model::layer(size_t i) {
  STRATA_CHECK_LT(i, layers_.size()) << "model " << name_;
  return *layers_[i];
}

const Layer& Model::layer(size_t i) const {
  STRATA_CHECK_LT(i, layers_.size()) << "model " << name_;
  return *layers_[i];
}

std::optional<size_t> Model::find(const std::string& layer_name) const {
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (layers_[i]->name() == layer_name) return i;
  }
  return std::nullopt;
}

std::optional<size_t> Model::find_param_layer(const std::string& full_name) const {
  for (size_t i = 0; i < layers_.size(); ++i) {
    for (const ParamSpec& p : layers_[i]->param_specs()) {
      if (layers_[i]->name() + "." + p.name == full_name) return i;
    }
  }
  return std::nullopt;
}

const TensorSpecs& Model::specs_before(size_t i) const {
  STRATA_CHECK_LE(i, layers_.size()) << "model " << name_;
  return specs_[i];
}

double Model::forward_flops(size_t begin, size_t end) const {
  check_range(begin, end);
  double flops = 0;
  for (size_t i = begin; i < end; ++i) flops += layers_[i]->forward_flops(specs_[i]);
  return flops;
}

void Model::check_range(size_t begin, size_t end) const {
  STRATA_CHECK(begin <= end && end <= layers_.size())
      << "model " << name_ << ": layer range [" << begin << ", " << end << ") outside its "
      << layers_.size() << " layers";
}

TensorList Model::forward(ExecContext& ctx, size_t begin, size_t end, const TensorList& inputs,
                          Tape& tape, const ForwardOptions& options, LayerProfiler* profiler) {
  check_range(begin, end);
  tape.layers.assign(end - begin, LayerTape{});
  TensorList x = inputs;
  for (size_t i = begin; i < end; ++i) {
    LayerTape& t = tape.layers[i - begin];
    x = forward_layer(ctx, i, x, t, options, profiler);
    if (!options.keep_tape) t.clear();
  }
  return x;
}

TensorList Model::forward_layer(ExecContext& ctx, size_t i, const TensorList& inputs, LayerTape& t,
                                const ForwardOptions& options, LayerProfiler* profiler) {
  using Clock = std::chrono::steady_clock;
  check_range(i, i + 1);
  t = LayerTape{};
  t.rng = RngOffsets{options.seed, static_cast<uint64_t>(i), options.step, options.sample_offset};
  t.training = options.training;
  t.weight_version = options.weight_version;
  t.needs_input_grad = i > 0;
  t.input_shape = inputs.empty() ? Shape{} : inputs[0].shape();
  Allocator& allocator = ctx.allocator();
  const size_t before = allocator.stats().current;
  if (profiler != nullptr) allocator.reset_window_peak();
  const auto start = Clock::now();
  TensorList y;
  try {
    y = layers_[i]->forward(ctx, inputs, t);
  } catch (const OutOfMemoryError& e) {
    throw OutOfMemoryError("forward of layer " + layers_[i]->name() + " (" + layers_[i]->type() +
                               ", input " + shape_str(t.input_shape) + "): " + e.message(),
                           e.where());
  }
  if (profiler != nullptr) {
    LayerProfiler::ForwardSample sample;
    sample.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    sample.batch = t.input_shape.empty() ? 1 : t.input_shape[0];
    for (const Tensor& out : y) sample.output_bytes += out.defined() ? out.nbytes() : 0;
    sample.peak_extra_bytes = allocator.window_peak() - std::min(before, allocator.window_peak());
    profiler->record_forward(i, inputs, y, t, sample);
  }
  return y;
}

TensorList Model::backward(ExecContext& ctx, size_t begin, size_t end,
                           const TensorList& grad_outputs, Tape& tape, LayerProfiler* profiler,
                           const std::function<void(size_t)>& after_layer) {
  check_range(begin, end);
  STRATA_CHECK_EQ(tape.layers.size(), end - begin)
      << "model " << name_ << ": backward over layers [" << begin << ", " << end
      << ") with a tape of " << tape.layers.size() << " layers (was forward run with keep_tape?)";
  TensorList grads = grad_outputs;
  for (size_t i = end; i-- > begin;) {
    grads = backward_layer(ctx, i, grads, tape.layers[i - begin], profiler);
    if (after_layer) after_layer(i);
  }
  return grads;
}

TensorList Model::backward_layer(ExecContext& ctx, size_t i, const TensorList& grad_outputs,
                                 LayerTape& t, LayerProfiler* profiler) {
  using Clock = std::chrono::steady_clock;
  check_range(i, i + 1);
  Allocator& allocator = ctx.allocator();
  const size_t before = allocator.stats().current;
  if (profiler != nullptr) allocator.reset_window_peak();
  const auto start = Clock::now();
  TensorList grads;
  try {
    grads = layers_[i]->backward(ctx, grad_outputs, t);
  } catch (const OutOfMemoryError& e) {
    throw OutOfMemoryError("backward of layer " + layers_[i]->name() + " (" + layers_[i]->type() +
                               ", input " + shape_str(t.input_shape) + "): " + e.message(),
                           e.where());
  }
  t.clear();  // the saved tensors are no longer needed
  if (profiler != nullptr) {
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    profiler->record_backward(i, seconds,
                              allocator.window_peak() - std::min(before, allocator.window_peak()));
  }
  return grads;
}

std::vector<Model::TiedParam> Model::tied_params() const {
  std::vector<TiedParam> out;
  for (size_t l = 0; l < layers_.size(); ++l) {
    for (const ParamSpec& spec : layers_[l]->param_specs()) {
      if (spec.tied_to.empty()) continue;
      const std::optional<size_t> owner = find_param_layer(spec.tied_to);
      STRATA_CHECK(owner.has_value()) << "model " << name_ << ": " << layers_[l]->name() << "."
                                      << spec.name << " is tied to unknown " << spec.tied_to;
      out.push_back({l, *owner, layers_[l]->name() + "." + spec.name, spec.tied_to});
    }
  }
  return out;
}

std::string Model::summary() const {
  std::ostringstream s;
  char line[256];
  std::snprintf(line, sizeof(line), "%-4s %-20s %-20s %-18s %12s\n", "#", "layer", "type", "output",
                "parameters");
  s << line;
  int64_t total = 0;
  for (size_t i = 0; i < layers_.size(); ++i) {
    int64_t n = 0;
    for (const ParamSpec& p : layers_[i]->param_specs()) {
      if (p.tied_to.empty()) n += valid_numel(p);  // a tied parameter counts once
    }
    total += n;
    std::snprintf(line, sizeof(line), "%-4zu %-20s %-20s %-22s %12lld\n", i,
                  layers_[i]->name().c_str(), layers_[i]->type(), specs_str(specs_[i + 1]).c_str(),
                  static_cast<long long>(n));
    s << line;
  }
  std::snprintf(line, sizeof(line), "total parameters: %lld\n", static_cast<long long>(total));
  s << line;
  return s.str();
}

}  // namespace strata::graph
