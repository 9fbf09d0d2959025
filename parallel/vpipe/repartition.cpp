#include "parallel/vpipe/repartition.h"

#include <algorithm>
#include <sstream>

#include "engine/check.h"
#include "parallel/vpipe/kl_partitioner.h"

namespace strata::parallel {
namespace {

class VpipePolicy : public RepartitionPolicy {
 public:
  explicit VpipePolicy(double threshold) : threshold_(threshold) {}
  const char* name() const override { return "vpipe"; }

  RepartitionDecision propose(const RepartitionInput& in) override {
    RepartitionDecision d;
    d.partition = in.partition;
    const size_t L = in.layer_seconds.size();
    const int S = static_cast<int>(in.partition.size());
    STRATA_CHECK(S >= 1 && !in.partition.empty() && in.partition.back().end == L)
        << "repartition: a partition of " << (in.partition.empty() ? 0 : in.partition.back().end)
        << " layers for " << L << " measured layers";
    for (double b : in.stage_busy_seconds) d.measured_slowest = std::max(d.measured_slowest, b);
    d.current_cost = slowest_stage_seconds(in.partition, in.layer_seconds);
    d.predicted_cost = d.current_cost;
    if (S == 1) {
      d.reason = "one stage";
      return d;
    }
    if (!(d.current_cost > 0)) {
      d.reason = "no layer time measured";
      return d;
    }
    // Algorithm 3 over the chain of layers; the activations' bytes are not measured here, so the
    // cut is free (bandwidth 1, no bytes) and the objective is the slowest stage's compute.
    const OpGraph graph = OpGraph::chain(in.layer_seconds, std::vector<double>(L - 1, 0.0));
    const KlPartition kl = kl_partition(graph, S, 1.0, true);
    const double predicted = slowest_stage_seconds(kl.partition, in.layer_seconds);
    std::ostringstream why;
    if (kl.partition == in.partition) {
      why << "Algorithm 3 keeps the partition";
    } else if (predicted < d.current_cost * (1.0 - threshold_)) {
      d.apply = true;
      d.partition = kl.partition;
      d.predicted_cost = predicted;
      why << "predicted slowest stage " << 1000 * d.current_cost << " -> " << 1000 * predicted
          << " ms/step (gain " << 100 * d.gain() << "% > threshold " << 100 * threshold_ << "%)";
    } else {
      d.partition = kl.partition;
      d.predicted_cost = predicted;
      why << "predicted gain " << 100 * d.gain() << "% is not above the threshold "
          << 100 * threshold_ << "%";
    }
    d.reason = why.str();
    return d;
  }

 private:
  double threshold_;
};

}  // namespace

double slowest_stage_seconds(const Partition& partition, const std::vector<double>& layer_seconds) {
  double slowest = 0.0;
  for (const LayerRange& r : partition) {
    double t = 0.0;
    for (size_t l = r.begin; l < r.end; ++l) t += layer_seconds.at(l);
    slowest = std::max(slowest, t);
  }
  return slowest;
}

std::unique_ptr<RepartitionPolicy> make_vpipe_policy(double threshold) {
  STRATA_CHECK(threshold >= 0.0 && threshold < 1.0)
      << "--repartition-threshold " << threshold << " must be in [0, 1) (a relative gain)";
  return std::make_unique<VpipePolicy>(threshold);
}

}  // namespace strata::parallel
