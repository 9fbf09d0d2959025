// Time of the collectives a simulated run uses, over the links of a cluster (cluster.h).
//
//   ring  n ranks in the given order, each sending to the next: a reduce-scatter and an
//         all-gather of n - 1 steps each, every step moving bytes / n over every link at once:
//           T = 2 (n - 1) / n x bytes / B + 2 (n - 1) x L
//         with B the slowest and L the highest-latency link of the ring (the step waits for it).
//   tree  a pipelined binary tree (NCCL's double binary tree): the full buffer flows up once
//         (reduce) and down once (broadcast) over the bottleneck link, and each way passes
//         ceil(log2 n) levels:
//           T = 2 x bytes / B + 2 ceil(log2 n) x L
//         with B and L the slowest link and highest latency between any two of the ranks.
// Ring is bandwidth-optimal; tree wins where latency dominates (small buckets, many ranks).
// One rank: 0. Contention between collectives and point-to-point messages that share a link is
// not modelled: every collective has its links to itself.
#pragma once

#include <string>
#include <vector>

#include "parallel/sim/cluster.h"

namespace strata::parallel::sim {

enum class AllReduceAlgorithm { kRing, kTree };
AllReduceAlgorithm parse_all_reduce(const std::string& name);  // ring|tree; throws otherwise
const char* all_reduce_name(AllReduceAlgorithm algorithm);

// The slowest bandwidth and highest latency among the links the algorithm uses between `ranks`
// (ring: consecutive ranks, wrapping around; tree: any two).
struct Bottleneck {
  double bandwidth = 0.0;
  double latency_s = 0.0;
};
Bottleneck bottleneck(AllReduceAlgorithm algorithm, const Cluster& cluster,
                      const std::vector<int>& ranks);

// Seconds for an all-reduce of `bytes` among `ranks` (world ranks, placed as cluster.h says).
double all_reduce_seconds(AllReduceAlgorithm algorithm, const Cluster& cluster,
                          const std::vector<int>& ranks, double bytes);
// The closed forms themselves, for n ranks over a bottleneck.
double ring_all_reduce_seconds(int n, double bytes, const Bottleneck& link);
double tree_all_reduce_seconds(int n, double bytes, const Bottleneck& link);

}  // namespace strata::parallel::sim
