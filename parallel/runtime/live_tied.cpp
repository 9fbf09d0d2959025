// Tied parameters in a live migration (see the header).
#include "parallel/runtime/live_tied.h"

#include <string>
#include <vector>

#include "engine/check.h"

namespace strata::parallel {
namespace {

int stage_of(const Partition& p, size_t layer) {
  for (size_t s = 0; s < p.size(); ++s) {
    if (layer >= p[s].begin && layer < p[s].end) return static_cast<int>(s);
  }
  return -1;
}

}  // namespace

void check_live_tied(const graph::Model& model, const LiveMigrationConfig& config) {
  const std::vector<Partition> parts = LiveStage::partitions(config);
  std::vector<std::string> names{config.what};
  for (const LiveMigrationStep& m : config.then) names.push_back(m.what);
  for (size_t l = 0; l < model.size(); ++l) {
    for (const graph::ParamSpec& spec : model.layer(l).param_specs()) {
      if (spec.tied_to.empty()) continue;
      const auto owner = model.find_param_layer(spec.tied_to);
      STRATA_CHECK(owner.has_value()) << "parameter " << model.layer(l).name() << "." << spec.name
                                      << " is tied to unknown " << spec.tied_to;
      const std::string tied =
          model.layer(l).name() + "." + spec.name + " (tied to " + spec.tied_to + ")";
      for (const size_t layer : {*owner, l}) {
        for (size_t i = 0; i + 1 < parts.size(); ++i) {
          const int from = stage_of(parts[i], layer), to = stage_of(parts[i + 1], layer);
          STRATA_CHECK(from == to)
              << names[i] << ": --migration live would move layer " << model.layer(layer).name()
              << " from stage " << from << " to stage " << to << ", and it "
              << (layer == l ? "uses" : "owns") << " the tied parameter " << tied
              << "; a live move keeps the layers of a tied parameter on their stages (move "
              << "other layers, or use --migration restart)";
        }
      }
    }
  }
}

}  // namespace strata::parallel
