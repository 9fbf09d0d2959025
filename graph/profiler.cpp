#include "graph/profiler.h"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/check.h"
#include "graph/model.h"

namespace strata::graph {

double LayerProfile::forward_ms_per_sample() const {
  return samples > 0 ? 1e3 * forward_seconds / static_cast<double>(samples) : 0.0;
}

double LayerProfile::backward_ms_per_sample() const {
  // Backward runs once per forward that kept a tape; samples of backward calls follow forward's.
  if (forward_calls == 0 || backward_calls == 0) return 0.0;
  const double samples_per_call = static_cast<double>(samples) / forward_calls;
  return 1e3 * backward_seconds / (samples_per_call * backward_calls);
}

double LayerProfile::activation_bytes_per_sample() const {
  return last_batch > 0 ? static_cast<double>(output_bytes + saved_bytes) / last_batch : 0.0;
}

LayerProfiler::LayerProfiler(const Model& model) {
  for (size_t i = 0; i < model.size(); ++i) {
    LayerProfile p;
    p.name = model.layer(i).name();
    p.type = model.layer(i).type();
    for (const ParamSpec& s : model.layer(i).param_specs()) {
      p.param_bytes += static_cast<size_t>(shape_numel(s.shape)) * sizeof(float);
    }
    layers_.push_back(std::move(p));
  }
}

void LayerProfiler::record_forward(size_t layer, double seconds, int64_t batch, size_t output_bytes,
                                   size_t saved_bytes) {
  STRATA_CHECK_LT(layer, layers_.size()) << "LayerProfiler";
  LayerProfile& p = layers_[layer];
  ++p.forward_calls;
  p.forward_seconds += seconds;
  p.samples += batch;
  p.last_batch = batch;
  p.output_bytes = output_bytes;
  p.saved_bytes = saved_bytes;
}

void LayerProfiler::record_backward(size_t layer, double seconds) {
  STRATA_CHECK_LT(layer, layers_.size()) << "LayerProfiler";
  ++layers_[layer].backward_calls;
  layers_[layer].backward_seconds += seconds;
}

void LayerProfiler::reset() {
  for (LayerProfile& p : layers_) {
    p.forward_calls = p.backward_calls = p.samples = p.last_batch = 0;
    p.forward_seconds = p.backward_seconds = 0.0;
    p.output_bytes = p.saved_bytes = 0;
  }
}

std::string LayerProfiler::table() const {
  std::ostringstream s;
  char line[256];
  std::snprintf(line, sizeof(line), "%-4s %-20s %-20s %12s %12s %14s %12s\n", "#", "layer", "type",
                "fwd ms/smp", "bwd ms/smp", "act KiB/smp", "param KiB");
  s << line;
  double fwd = 0, bwd = 0, act = 0, par = 0;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const LayerProfile& p = layers_[i];
    std::snprintf(line, sizeof(line), "%-4zu %-20s %-20s %12.4f %12.4f %14.2f %12.1f\n", i,
                  p.name.c_str(), p.type.c_str(), p.forward_ms_per_sample(),
                  p.backward_ms_per_sample(), p.activation_bytes_per_sample() / 1024.0,
                  p.param_bytes / 1024.0);
    s << line;
    fwd += p.forward_ms_per_sample();
    bwd += p.backward_ms_per_sample();
    act += p.activation_bytes_per_sample();
    par += p.param_bytes;
  }
  std::snprintf(line, sizeof(line), "%-4s %-20s %-20s %12.4f %12.4f %14.2f %12.1f\n", "", "total",
                "", fwd, bwd, act / 1024.0, par / 1024.0);
  s << line;
  return s.str();
}

std::string LayerProfiler::to_json() const {
  nlohmann::json layers = nlohmann::json::array();
  for (size_t i = 0; i < layers_.size(); ++i) {
    const LayerProfile& p = layers_[i];
    layers.push_back({{"index", i},
                      {"name", p.name},
                      {"type", p.type},
                      {"forward_ms_per_sample", p.forward_ms_per_sample()},
                      {"backward_ms_per_sample", p.backward_ms_per_sample()},
                      {"output_bytes_per_sample",
                       p.last_batch > 0 ? static_cast<double>(p.output_bytes) / p.last_batch : 0.0},
                      {"activation_bytes_per_sample", p.activation_bytes_per_sample()},
                      {"param_bytes", p.param_bytes},
                      {"forward_calls", p.forward_calls},
                      {"backward_calls", p.backward_calls}});
  }
  return nlohmann::json{{"layers", layers}}.dump(2);
}

}  // namespace strata::graph
