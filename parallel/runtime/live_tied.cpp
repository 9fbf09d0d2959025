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
  for (const graph::Model::TiedParam& t : model.tied_params()) {
    const std::string tied = t.name + " (tied to " + t.tied_to + ")";
    for (const size_t layer : {t.owner, t.user}) {
      for (size_t i = 0; i + 1 < parts.size(); ++i) {
        const int from = stage_of(parts[i], layer), to = stage_of(parts[i + 1], layer);
        STRATA_CHECK(from == to)
            << names[i] << ": --migration live would move layer " << model.layer(layer).name()
            << " from stage " << from << " to stage " << to << ", and it "
            << (layer == t.user ? "uses" : "owns") << " the tied parameter " << tied
            << "; a live move keeps the layers of a tied parameter on their stages (move "
            << "other layers, or use --migration restart)";
      }
    }
  }
}

}  // namespace strata::parallel
