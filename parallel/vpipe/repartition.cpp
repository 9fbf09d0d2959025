#include "parallel/vpipe/repartition.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>
#include <sstream>

#include "engine/check.h"
#include "parallel/vpipe/kl_partitioner.h"

namespace strata::parallel {
namespace {

std::vector<size_t> cuts(const Partition& p) {
  std::vector<size_t> out;
  for (const LayerRange& r : p) out.push_back(r.end);
  return out;
}

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
    if (in.memory) return propose_with_memory(in, std::move(d));
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
  struct Scored {
    Partition partition;
    PartitionMemory memory;
    double cost = 0.0;
  };

  // Algorithm 1's alternation (see the header).
  RepartitionDecision propose_with_memory(const RepartitionInput& in, RepartitionDecision d) {
    const size_t L = in.layer_seconds.size();
    const int S = static_cast<int>(in.partition.size());
    Scored best{in.partition, in.memory(in.partition), 0.0};
    std::vector<double> base(L);
    for (size_t l = 0; l < L; ++l) {
      const double o = l < best.memory.layer_overhead.size() ? best.memory.layer_overhead[l] : 0;
      base[l] = in.layer_seconds[l] / (1.0 + o);
    }
    best.cost = slowest_stage_with_overhead(in.partition, base, best.memory.layer_overhead);
    d.current_cost = best.cost;
    d.predicted_cost = best.cost;
    std::set<std::vector<size_t>> seen{cuts(in.partition)};
    int rounds = 0;
    for (; rounds < 10; ++rounds) {
      // B: the partition, each layer's policy held.
      std::vector<double> time(L);
      for (size_t l = 0; l < L; ++l) {
        const double o = l < best.memory.layer_overhead.size() ? best.memory.layer_overhead[l] : 0;
        time[l] = base[l] * (1.0 + o);
      }
      const KlPartition kl =
          kl_partition(OpGraph::chain(time, std::vector<double>(L - 1, 0.0)), S, 1.0, true);
      // A: each candidate's own plan; the best fitting one.
      bool improved = false;
      for (const Partition& candidate : partitions_between(best.partition, kl.partition)) {
        if (!seen.insert(cuts(candidate)).second) continue;
        PartitionMemory memory = in.memory(candidate);
        if (!memory.feasible) {
          d.infeasible.push_back({candidate, memory.refusal, ""});
          continue;
        }
        const double cost = slowest_stage_with_overhead(candidate, base, memory.layer_overhead);
        if (cost < best.cost) {
          best = Scored{candidate, std::move(memory), cost};
          improved = true;
        }
      }
      if (!improved) break;
    }
    std::ostringstream why;
    const double gain = d.current_cost > 0 ? 1.0 - best.cost / d.current_cost : 0.0;
    if (best.partition == in.partition) {
      why << "Algorithm 1 (Algorithm 3 alternating with the memory planner) keeps the partition";
    } else if (best.cost < d.current_cost * (1.0 - threshold_)) {
      d.apply = true;
      why << "predicted slowest stage with its memory plan " << 1000 * d.current_cost << " -> "
          << 1000 * best.cost << " ms/step (gain " << 100 * gain << "% > threshold "
          << 100 * threshold_ << "%)";
    } else {
      why << "predicted gain with its memory plan " << 100 * gain << "% is not above the threshold "
          << 100 * threshold_ << "%";
    }
    d.partition = best.partition;
    d.predicted_cost = best.cost;
    why << "; " << rounds + (rounds < 10 ? 1 : 0) << " round(s)";
    if (!d.infeasible.empty()) {
      why << ", " << d.infeasible.size() << " candidate(s) dropped: no plan fits --mem-limit";
    }
    d.reason = why.str();
    return d;
  }

  double threshold_;
};

}  // namespace

std::vector<Partition> partitions_between(const Partition& from, const Partition& to) {
  STRATA_CHECK(from.size() == to.size() && !from.empty() && from.back().end == to.back().end)
      << "partitions_between: partitions of different shapes";
  const size_t S = from.size();
  int64_t steps = 0;
  for (size_t s = 1; s < S; ++s) {
    steps = std::max<int64_t>(
        steps, std::llabs(static_cast<int64_t>(to[s].begin) - static_cast<int64_t>(from[s].begin)));
  }
  std::vector<Partition> out;
  for (int64_t k = steps; k >= 1; --k) {
    Partition p;
    size_t begin = 0;
    bool valid = true;
    for (size_t s = 1; s <= S && valid; ++s) {
      size_t end = from.back().end;
      if (s < S) {
        const double a = static_cast<double>(from[s].begin), b = static_cast<double>(to[s].begin);
        end = static_cast<size_t>(
            std::llround(a + (b - a) * static_cast<double>(k) / static_cast<double>(steps)));
      }
      valid = end > begin;
      p.push_back({begin, end});
      begin = end;
    }
    if (valid && (out.empty() || out.back() != p)) out.push_back(std::move(p));
  }
  return out;
}

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
