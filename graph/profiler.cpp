#include "graph/profiler.h"

#include <algorithm>
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

void LayerProfiler::record_forward(size_t layer, const TensorList& inputs,
                                   const TensorList& outputs, const LayerTape& tape,
                                   const ForwardSample& sample) {
  STRATA_CHECK_LT(layer, layers_.size()) << "LayerProfiler";
  LayerProfile& p = layers_[layer];
  ++p.forward_calls;
  p.forward_seconds += sample.seconds;
  p.samples += sample.batch;
  p.last_batch = sample.batch;
  p.output_bytes = sample.output_bytes;
  p.input_bytes = 0;
  for (const Tensor& x : inputs) p.input_bytes += x.defined() ? x.nbytes() : 0;
  p.forward_peak_bytes = std::max(p.forward_peak_bytes, sample.peak_extra_bytes);
  // The tape's storages, each once; those the previous layer's tape also holds are shared.
  std::vector<std::weak_ptr<Storage>> saved;
  p.saved_bytes = p.shared_bytes = 0;
  for (const Tensor& t : tape.saved) {
    if (!t.defined()) continue;
    const std::shared_ptr<Storage>& storage = t.storage();
    bool seen = false;
    for (const auto& w : saved) seen = seen || w.lock() == storage;
    if (seen) continue;
    saved.push_back(storage);
    p.saved_bytes += storage->nbytes();
    if (layer == last_layer_ + 1) {
      for (const auto& w : last_saved_) {
        if (w.lock() == storage) p.shared_bytes += storage->nbytes();
      }
    }
  }
  last_layer_ = layer;
  last_saved_ = std::move(saved);
}

void LayerProfiler::record_backward(size_t layer, double seconds, size_t peak_extra_bytes) {
  STRATA_CHECK_LT(layer, layers_.size()) << "LayerProfiler";
  LayerProfile& p = layers_[layer];
  ++p.backward_calls;
  p.backward_seconds += seconds;
  p.backward_peak_bytes = std::max(p.backward_peak_bytes, peak_extra_bytes);
}

void LayerProfiler::reset() {
  for (LayerProfile& p : layers_) {
    p.forward_calls = p.backward_calls = p.samples = p.last_batch = 0;
    p.forward_seconds = p.backward_seconds = 0.0;
    p.output_bytes = p.saved_bytes = p.shared_bytes = p.input_bytes = 0;
    p.forward_peak_bytes = p.backward_peak_bytes = 0;
  }
  last_layer_ = static_cast<size_t>(-1);
  last_saved_.clear();
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
    auto per_sample = [&p](size_t bytes) {
      return p.last_batch > 0 ? static_cast<double>(bytes) / p.last_batch : 0.0;
    };
    layers.push_back({{"index", i},
                      {"name", p.name},
                      {"type", p.type},
                      {"forward_ms_per_sample", p.forward_ms_per_sample()},
                      {"backward_ms_per_sample", p.backward_ms_per_sample()},
                      {"output_bytes_per_sample",
                       p.last_batch > 0 ? static_cast<double>(p.output_bytes) / p.last_batch : 0.0},
                      {"activation_bytes_per_sample", p.activation_bytes_per_sample()},
                      {"saved_bytes_per_sample", per_sample(p.saved_bytes)},
                      {"shared_bytes_per_sample", per_sample(p.shared_bytes)},
                      {"input_bytes_per_sample", per_sample(p.input_bytes)},
                      {"forward_peak_bytes_per_sample", per_sample(p.forward_peak_bytes)},
                      {"backward_peak_bytes_per_sample", per_sample(p.backward_peak_bytes)},
                      {"param_bytes", p.param_bytes},
                      {"forward_calls", p.forward_calls},
                      {"backward_calls", p.backward_calls}});
  }
  return nlohmann::json{{"layers", layers}}.dump(2);
}

}  // namespace strata::graph
