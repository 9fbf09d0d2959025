#include "parallel/dynpipe/slowdown_features.h"

#include "engine/check.h"

namespace strata::parallel::dynpipe {

std::vector<std::string> slowdown_features() {
  std::vector<std::string> f = {"layer_solo_ms", "layer_param_bytes", "layer_output_bytes",
                                "layer_activation_bytes"};
  for (const std::string& c : counter_names()) f.push_back(c);
  return f;
}

std::vector<double> slowdown_feature_row(const LayerFeatures& layer, const CpuCounters& counters) {
  std::vector<double> row = {layer.solo_ms, layer.param_bytes, layer.output_bytes,
                             layer.activation_bytes};
  for (double c : counter_values(counters)) row.push_back(c);
  return row;
}

CpuCounters counters_from_map(const std::map<std::string, double>& counters,
                              const std::string& whose) {
  std::vector<double> values;
  for (const std::string& name : counter_names()) {
    const auto it = counters.find(name);
    STRATA_CHECK(it != counters.end()) << "the counter '" << name << "' of feature set "
                                       << kFeatureSet << " is not among " << whose << "'s counters";
    values.push_back(it->second);
  }
  return counters_from_values(values);
}

}  // namespace strata::parallel::dynpipe
