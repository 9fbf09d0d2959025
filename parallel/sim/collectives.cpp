// Closed forms of ring and tree all-reduce (see collectives.h). The bottleneck of a set of ranks
// depends only on which node each rank sits on, so it is found from the node of every rank, not
// from the n^2 pairs: one node -> the intra-node link; several -> the inter-node link (a ring
// over ranks of several nodes crosses nodes at least twice; a tree joins its nodes' subtrees over
// it).
#include "parallel/sim/collectives.h"

#include <algorithm>
#include <cmath>

#include "engine/check.h"

namespace strata::parallel::sim {

AllReduceAlgorithm parse_all_reduce(const std::string& name) {
  if (name == "ring") return AllReduceAlgorithm::kRing;
  if (name == "tree") return AllReduceAlgorithm::kTree;
  STRATA_THROW() << "unknown all-reduce algorithm '" << name << "' (valid: ring, tree)";
}

const char* all_reduce_name(AllReduceAlgorithm algorithm) {
  return algorithm == AllReduceAlgorithm::kRing ? "ring" : "tree";
}

Bottleneck bottleneck(AllReduceAlgorithm algorithm, const Cluster& cluster,
                      const std::vector<int>& ranks) {
  Bottleneck b;
  if (ranks.size() < 2) return b;
  auto take = [&b](const LinkSpec& l) {
    if (b.bandwidth == 0.0 || l.bandwidth < b.bandwidth) b.bandwidth = l.bandwidth;
    b.latency_s = std::max(b.latency_s, l.latency_s);
  };
  if (algorithm == AllReduceAlgorithm::kRing) {
    for (size_t i = 0; i < ranks.size(); ++i) {
      take(cluster.link(ranks[i], ranks[(i + 1) % ranks.size()]));
    }
    return b;
  }
  const int node = cluster.node_of(ranks.front());
  bool several_nodes = false;
  bool shared_gpu = false;
  for (size_t i = 1; i < ranks.size(); ++i) {
    several_nodes = several_nodes || cluster.node_of(ranks[i]) != node;
    shared_gpu = shared_gpu || ranks[i] == ranks[i - 1];
  }
  take(cluster.intra);
  if (several_nodes) take(cluster.inter);
  if (shared_gpu) take(cluster.local);
  return b;
}

double ring_all_reduce_seconds(int n, double bytes, const Bottleneck& link) {
  STRATA_CHECK_GE(n, 1) << "ring all-reduce over no ranks";
  if (n == 1) return 0.0;
  const double steps = 2.0 * (n - 1);
  return steps / n * bytes / link.bandwidth + steps * link.latency_s;
}

double tree_all_reduce_seconds(int n, double bytes, const Bottleneck& link) {
  STRATA_CHECK_GE(n, 1) << "tree all-reduce over no ranks";
  if (n == 1) return 0.0;
  const double levels = std::ceil(std::log2(static_cast<double>(n)));
  return 2.0 * bytes / link.bandwidth + 2.0 * levels * link.latency_s;
}

double all_reduce_seconds(AllReduceAlgorithm algorithm, const Cluster& cluster,
                          const std::vector<int>& ranks, double bytes) {
  const int n = static_cast<int>(ranks.size());
  if (n < 2) return 0.0;
  const Bottleneck b = bottleneck(algorithm, cluster, ranks);
  return algorithm == AllReduceAlgorithm::kRing ? ring_all_reduce_seconds(n, bytes, b)
                                                : tree_all_reduce_seconds(n, bytes, b);
}

}  // namespace strata::parallel::sim
