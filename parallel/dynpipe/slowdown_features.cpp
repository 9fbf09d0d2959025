#include "parallel/dynpipe/slowdown_features.h"

#include <algorithm>

#include "engine/check.h"

namespace strata::parallel::dynpipe {

std::vector<std::string> feature_counter_names() { return {"colocated_threads"}; }

std::vector<std::string> slowdown_features() {
  std::vector<std::string> f = {"layer_solo_ms", "layer_param_bytes", "layer_output_bytes",
                                "layer_activation_bytes"};
  for (const std::string& c : feature_counter_names()) f.push_back(c);
  return f;
}

std::vector<double> slowdown_feature_row(const LayerFeatures& layer, const CpuCounters& counters) {
  std::vector<double> row = {layer.solo_ms, layer.param_bytes, layer.output_bytes,
                             layer.activation_bytes};
  const std::vector<std::string> names = counter_names();
  const std::vector<double> values = counter_values(counters);
  for (const std::string& c : feature_counter_names()) {
    const auto it = std::find(names.begin(), names.end(), c);
    STRATA_CHECK(it != names.end()) << "feature counter '" << c << "' is not a monitor counter";
    row.push_back(values[static_cast<size_t>(it - names.begin())]);
  }
  return row;
}

CpuCounters counters_from_map(const std::map<std::string, double>& counters,
                              const std::string& whose) {
  std::vector<double> values;
  const std::vector<std::string> features = feature_counter_names();
  for (const std::string& name : counter_names()) {
    const auto it = counters.find(name);
    const bool needed = std::find(features.begin(), features.end(), name) != features.end();
    STRATA_CHECK(it != counters.end() || !needed)
        << "the counter '" << name << "' of feature set " << kFeatureSet << " is not among "
        << whose << "'s counters";
    values.push_back(it != counters.end() ? it->second : 0.0);
  }
  return counters_from_values(values);
}

}  // namespace strata::parallel::dynpipe
